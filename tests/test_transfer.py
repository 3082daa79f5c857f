"""SharedCollator: batches from workers in reused shared buffers, never overwritten while held.

Run: ``pytest tests/test_transfer.py``.
"""

from __future__ import annotations

import gc
import io
import pickle
from multiprocessing.reduction import (
    ForkingPickler,  # torch registers its tensor reducers here
)
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing
from torch.utils.data import DataLoader

from mmpack.store.writer import build
from mmpack.torch import transfer
from mmpack.torch.collate import collate
from mmpack.torch.sampler import ResumableSampler
from mmpack.torch.transfer import SharedCollator
from mmpack.views.packed import PackedDataset

SEQLEN, BATCH = 64, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 1000, size=int(n)) for n in rng.integers(1, 90, size=300)]
    store = build(tmp_path_factory.mktemp("t") / "s", docs)
    return PackedDataset(store, SEQLEN, eot=1001, pad_id=1002)


def _same(got, want, dtype):
    assert set(got) == set(want)
    for key, value in want.items():
        if key in ("input_ids", "targets", "position_ids", "attention_mask"):
            assert got[key].dtype == dtype and torch.equal(got[key].long(), value), key
        elif key == "cu_seqlens_rows":
            assert [r.tolist() for r in got[key]] == [r.tolist() for r in value]
        elif isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def _reference(dataset, sampler_seed=3):
    order = list(ResumableSampler(len(dataset), seed=sampler_seed))
    return [
        collate([dataset[i] for i in order[k : k + BATCH]])
        for k in range(0, len(order) - BATCH + 1, BATCH)
    ]


@pytest.mark.parametrize("dtype, workers", [(torch.int32, 2), (torch.int64, 1), (torch.int32, 0)])
def test_same_batches_as_collate_even_when_all_are_held(dataset, dtype, workers):
    want = _reference(dataset)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=ResumableSampler(len(dataset), seed=3),
        num_workers=workers,
        collate_fn=SharedCollator(dtype=dtype, slots=3),
        drop_last=True,
    )
    held = list(loader)  # every batch kept alive: no buffer may be reused under them
    assert len(held) == len(want) > 3 * max(workers, 1) * 2
    for got, ref in zip(held, want):
        _same(got, ref, dtype)
    # and a loop that drops each batch at once sees the same values (buffers reused)
    for got, ref in zip(loader, want):
        _same(got, ref, dtype)


def _through_pickle(batch):
    """What the DataLoader does between a worker and the main process (in one process here)."""
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(batch)
    return pickle.loads(buf.getvalue())


def test_a_buffer_is_reused_only_after_the_main_side_drops_the_batch(dataset, monkeypatch):
    monkeypatch.setattr(
        transfer, "get_worker_info", lambda: SimpleNamespace(id=0)
    )  # act as worker 0
    collator = SharedCollator(dtype=torch.int32, slots=2)
    samples = [dataset[i] for i in range(BATCH)]
    first = _through_pickle(collator(samples))
    pool = collator._pool
    assert type(first) is dict and pool.flags.tolist() == [1, 0]
    assert first["input_ids"].dtype == torch.int32
    second = _through_pickle(collator(samples))
    assert pool.flags.tolist() == [1, 1] and len(pool.buffers) == 2
    third = _through_pickle(collator(samples))  # both slots held: an untracked buffer
    assert pool.flags.tolist() == [1, 1] and len(pool.buffers) == 2
    keep = first["targets"]  # one view keeps the whole batch's buffer alive
    del first, second, third
    gc.collect()
    assert pool.flags.tolist() == [1, 0]
    before = pool.buffers[1]
    fourth = _through_pickle(collator(samples))
    assert pool.buffers[1] is before and pool.flags.tolist() == [1, 1]  # reused, not reallocated
    del keep, fourth
    gc.collect()
    assert pool.flags.tolist() == [0, 0]


def test_validation():
    with pytest.raises(ValueError, match="slots=0"):
        SharedCollator(slots=0)
    with pytest.raises(ValueError, match="dtype"):
        SharedCollator(dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        collate([{"input_ids": np.arange(3)}], dtype=torch.int16)


def test_a_slot_still_held_from_an_earlier_worker_is_not_taken(dataset, monkeypatch):
    """Non-persistent workers: the next epoch's worker 0 must skip slots its predecessor's
    batches still hold."""
    monkeypatch.setattr(transfer, "get_worker_info", lambda: SimpleNamespace(id=0))
    collator = SharedCollator(slots=2)
    samples = [dataset[i] for i in range(BATCH)]
    old = _through_pickle(collator(samples))
    collator._pool = None  # a new worker process with the same id
    new = _through_pickle(collator(samples))
    assert collator._flags[0].tolist() == [1, 1] and list(collator._pool.buffers) == [1]
    expected = old["input_ids"].clone()
    del new
    gc.collect()
    again = _through_pickle(collator(samples))  # reuses slot 1, never slot 0
    assert list(collator._pool.buffers) == [1] and torch.equal(old["input_ids"], expected)
    del old, again
