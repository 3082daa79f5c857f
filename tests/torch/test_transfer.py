"""collate in DataLoader workers: batches in reused shared buffers, each buffer's descriptor sent
once, never overwritten while held.

Run: ``pytest tests/torch/test_transfer.py``.
"""

from __future__ import annotations

import copy
import gc
import io
import os
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

from mmpack import PackedDataset, ResumableSampler, build
from mmpack._src.core.process import PerProcess
from mmpack._src.torch import transfer
from mmpack.torch import Collator, collate

SEQLEN, BATCH = 64, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 1000, size=int(n)) for n in rng.integers(1, 90, size=300)]
    store = build(tmp_path_factory.mktemp("t") / "s", docs)
    return PackedDataset(store, SEQLEN, eot=1001, pad_id=1002)


@pytest.fixture
def as_worker(monkeypatch):
    """This process acts as DataLoader worker 0 (and, unpickling, as the main process)."""
    monkeypatch.setattr(transfer, "get_worker_info", lambda: SimpleNamespace(id=0))
    pool = transfer._Pool()
    pool.token = (os.getppid(), 1)  # as if made in another (live) process
    monkeypatch.setattr(transfer, "_POOL", PerProcess(lambda: pool))
    monkeypatch.setattr(transfer, "_REMOTES", {})


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
        collate_fn=collate if dtype == torch.int64 else Collator(dtype=dtype),
        drop_last=True,
    )
    held = list(loader)  # every batch kept alive: no buffer may be reused under them
    assert len(held) == len(want) > transfer.SLOTS * max(workers, 1) + 4
    for got, ref in zip(held, want):
        _same(got, ref, dtype)
    # and a loop that drops each batch at once sees the same values (buffers reused)
    for got, ref in zip(loader, want):
        _same(got, ref, dtype)


def test_numpy_views_memoryviews_and_dlpack_of_batches_are_never_overwritten(dataset):
    """What a loop keeps of a batch it dropped (its tensors' ``.numpy()``, a memoryview of that,
    a DLPack capsule) still reads that batch after every later one: the buffer is reused only
    when nothing views its memory."""
    want = _reference(dataset)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=ResumableSampler(len(dataset), seed=3),
        num_workers=2,
        collate_fn=collate,
        drop_last=True,
    )
    keep = [  # one kind per batch (a capsule of a view would keep the whole batch alive)
        lambda batch: batch["input_ids"].numpy(),
        lambda batch: memoryview(batch["input_ids"].numpy()),
        lambda batch: torch.utils.dlpack.to_dlpack(batch["input_ids"]),
        lambda batch: np.from_dlpack(batch["input_ids"]),
    ]
    kept = []
    for k, batch in enumerate(loader):
        kept.append(keep[k % len(keep)](batch))
        del batch  # only what was kept of it is left
    assert len(kept) == len(want) > transfer.SLOTS * 2 + 4
    for k, (held, ref) in enumerate(zip(kept, want)):
        if k % len(keep) == 2:
            held = torch.utils.dlpack.from_dlpack(held)
        assert np.array_equal(np.asarray(held), ref["input_ids"].numpy()), k


def _through_pickle(batch):
    """What the DataLoader does between a worker and the main process (in one process here)."""
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(batch)
    return pickle.loads(buf.getvalue())


def _flags():
    return transfer._POOL.get().state[0, :3].tolist()


def test_a_buffer_is_reused_only_after_the_main_side_drops_the_batch(dataset, as_worker):
    samples = [dataset[i] for i in range(BATCH)]
    first = _through_pickle(collate(samples))
    pool = transfer._POOL.get()
    assert type(first) is dict and _flags() == [1, 0, 0]
    assert first["input_ids"].dtype == torch.int64
    second = _through_pickle(collate(samples))
    assert _flags() == [1, 1, 0] and len(pool.buffers) == 2
    keep = first["targets"]  # one view keeps the whole batch's buffer alive
    del first, second
    gc.collect()
    assert _flags() == [1, 0, 0]
    before = pool.buffers[1]
    third = _through_pickle(collate(samples))
    assert pool.buffers[1] is before and _flags() == [1, 1, 0]  # reused, not reallocated
    del keep, third
    gc.collect()
    assert _flags() == [0, 0, 0]


@pytest.mark.parametrize("keep", ["numpy", "memoryview", "dlpack", "numpy dlpack", "storage"])
def test_anything_viewing_a_batch_keeps_its_buffer(dataset, as_worker, keep):
    samples = [dataset[i] for i in range(BATCH)]
    first = _through_pickle(collate(samples))
    want = first["input_ids"].clone()
    held = {
        "numpy": lambda t: t.numpy(),
        "memoryview": lambda t: memoryview(t.numpy()),
        "dlpack": torch.utils.dlpack.to_dlpack,
        "numpy dlpack": np.from_dlpack,
        "storage": lambda t: t.untyped_storage(),
    }[keep](first["input_ids"])
    del first
    gc.collect()
    assert _flags()[0] == 1  # still viewed: the worker may not reuse it
    other = [dataset[i] for i in range(BATCH, 2 * BATCH)]
    later = _through_pickle(collate(other))  # in another slot
    assert _flags()[:2] == [1, 1]
    if keep == "storage":
        held = torch.empty(0, dtype=want.dtype).set_(held)[: want.numel()].view(want.shape)
    elif keep == "dlpack":
        held = torch.utils.dlpack.from_dlpack(held)
    assert torch.equal(torch.as_tensor(np.asarray(held)), want)
    del held, later
    gc.collect()
    assert _flags() == [0, 0, 0]  # nothing views either batch: both slots free


def test_a_batch_passed_on_to_another_process_is_a_copy(dataset, as_worker):
    """Sent on through torch's multiprocessing pickler, a batch's tensor arrives in a segment of
    its own: the worker's later batches never show through it."""
    samples = [dataset[i] for i in range(BATCH)]
    got = _through_pickle(collate(samples))
    want = got["input_ids"].clone()
    passed = _through_pickle(got["input_ids"])
    buffer = transfer._POOL.get().buffers[0][1]
    assert passed.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    del got
    gc.collect()
    assert _flags()[0] == 0  # the batch left the buffer: its slot is free
    later = _through_pickle(collate([dataset[i] for i in range(BATCH, 2 * BATCH)]))
    assert transfer._POOL.get().buffers[0][1] is buffer and torch.equal(passed, want)
    del later


def test_every_slot_held_gives_fresh_buffers(dataset, as_worker):
    samples = [dataset[i] for i in range(BATCH)]
    held = [_through_pickle(collate(samples)) for _ in range(transfer.SLOTS + 2)]
    assert len(transfer._POOL.get().buffers) == transfer.SLOTS
    assert all(torch.equal(b["input_ids"], held[0]["input_ids"]) for b in held)
    del held
    gc.collect()
    assert transfer._POOL.get().state[0, : transfer.SLOTS].sum() == 0


def test_a_buffer_is_sent_once_then_only_its_key(dataset, as_worker):
    samples = [dataset[i] for i in range(BATCH)]
    batch = collate(samples)
    args = batch.__reduce__()[1]
    assert args[1] is not None and args[4] is not None  # the shared state and the buffer
    got = _through_pickle(batch)
    del got
    gc.collect()
    again = collate(samples)
    token, state, slot, generation, buf, *_ = again.__reduce__()[1]
    assert state is None and buf is None and slot == 0 and generation == 1  # the key alone
    _same(_through_pickle(again), collate(samples), torch.int64)


def test_a_batch_changed_in_the_worker_arrives_as_changed(dataset, as_worker, monkeypatch):
    """Keys renamed, added and removed go as they are; a per-token view under a new key still
    goes by the buffer; a value sharing the buffer otherwise keeps its slot busy for good."""
    samples = [dataset[i] for i in range(BATCH)]
    want = collate(samples)
    batch = collate(samples)
    batch["labels"] = batch.pop("targets")
    del batch["max_seqlen"]
    batch["extra"] = torch.arange(3)
    got = _through_pickle(batch)
    assert list(got) == [k for k in want if k not in ("targets", "max_seqlen")] + [
        "labels",
        "extra",
    ]
    assert torch.equal(got["labels"], want["targets"]) and got["extra"].tolist() == [0, 1, 2]
    assert batch.__reduce__()[1][5][-2] == ("labels", 2)  # row 2 of the buffer
    del got
    gc.collect()
    assert _flags()[:2] == [1, 0]  # want holds slot 0; batch's slot 1 is free again

    monkeypatch.setattr(transfer, "_SMALL_BYTES", 0)  # torch's own path, not a copy by value
    sharing = collate(samples)
    sharing["head"] = sharing["input_ids"][:, :2]
    got = _through_pickle(sharing)
    assert torch.equal(got["head"], want["input_ids"][:, :2])
    del got, sharing
    gc.collect()
    busy = transfer._POOL.get().state[0, : transfer.SLOTS].tolist()
    assert busy.count(1) == 2  # want's, and that slot for good: nothing received is overwritten


def test_validation():
    with pytest.raises(ValueError, match="dtype"):
        Collator(dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        collate([{"input_ids": np.arange(3)}], dtype=torch.int16)


def test_outside_a_worker_the_batch_is_a_plain_dict(dataset):
    batch = collate([dataset[0]])
    assert type(batch) is dict
    assert transfer.share_batch(batch, ["input_ids"]) is batch


def test_the_buffers_of_exited_workers_are_forgotten(monkeypatch):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # exited and reaped: its pid names no process
    remotes = {(dead.pid, 1): object(), (transfer.os.getpid(), 2): object()}
    monkeypatch.setattr(transfer, "_REMOTES", remotes)
    transfer._forget_exited_workers()
    assert list(remotes) == [(transfer.os.getpid(), 2)]


def test_copies_in_the_worker_keep_the_protocol(dataset, as_worker):
    """``copy.copy`` (torch's default_convert, batch_size=None) still ships by the buffer; a
    deep copy (a pickle read back where it was made) is values of its own and frees nothing."""
    samples = [dataset[i] for i in range(BATCH)]
    want = collate(samples)
    shallow = copy.copy(collate(samples))
    assert type(shallow) is transfer._SharedBatch and _flags()[:2] == [1, 1]
    pool = transfer._POOL.get()
    pool.token = (os.getpid(), 2)  # unpickled where it was made
    deep = copy.deepcopy(collate(samples))
    assert type(deep) is dict and torch.equal(deep["input_ids"], want["input_ids"])
    assert deep["input_ids"].untyped_storage().data_ptr() != pool.buffers[2][1].data_ptr()
    assert transfer._REMOTES == {} and int(pool.state[0, transfer._ACK]) == 0
    pool.token = (os.getppid(), 1)
    got = _through_pickle(shallow)
    _same(got, want, torch.int64)


def test_spawned_and_non_persistent_workers(dataset):
    """Workers started by "spawn", and new worker processes every epoch: the same batches, held
    ones never overwritten, and the main process forgets the buffers of exited workers."""
    want = _reference(dataset)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=ResumableSampler(len(dataset), seed=3),
        num_workers=1,
        collate_fn=collate,
        drop_last=True,
        multiprocessing_context="spawn",
    )
    held = list(loader)
    for got, ref in zip(held, want):
        _same(got, ref, torch.int64)
    again = list(loader)  # another worker process
    for got, ref in zip(held + again, want + want):
        _same(got, ref, torch.int64)
    third = next(iter(loader))  # registering a third worker forgets the two exited ones
    assert len(transfer._REMOTES) == 1
    _same(third, want[0], torch.int64)
