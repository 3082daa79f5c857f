"""Where the documents of a list of arrays lie in memory, found in one pass with no Python work
per document.

Writing a list of numpy arrays to a file takes, per document, a buffer export in Python
(``os.pwritev``: ~40 ns, plus ~30 ns a C-level check of its dtype and ~30 of its ``ndim``) and
one iovec in the kernel (~100 ns more than a single large write).  :func:`array_iovecs` instead
reads the list object's item array and each array object's own fields (data address, dimensions,
strides, dtype object) with a numba kernel (:func:`mmpack.kernels.store.array_spans`, ~10 ns a
document; it holds the GIL, so no Python thread reshapes an array meanwhile), then merges
documents that follow each other in memory (slices of one array, the usual output of
``np.split``) into one iovec.  The offsets of those fields are CPython's and numpy's ABI (the
``PyList_GET_ITEM`` and ``PyArray_DATA``... macros compiled into every extension read them
there); :func:`layout_ok` checks them on live objects of several shapes with ``ctypes`` and runs
the kernel on them once, and where anything differs (another Python implementation, a
free-threaded build with another object header, a 32-bit build) this path is never used.  An
object is read past its header only once its type is exactly ``numpy.ndarray``; the caller holds
the list, so every array and its memory stay alive until the write is done.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

__all__ = ["array_iovecs", "layout_ok"]

_LAYOUT: bool | None = None


def layout_ok() -> bool:
    """Whether array objects have the field layout :func:`array_iovecs` reads (checked once)."""
    global _LAYOUT
    if _LAYOUT is None:
        try:
            _LAYOUT = _probe()
        except Exception:  # any surprise: never read objects' memory
            _LAYOUT = False
    return _LAYOUT


def _probe() -> bool:
    if sys.implementation.name != "cpython" or sys.maxsize != 2**63 - 1:
        return False
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False  # a free-threaded build: another object header
    from mmpack.kernels.store import array_spans

    base = np.arange(24, dtype=np.uint16)
    probes: list[Any] = [base, base[3:9], base[::2], base.reshape(4, 6), base[:1]]
    probes += [np.zeros(0, dtype=np.int64), np.arange(5, dtype=">u4"), [1, 2]]
    for a in probes:
        if not isinstance(a, np.ndarray):
            continue
        at = id(a)

        def word(addr: int) -> int:
            return ctypes.c_int64.from_address(addr).value

        if word(at + 8) != id(np.ndarray) or word(at + 16) != a.ctypes.data:
            return False
        if ctypes.c_int32.from_address(at + 24).value != a.ndim or word(at + 56) != id(a.dtype):
            return False
        for k in range(a.ndim):
            if word(word(at + 32) + 8 * k) != a.shape[k]:
                return False
            if word(word(at + 40) + 8 * k) != a.strides[k]:
                return False
    for k in range(len(probes)):  # a list's size and items
        rest = probes[k:]
        if ctypes.c_int64.from_address(id(rest) + 16).value != len(rest):
            return False
        items = ctypes.c_int64.from_address(id(rest) + 24).value
        if any(
            ctypes.c_int64.from_address(items + 8 * j).value != id(x) for j, x in enumerate(rest)
        ):
            return False
    addrs, nbytes = np.zeros(len(probes), np.int64), np.zeros(len(probes), np.int64)
    want = [0, 1, 2, 3, 4, 5, 6, 7]  # what the kernel must report from each start
    plain = {0, 1, 4}  # 1-D contiguous uint16
    for start in range(len(probes)):
        rest = probes[start:]
        got = int(
            array_spans(id(rest), id(np.ndarray), id(base.dtype), 2, addrs[: len(rest)], nbytes)
        )
        expect = next((j - start for j in want[start:] if j not in plain), -1)
        if got != expect:
            return False
        for j in range(start, start + (got if got >= 0 else len(probes) - start)):
            a = probes[j]
            if addrs[j - start] != a.ctypes.data or nbytes[j - start] != a.nbytes:
                return False
    return True


def array_iovecs(docs: list[Any], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """The iovecs of ``docs`` back to back and each document's size: ``(iov, nbytes)``, ``iov``
    uint64, shape (k, 2) (address, bytes; documents adjacent in memory merged, empty ones left
    out), ``nbytes`` int64, shape (len(docs),); None unless every document is a 1-D contiguous
    ``numpy.ndarray`` whose dtype is the very object ``dtype`` (the caller then checks them the
    slow way), or when :func:`layout_ok` is false."""
    if not docs or not layout_ok():
        return None
    from mmpack.kernels.store import array_spans

    held = docs if type(docs) is list else list(docs)
    n = len(held)
    addrs, nbytes = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    if array_spans(id(held), id(np.ndarray), id(dtype), dtype.itemsize, addrs, nbytes) >= 0:
        return None
    sizes = nbytes
    keep = nbytes > 0
    if not keep.all():
        addrs, nbytes = addrs[keep], nbytes[keep]
    if not addrs.size:
        return np.empty((0, 2), dtype=np.uint64), sizes
    follows = addrs[1:] == addrs[:-1] + nbytes[:-1]
    heads = np.flatnonzero(np.concatenate([[True], ~follows]))
    iov = np.empty((heads.size, 2), dtype=np.uint64)
    iov[:, 0] = addrs[heads]
    iov[:, 1] = np.add.reduceat(nbytes, heads)
    return iov, sizes
