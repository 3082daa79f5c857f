"""The views' reusable output buffers: an array is handed out again only when nothing reads its
memory any more (numpy views, memoryviews, DLPack capsules, tensors over it).

Run: ``pytest tests/views/test_buffers.py``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from mmpack import PackedDataset, WindowDataset, build
from mmpack._src.views import buffers
from mmpack._src.views.buffers import BufferPool

HOLDERS = {
    "numpy view": lambda a: a[::1],
    "memoryview": memoryview,
    "dlpack capsule": lambda a: a.__dlpack__(),
    "numpy from dlpack": np.from_dlpack,
    "tensor": torch.from_numpy,
    "tensor's numpy": lambda a: torch.from_numpy(a).numpy(),
    "torch from dlpack": torch.from_dlpack,
}


def _read(held) -> np.ndarray:
    if type(held).__name__ == "PyCapsule":
        return torch.utils.dlpack.from_dlpack(held).numpy()
    return np.asarray(held)


def test_the_calibrated_count_is_what_an_array_only_the_pool_holds_reads_as():
    arrays = [np.empty(1), np.empty(1)]
    held = arrays[1]
    assert buffers._reference_counts(arrays) == [buffers._FREE_REFCOUNT, buffers._FREE_REFCOUNT + 1]
    del held


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_an_array_is_reused_only_when_nothing_reads_it(holder):
    pool = BufferPool(min_bytes=0)
    first = pool.empty((4, 8), np.int64)
    first[:] = 7
    address = first.ctypes.data
    held = HOLDERS[holder](first)
    del first
    gc.collect()
    second = pool.empty((4, 8), np.int64)
    assert second.ctypes.data != address  # a new array: the first is still read
    second[:] = 9
    assert (_read(held) == 7).all()
    del held, second
    gc.collect()
    assert pool.empty((4, 8), np.int64).ctypes.data == address  # nothing reads it: reused


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, 1000, size=int(n)) for n in rng.integers(1, 300, size=400)]
    return build(tmp_path_factory.mktemp("b") / "s", docs)


@pytest.mark.parametrize("kind", ["window", "packed"])
@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_what_a_loop_keeps_of_a_view_batch_is_never_overwritten(store, kind, holder):
    if kind == "window":
        view = WindowDataset(store, 256)
    else:
        view = PackedDataset(store, 256, eot=1001, pad_id=1002)
    n = min(len(view), 64)
    idx = np.arange(n)
    want = [view[int(i)]["input_ids"].copy() for i in idx]
    kept = []
    for start in range(0, n, 16):
        batch = view.__getitems__(idx[start : start + 16].tolist())
        kept.append(HOLDERS[holder](batch.columns["input_ids"]))
        del batch
    for b, held in enumerate(kept):
        assert np.array_equal(_read(held), np.stack(want[16 * b : 16 * b + 16])), b
