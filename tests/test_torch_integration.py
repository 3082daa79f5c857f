"""mmpack's views inside a PyTorch training loop: DataLoader workers (fork and spawn, persistent),
batched ``__getitems__``, ``mmpack._src.torch.collate``, and exact resume through torchdata's
``StatefulDataLoader`` in a fresh process (MLM masks included).

Run: ``make test`` (these are marked slow: worker processes take seconds to start).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import mmpack
from mmpack.torch import collate

pytestmark = pytest.mark.slow


def _corpus(n_docs: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(3.5, 1.0, size=n_docs).astype(int), 0)
    return [rng.integers(1, 1000, size=n) for n in lens]


def make_view(kind: str, path):
    store = mmpack.build(path, _corpus())
    if kind == "window":
        return mmpack.WindowDataset(store, 64, 48, eot=1000, labels=True)
    if kind == "packed-causal":
        return mmpack.PackedDataset(store, 64, eot=1000, pad_id=0)
    return mmpack.PackedDataset(
        store,
        64,
        eot=1000,
        pad_id=0,
        mode="mlm",
        mask_id=1001,
        vocab_size=1002,
        special_ids=(1000,),
        seed=3,
    )


VIEWS = ["window", "packed-causal", "packed-mlm"]


def _expected_batches(ds, order, batch_size, epoch=0):
    """The batches read in this process by plain ints, with the dataset set to ``epoch``."""
    ref = pickle.loads(pickle.dumps(ds))
    if hasattr(ref, "set_epoch"):
        ref.set_epoch(epoch)
    return [
        collate([ref[int(i)] for i in order[a : a + batch_size]])
        for a in range(0, len(order), batch_size)
    ]


def _assert_batches_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in ("input_ids", "position_ids", "targets", "cu_seqlens"):
            if key in w:
                assert torch.equal(g[key], w[key]), key


@pytest.mark.parametrize("kind", VIEWS)
def test_view_pickles_small(tmp_path, kind):
    ds = make_view(kind, tmp_path / "s")
    assert len(pickle.dumps(ds)) < 4096


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("kind", VIEWS)
def test_dataloader_workers(tmp_path, kind, context):
    """Two worker processes, each mapping the store itself, deliver exactly the batches the
    sampler asks for, in order, through ``__getitems__`` and ``mmpack._src.torch.collate``."""
    ds = make_view(kind, tmp_path / "s")
    sampler = mmpack.ResumableSampler(len(ds), seed=5)
    loader = DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=2,
        collate_fn=collate,
        multiprocessing_context=context,
        persistent_workers=True,
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = list(loader)
        _assert_batches_equal(got, _expected_batches(ds, list(sampler), 8, epoch))


_RESUME_SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    import mmpack
    from mmpack.torch import collate

    ds, state, workers = pickle.load(open(sys.argv[1], "rb"))
    sampler = mmpack.ResumableSampler(len(ds), seed=11)
    loader = StatefulDataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers,
                                collate_fn=collate)
    loader.load_state_dict(state)
    out = [{k: b[k].tolist() for k in ("input_ids", "targets")} for b in loader]
    json.dump(out, open(sys.argv[2], "w"))
    """
)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["window", "packed-mlm"])
def test_stateful_dataloader_resumes_in_a_fresh_process(tmp_path, kind, workers):
    """Train k steps, save the loader's state, resume in a new interpreter: the remaining
    batches equal those of the uninterrupted run (for MLM, the very same masks)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = make_view(kind, tmp_path / "s")

    def loader():
        return StatefulDataLoader(
            ds,
            batch_size=4,
            sampler=mmpack.ResumableSampler(len(ds), seed=11),
            num_workers=workers,
            collate_fn=collate,
        )

    full = [{k: b[k].tolist() for k in ("input_ids", "targets")} for b in loader()]
    interrupted = loader()
    it = iter(interrupted)
    k = 3
    for _ in range(k):
        next(it)
    state = interrupted.state_dict()
    blob = tmp_path / "state.pkl"
    blob.write_bytes(pickle.dumps((ds, state, workers)))
    script = tmp_path / "resume.py"
    script.write_text(_RESUME_SCRIPT)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(script), str(blob), str(out)], check=True, timeout=300)
    assert json.loads(out.read_text()) == full[k:]


# -- issue 13 item 8: the epoch reaches persistent workers, and a resume restores it -----------------


def _mlm_batches(loader):
    return [{k: b[k].tolist() for k in ("input_ids", "targets")} for b in loader]


def test_mlm_masks_differ_per_epoch_with_persistent_workers(tmp_path):
    """``sampler.set_epoch`` in the main process only: the persistent workers' copies of the
    dataset never see it, yet epoch 1 is masked as epoch 1 (the indices carry their epoch)."""
    ds = make_view("packed-mlm", tmp_path / "s")
    sampler = mmpack.ResumableSampler(len(ds), shuffle=False)  # the same order every epoch
    loader = DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=2,
        collate_fn=collate,
        persistent_workers=True,
    )
    epochs = []
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        got = list(loader)
        _assert_batches_equal(got, _expected_batches(ds, list(range(len(ds))), 8, epoch))
        epochs.append(torch.cat([b["input_ids"] for b in got]))
    assert ds.epoch == 0  # nobody called ds.set_epoch
    for a, b in ((0, 1), (1, 2), (0, 2)):
        changed = (epochs[a] != epochs[b]).float().mean().item()
        assert changed > 0.05, (a, b, changed)  # ~30% of tokens are selected per epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_loader_masks_as_the_epoch_it_resumes(tmp_path, workers):
    """A run saved k batches into epoch 1 and resumed by a fresh StatefulDataLoader (fresh
    sampler, no set_epoch anywhere) gets epoch 1's masks, not epoch 0's."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = make_view("packed-mlm", tmp_path / "s")

    def loader():
        sampler = mmpack.ResumableSampler(len(ds), seed=11)
        return sampler, StatefulDataLoader(
            ds, batch_size=4, sampler=sampler, num_workers=workers, collate_fn=collate
        )

    sampler, run = loader()
    _mlm_batches(run)
    sampler.set_epoch(1)
    epoch1 = _mlm_batches(run)
    # the single-process reference: plain ints in epoch 1's order, the dataset set to epoch 1
    reference = [
        {k: b[k].tolist() for k in ("input_ids", "targets")}
        for b in _expected_batches(ds, list(sampler), 4, epoch=1)
    ]
    assert epoch1 == reference
    sampler, interrupted = loader()
    _mlm_batches(interrupted)
    sampler.set_epoch(1)
    it = iter(interrupted)
    k = 3
    for _ in range(k):
        next(it)
    state = pickle.loads(pickle.dumps(interrupted.state_dict()))
    del it
    _, resumed = loader()
    resumed.load_state_dict(state)
    assert _mlm_batches(resumed) == reference[k:]
