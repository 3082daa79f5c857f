"""Reusable output buffers for batched gathers.

A fresh multi-megabyte ``np.empty`` is served by ``mmap`` and every one of its pages faults on
first write; for a batch of 128 x 2048 int64 windows that cost several times the copy itself
(measured while writing this module: window batches at ~60M tokens/s with fresh arrays, ~600M
with pooled ones; page faults are expensive on this VM).  A view never hands out
memory that someone still uses: a pooled array is reused only when nothing outside the pool
refers to it (its reference count shows only the pool's own references), so samples returned
earlier and still alive are never overwritten.  Everything that reads an array's memory holds a
reference to it: a numpy view (its ``base``), a memoryview, a DLPack capsule, a tensor made with
``torch.from_numpy`` and that tensor's own ``.numpy()``.  What the pool's own references read as
is measured once, by the same function that checks the arrays (interpreters differ in the
references they take for a call).
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

__all__ = ["BufferPool"]


def _reference_counts(arrays: list[np.ndarray]) -> list[int]:
    """``sys.getrefcount`` of each array, read the same way for the pool and its calibration."""
    counts = []
    for arr in arrays:
        counts.append(sys.getrefcount(arr))
    return counts


# What an array that only the pool's list holds reads as (3 on CPython 3.10-3.13: the list, the
# loop variable and getrefcount's argument).
_FREE_REFCOUNT = _reference_counts([np.empty(1)])[0]


class BufferPool:
    """A few reusable arrays per (shape, dtype); thread-safe; never pickled (see ``__reduce__``)."""

    def __init__(self, max_per_key: int = 4, min_bytes: int = 1 << 17) -> None:
        self.max_per_key = max_per_key
        self.min_bytes = min_bytes
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised array, reused from the pool when one of this shape is unreferenced."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dtype)  # malloc serves small arrays without faults
        key = (shape, dtype.str)
        with self._lock:
            arrays = self._free.setdefault(key, [])
            for arr, count in zip(arrays, _reference_counts(arrays)):
                if count == _FREE_REFCOUNT:
                    return arr
            arr = np.empty(shape, dtype=dtype)
            if len(arrays) >= self.max_per_key:
                arrays.pop(0)
            arrays.append(arr)
            return arr

    def __reduce__(self):
        return (BufferPool, (self.max_per_key, self.min_bytes))
