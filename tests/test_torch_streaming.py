"""PackerDataset: the streaming packer in a DataLoader, sharded over workers and ranks.

Every document has distinct token ids, so the segments of the emitted batches name the documents
they came from: the union over workers and ranks must be every document exactly once.
Run: ``pytest tests/test_torch_streaming.py``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mmpack.store.writer import build
from mmpack.streaming.packer import StreamingPacker
from mmpack.torch.collate import collate
from mmpack.torch.hf import hf_inputs
from mmpack.torch.streaming import PackerDataset

SEQLEN, ROWS, EOT = 24, 3, 0


def _docs(n=61, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, SEQLEN - 1, size=n)
    starts = 1 + np.concatenate([[0], np.cumsum(lens)[:-1]])
    return [np.arange(s, s + k, dtype=np.int64) for s, k in zip(starts, lens)]


class Opaque:
    """An iterable with no len: only iteration (the packer cannot index it)."""

    def __init__(self, docs):
        self.docs = docs

    def __iter__(self):
        return iter(list(self.docs))


def _segments(batch, eot=None):
    """The documents of a batch, as tuples of their tokens (eot stripped and checked)."""
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


def _kwargs(**kw):
    return dict(out_batch_size=ROWS, out_pseq_len=SEQLEN, buffer_size=8, drop_last=False, **kw)


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
    assert _run(docs, world, workers) == Counter(tuple(d.tolist()) for d in docs)


@pytest.mark.parametrize("kind", ["store", "opaque"])
def test_store_and_opaque_sources_shard_exactly(tmp_path, kind):
    docs = _docs(47, seed=3)
    source = build(tmp_path / "s", docs) if kind == "store" else Opaque(docs)
    assert _run(source, 2, 1) == Counter(tuple(d.tolist()) for d in docs)
    assert _run(source, 2, 0, eot=EOT) == Counter(tuple(d.tolist()) for d in docs)


def test_a_store_shard_keeps_the_read_ranges_path(tmp_path):
    store = build(tmp_path / "s", _docs(20))
    ds = PackerDataset(store, rank=1, world_size=2, **_kwargs())
    packer_source = ds._source_for(*ds.shard())
    assert StreamingPacker(packer_source, **_kwargs())._store_like
    assert np.array_equal(packer_source.offsets, store.offsets[10:21])


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
    with pytest.raises(ValueError, match="return_tensors"):
        PackerDataset([[1]], return_tensors="pt", **_kwargs())
    with pytest.raises(ValueError, match="buffer_size"):  # the packer's own checks run at once
        PackerDataset([[1]], out_batch_size=4, out_pseq_len=8, buffer_size=2)
    with pytest.raises(ValueError, match="dtype"):
        PackerDataset([[1]], dtype=torch.float32, **_kwargs())
