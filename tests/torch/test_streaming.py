"""The streaming packer in torch: ``DataLoader(packer, batch_size=None)`` and PackerDataset,
sharded over workers and ranks, and resumed through torchdata's StatefulDataLoader.

Every document has distinct token ids, so the segments of the emitted batches name the documents
they came from: the union over workers and ranks must be every document exactly once.
Run: ``pytest tests/torch/test_streaming.py``.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _packer import distinct_docs as _docs
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from mmpack import StreamingPacker, build
from mmpack._src.torch.streaming import torch_consumer
from mmpack.errors import StateMismatchError
from mmpack.torch import PackerDataset, collate, hf_inputs

SEQLEN, ROWS, EOT = 24, 3, 0


def _want(docs):
    return Counter(tuple(d.tolist()) for d in docs)


class Opaque:
    """An iterable with no len: only iteration (the packer cannot index it)."""

    def __init__(self, docs):
        self.docs = docs

    def __iter__(self):
        return iter(list(self.docs))


class SplitsItself(IterableDataset):
    """An IterableDataset that deals itself over DataLoader workers (as Hugging Face's does)."""

    def __init__(self, docs):
        self.docs = docs

    def __iter__(self):
        info = get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(self.docs[k::n])


def _segments(batch, eot=None):
    """The documents of a PackerDataset batch, as tuples of their tokens (eot stripped)."""
    out = []
    for row, cu in enumerate(batch["cu_seqlens_rows"]):
        cu = cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if batch["attention_mask"][row, a] == 0:
                continue  # padding
            tokens = batch["input_ids"][row, a:b].tolist()
            if eot is not None:
                assert tokens[-1] == eot
                tokens = tokens[:-1]
            out.append(tuple(tokens))
    return out


def _packer_segments(batch):
    """The documents of a packer batch (its own layout: one cu_seqlens per row)."""
    out = []
    for row, cu in enumerate(batch["cu_seqlens"]):
        cu = cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if batch["attention_mask"][row, a] != 0:
                out.append(tuple(batch["input_ids"][row, a:b].tolist()))
    return out


def _kwargs(**kw):
    return dict(batch_size=ROWS, seqlen=SEQLEN, buffer_size=8, drop_last=False, **kw)


def _run(source, world, workers, eot=None, **kw):
    seen = []
    for rank in range(world):
        ds = PackerDataset(source, rank=rank, world_size=world, eot=eot, **_kwargs(**kw))
        for batch in DataLoader(ds, batch_size=None, num_workers=workers):
            seen += _segments(batch, eot)
    return Counter(seen)


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (3, 1)])
def test_every_document_once_over_workers_and_ranks(world, workers):
    docs = _docs()
    assert _run(docs, world, workers) == _want(docs)


@pytest.mark.parametrize("kind", ["store", "opaque"])
def test_store_and_opaque_sources_shard_exactly(tmp_path, kind):
    docs = _docs(47, seed=3)
    source = build(tmp_path / "s", docs) if kind == "store" else Opaque(docs)
    assert _run(source, 2, 1) == _want(docs)
    assert _run(source, 2, 0, eot=EOT) == _want(docs)


def test_batch_format_is_the_views_collate_layout():
    docs = _docs(30)
    ds = PackerDataset(docs, eot=EOT, mode="causal", **_kwargs())
    batch = next(iter(DataLoader(ds, batch_size=None)))
    assert set(batch) == {
        "input_ids",
        "attention_mask",
        "position_ids",
        "targets",
        "cu_seqlens",
        "cu_seqlens_rows",
        "max_seqlen",
    }
    for key in ("input_ids", "attention_mask", "position_ids", "targets"):
        assert batch[key].shape == (ROWS, SEQLEN) and batch[key].dtype == torch.int64
    # position_ids restart at every segment; the flat cu_seqlens are collate's
    rows = []
    for r, cu in enumerate(batch["cu_seqlens_rows"]):
        cu = cu.tolist()
        expected = [p for a, b in zip(cu[:-1], cu[1:]) for p in range(b - a)]
        assert batch["position_ids"][r].tolist() == expected
        rows.append({"input_ids": batch["input_ids"][r].numpy(), "cu_seqlens": np.asarray(cu)})
    again = collate(rows)
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == again["cu_seqlens"].tolist()
    assert batch["max_seqlen"] == again["max_seqlen"]
    # causal labels: next token inside a segment (the eot is predicted), -100 at each end
    ids, labels = batch["input_ids"], batch["targets"]
    for r, cu in enumerate(batch["cu_seqlens_rows"]):
        cu = cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if batch["attention_mask"][r, a] == 1:
                assert (
                    labels[r, a : b - 1].tolist() == ids[r, a + 1 : b].tolist()
                    and labels[r, b - 1] == -100
                )
    assert set(hf_inputs(batch, "sdpa")) >= {
        "input_ids",
        "position_ids",
        "attention_mask",
        "shift_labels",
    }


def test_int32_and_epochs():
    docs = _docs(30)
    ds = PackerDataset(
        docs, dtype=torch.int32, mode="mlm", mask_id=5000, vocab_size=6000, **_kwargs()
    )
    first = [b for b in DataLoader(ds, batch_size=None)]
    assert first[0]["input_ids"].dtype == torch.int32 and first[0]["targets"].dtype == torch.int32
    ds.set_epoch(1)
    second = [b for b in DataLoader(ds, batch_size=None)]
    assert any(
        not torch.equal(a["targets"], b["targets"]) for a, b in zip(first, second)
    )  # new masks


def test_validation():
    with pytest.raises(ValueError, match="world_size=0"):
        PackerDataset([[1]], rank=0, world_size=0, **_kwargs())
    with pytest.raises(ValueError, match="rank=2"):
        PackerDataset([[1]], rank=2, world_size=2, **_kwargs())
    with pytest.raises(TypeError, match="return_tensors"):  # the DataLoader makes the tensors
        PackerDataset([[1]], return_tensors="pt", **_kwargs())
    with pytest.raises(ValueError, match="buffer_size"):  # the packer's own checks run at once
        PackerDataset([[1]], batch_size=4, seqlen=8, buffer_size=2)
    with pytest.raises(ValueError, match="dtype"):
        PackerDataset([[1]], dtype=torch.float32, **_kwargs())
    with pytest.raises(ValueError, match="rank=1, world_size=1"):  # a rank past the world
        next(iter(StreamingPacker([[1]], rank=1, **_kwargs())))


# =========================================================================== the packer itself
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["list", "store", "opaque"])
def test_the_packer_is_a_dataloader_dataset(tmp_path, kind, workers):
    """``DataLoader(StreamingPacker(...), batch_size=None)``: no ``len()`` asked, tensors out,
    every document in exactly one worker's shard."""
    docs = _docs(53, seed=4)
    source = {"list": docs, "store": build(tmp_path / "s", docs), "opaque": Opaque(docs)}[kind]
    packer = StreamingPacker(source, **_kwargs())
    assert isinstance(packer, IterableDataset)
    seen = Counter()
    for batch in DataLoader(packer, batch_size=None, num_workers=workers):
        assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].shape[1] == 24
        assert all(isinstance(c, torch.Tensor) for c in batch["cu_seqlens"])
        seen.update(_packer_segments(batch))
    assert seen == _want(docs)


def test_ranks_times_workers_share_the_source_exactly():
    """Explicit ranks (as torch.distributed gives them) times 2 workers: 6 shards."""
    docs = _docs(71, seed=5)
    seen = Counter()
    for rank in range(3):
        packer = StreamingPacker(docs, rank=rank, world_size=3, eot=EOT, **_kwargs())
        for batch in DataLoader(packer, batch_size=None, num_workers=2):
            seen.update(s[:-1] for s in _packer_segments(batch))
    assert seen == _want(docs)


def test_shard_false_reads_a_source_that_splits_itself():
    docs = _docs(40, seed=6)
    packer = StreamingPacker(SplitsItself(docs), shard=False, **_kwargs())
    seen = Counter()
    for batch in DataLoader(packer, batch_size=None, num_workers=2):
        seen.update(_packer_segments(batch))
    assert seen == _want(docs)


@pytest.mark.slow
def test_spawned_workers_learn_their_shard():
    """Workers started by "spawn" get the packer by pickle: the consumer provider travels along
    (by name), so they shard as forked workers do."""
    docs = _docs(31, seed=7)
    loader = DataLoader(
        StreamingPacker(docs, **_kwargs()),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
    )
    assert Counter(s for b in loader for s in _packer_segments(b)) == _want(docs)


class WarmupOfTheWorker(IterableDataset):
    """Iterates its packer in each worker, then yields the worker's warm-up duration."""

    def __init__(self, packer):
        self.packer = packer

    def __iter__(self):
        for _ in self.packer:
            pass
        yield self.packer.batch_size_schedule.warmup_tokens


def test_schedules_are_divided_by_every_consumer():
    """A warm-up over T tokens is reached after T / (ranks * workers) tokens of each consumer
    (every consumer counts only the tokens it emits)."""
    kw = _kwargs(batch_size_warmup_min_size=1, batch_size_warmup_tokens=6000)
    assert StreamingPacker(_docs(), **kw).batch_size_schedule.warmup_tokens == 6000
    assert StreamingPacker(_docs(), world_size=3, **kw).batch_size_schedule.warmup_tokens == 2000
    ds = WarmupOfTheWorker(StreamingPacker(_docs(), world_size=3, **kw))
    assert list(DataLoader(ds, batch_size=None, num_workers=2)) == [1000, 1000]


# =========================================================================== StatefulDataLoader
def _tolists(batches, key="input_ids"):
    return [b[key].tolist() for b in batches]


@pytest.mark.parametrize("wrap", ["packer", "dataset"])
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_without_replay(tmp_path, caplog, wrap, workers):
    """Stop mid-epoch after k batches with the loader's state_dict, resume in a new loader over
    a new packer: the batches are those of the uninterrupted run (MLM masks included), and
    torchdata restored the packer's position instead of fast-forwarding through batches."""
    docs = _docs(120, seed=8)
    source = build(tmp_path / "s", docs)
    kw = _kwargs(mode="mlm", mask_id=5000, vocab_size=6000, seed=3)

    def loader():
        ds = StreamingPacker(source, **kw) if wrap == "packer" else PackerDataset(source, **kw)
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    full = list(loader())
    assert len(full) > 10
    for k in (1, 7):
        interrupted = loader()
        it = iter(interrupted)
        head = [next(it) for _ in range(k)]
        state = interrupted.state_dict()
        del it, interrupted
        torch.save(state, tmp_path / "state.pt")
        resumed = loader()
        resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
        with caplog.at_level(logging.WARNING):
            rest = list(resumed)
        assert "fast-forward" not in caplog.text
        for key in ("input_ids", "targets"):
            assert _tolists(head + rest, key) == _tolists(full, key)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_over_an_opaque_source_says_why(workers):
    """An opaque iterable has no position to restore: its state (taken by the loader when asked,
    or by its workers as they start) is refused with the packer's TypeError."""
    packer = StreamingPacker(Opaque(_docs()), **_kwargs())
    loader = StatefulDataLoader(packer, batch_size=None, num_workers=workers)
    with pytest.raises(TypeError, match="random-access source"):
        it = iter(loader)
        next(it)
        loader.state_dict()


def test_a_state_of_another_worker_count_is_refused(tmp_path):
    docs = _docs(60, seed=9)
    packer = StreamingPacker(docs, **_kwargs())
    it = iter(DataLoader(packer, batch_size=None))
    next(it)
    state = packer.state_dict()
    assert state["shard"] == [0, 1]
    other = StreamingPacker(docs, rank=1, world_size=2, **_kwargs())
    with pytest.raises(StateMismatchError, match="shard 0 of 1"):
        other.load_state_dict(state)


# =========================================================================== torch.distributed
def test_torch_consumer_outside_a_worker():
    assert torch_consumer().shard == (0, 1)


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_of_a_process_group_share_the_source(tmp_path):
    """Two real ranks (gloo, file rendezvous, loopback): ``DataLoader(StreamingPacker(store))``
    with a worker each takes its rank from torch.distributed; together they emit every document
    once."""
    import _dist_streaming

    docs = _docs(64, seed=10)
    store = build(tmp_path / "s", docs)
    job = {"init_file": str(tmp_path / "init"), "out": str(tmp_path / "out.json"),
           "store": str(store.path), "kwargs": _kwargs()}  # fmt: skip
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        ctx = mp.spawn(_dist_streaming.run_rank, args=(2, job), nprocs=2, join=False)
        while not ctx.join():
            pass
    finally:
        if before is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before
    shares = json.loads(Path(job["out"]).read_text())
    assert all(shares) and len(shares) == 2
    assert Counter(tuple(s) for share in shares for s in share) == _want(docs)


def test_the_facades_packer_is_a_dataloader_dataset_without_importing_the_torch_layer():
    """``mmpack.StreamingPacker`` (the path a user takes) works in a DataLoader at once: the
    façade registers it with torch when torch is installed."""
    import subprocess
    import sys

    code = (
        "import sys, mmpack\n"
        "from torch.utils.data import DataLoader\n"
        "assert 'mmpack.torch' not in sys.modules\n"
        "p = mmpack.StreamingPacker([[1, 2, 3], [4, 5]], batch_size=1, seqlen=4,"
        " buffer_size=2, drop_last=False)\n"
        "rows = [b['input_ids'].tolist() for b in DataLoader(p, batch_size=None)]\n"
        "assert rows == [[[1, 2, 3, 0]], [[4, 5, 0, 0]]], rows\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
