"""Kernels of the store: offsets validation for huge indexes, the build's one pass over the
tokens (convert to the store's dtype while checking the token range), the block hash (XXH64) and
the pass that reads where a list's numpy arrays lie in memory (:func:`array_spans`).

:func:`convert_tokens` copies ``src`` into ``out`` (the store's dtype) in strips of 4096 tokens:
each strip is converted and range-checked without a branch per token (LLVM vectorises it), and
only a strip holding a bad value is scanned again for the first one.  :func:`xxh64` is Yann
Collet's XXH64 (the published algorithm, same digests as the ``xxhash`` package): four 64-bit
lanes, each consuming one little-endian word per 32-byte stripe with a multiply-rotate-multiply
round, then a merge and a final avalanche.  Every round is a bijection of its lane for a fixed
input word, so a change confined to one word always changes that lane; in general a corrupted
block goes unnoticed with probability about 2**-64 (CRC-32: 2**-32, but CRC-32 also guarantees to
catch every burst of up to 32 bits, which XXH64 does not promise).  Measured with the build
(``python -m benchmarks.bench_store``): see :mod:`mmpack.store.tokenfile`.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from mmpack.kernels._jit import njit

__all__ = ["array_spans", "convert_tokens", "copy_spans", "first_decrease", "xxh64"]


@njit
def first_decrease(offsets: np.ndarray) -> int:
    """Index ``j`` of the first ``offsets[j + 1] < offsets[j]``, or -1 if non-decreasing."""
    for j in range(offsets.shape[0] - 1):
        if offsets[j + 1] < offsets[j]:
            return j
    return -1


_STRIP = 4096


@njit
def convert_tokens(src: np.ndarray, out: np.ndarray, lo: Any, hi: Any) -> int:
    """Copy ``src`` into ``out[:src.size]`` (converting to ``out``'s dtype) up to the first value
    outside ``[lo, hi]``; return its index, or ``src.size`` when every value is in range.

    Parameters
    ----------
    src : numpy.ndarray
        1-D integer array, shape (n,).
    out : numpy.ndarray
        1-D unsigned array, shape (>= n,); ``out[:returned index]`` is written (a strip may be
        written further: the caller ignores what lies past the returned index).
    lo, hi : scalars of ``src``'s dtype
        The accepted range; the caller makes every value in it fit ``out``'s dtype.
    """
    n = src.shape[0]
    for a in range(0, n, _STRIP):
        s = src[a : min(a + _STRIP, n)]  # slices: unsigned indexes, so LLVM vectorises the loop
        o = out[a : a + s.shape[0]]
        mn = hi
        mx = lo
        for i in range(s.shape[0]):
            v = s[i]
            mn = min(mn, v)
            mx = max(mx, v)
            o[i] = v
        if mn < lo or mx > hi:
            for i in range(s.shape[0]):
                if s[i] < lo or s[i] > hi:
                    return a + i
    return n


_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)


@njit
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit
def _round(acc: np.uint64, word: np.uint64) -> np.uint64:
    return _rotl(acc + word * _P2, 31) * _P1


@njit
def _merge(acc: np.uint64, lane: np.uint64) -> np.uint64:
    return (acc ^ _round(np.uint64(0), lane)) * _P1 + _P4


@njit
def xxh64(data: np.ndarray, words: np.ndarray, seed: np.uint64) -> np.uint64:
    """XXH64 of the bytes ``data``.

    Parameters
    ----------
    data : numpy.ndarray
        uint8, shape (n,): the bytes.
    words : numpy.ndarray
        uint64, shape (n // 8,): the same bytes read as little-endian words (the caller's view
        of ``data``; the host is little-endian).
    seed : numpy.uint64
    """
    n = data.shape[0]
    w = 0
    if n >= 32:
        v1 = seed + _P1 + _P2
        v2 = seed + _P2
        v3 = seed
        v4 = seed - _P1
        stripes = n // 32
        for s in range(stripes):
            v1 = _round(v1, words[4 * s])
            v2 = _round(v2, words[4 * s + 1])
            v3 = _round(v3, words[4 * s + 2])
            v4 = _round(v4, words[4 * s + 3])
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(_merge(_merge(_merge(h, v1), v2), v3), v4)
        w = 4 * stripes
    else:
        h = seed + _P5
    h += np.uint64(n)
    p = 8 * w
    while p + 8 <= n:
        h ^= _round(np.uint64(0), words[w])
        h = _rotl(h, 27) * _P1 + _P4
        w += 1
        p += 8
    if p + 4 <= n:
        k = (
            np.uint64(data[p])
            | (np.uint64(data[p + 1]) << np.uint64(8))
            | (np.uint64(data[p + 2]) << np.uint64(16))
            | (np.uint64(data[p + 3]) << np.uint64(24))
        )
        h ^= k * _P1
        h = _rotl(h, 23) * _P2 + _P3
        p += 4
    while p < n:
        h ^= np.uint64(data[p]) * _P5
        h = _rotl(h, 11) * _P1
        p += 1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


# ------------------------------------------------------------------ numpy arrays' own fields
# Offsets in 64-bit CPython objects: a list's ob_size 16 and ob_item 24 (the PyList_GET_SIZE and
# PyList_GET_ITEM macros), and numpy's PyArrayObject_fields (numpy's ABI: the PyArray_DATA...
# macros compiled into every extension read them there): ob_type 8, data 16, nd 24 (C int),
# dimensions 32, strides 40, descr 56.  The caller checks them on live objects first
# (:func:`mmpack.store.spans.layout_ok`) and never calls the kernel otherwise.
_LIST_SIZE, _LIST_ITEMS = 16, 24
_OB_TYPE, _DATA, _ND, _DIMS, _STRIDES, _DESCR = 8, 16, 24, 32, 40, 56


def _word_typed(typingctx: Any, addr: Any) -> Any:
    """The int64 stored at address ``addr`` (an int64)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = builder.inttoptr(args[0], cgutils.voidptr_t)
        i64 = context.get_value_type(types.int64)
        return builder.load(builder.bitcast(ptr, i64.as_pointer()))

    return types.int64(types.int64), codegen


def _int32_typed(typingctx: Any, addr: Any) -> Any:
    """The int32 stored at address ``addr`` (an int64), as int64."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptr = builder.inttoptr(args[0], cgutils.voidptr_t)
        i32 = context.get_value_type(types.int32)
        value = builder.load(builder.bitcast(ptr, i32.as_pointer()))
        return builder.sext(value, context.get_value_type(types.int64))

    return types.int64(types.int64), codegen


def _word_py(addr: int) -> int:
    import ctypes

    return int(ctypes.c_int64.from_address(addr).value)


def _int32_py(addr: int) -> int:
    import ctypes

    return int(ctypes.c_int32.from_address(addr).value)


# Kernels run as Python under NUMBA_DISABLE_JIT=1: they then read the same words with ctypes.
_NO_JIT = bool(getattr(numba.config, "DISABLE_JIT", False))
_word: Any = _word_py if _NO_JIT else intrinsic(_word_typed)
_int32: Any = _int32_py if _NO_JIT else intrinsic(_int32_typed)


# Holds the GIL (unlike every other kernel): no Python thread may reshape an array or change the
# list while their fields are read.
@numba.njit(cache=True, nogil=False)
def array_spans(
    list_addr: int,
    type_addr: int,
    descr_addr: int,
    itemsize: int,
    addrs: np.ndarray,
    nbytes: np.ndarray,
) -> int:
    """The memory of each array of a list, read from the list and array objects themselves.

    Parameters
    ----------
    list_addr : int
        ``id()`` of a ``list`` (exactly) of ``addrs.shape[0]`` objects, held by the caller.
    type_addr : int
        ``id(numpy.ndarray)``: an object of another type is reported, its fields never read.
    descr_addr : int
        ``id()`` of the expected dtype object.
    itemsize : int
    addrs, nbytes : numpy.ndarray
        int64, shape (n,): written with each array's data address and size in bytes.

    Returns
    -------
    int
        -1, or the index of the first object that is not a 1-D contiguous ``numpy.ndarray``
        with that very dtype object (``addrs``/``nbytes`` are then written up to it only); 0
        when the list does not hold ``n`` objects.
    """
    n = addrs.shape[0]
    if _word(list_addr + _LIST_SIZE) != n:
        return 0
    items = _word(list_addr + _LIST_ITEMS)
    for i in range(n):
        obj = _word(items + 8 * i)
        if _word(obj + _OB_TYPE) != type_addr or _word(obj + _DESCR) != descr_addr:
            return i
        if _int32(obj + _ND) != 1:
            return i
        size = _word(_word(obj + _DIMS))
        if size > 1 and _word(_word(obj + _STRIDES)) != itemsize:
            return i
        addrs[i] = _word(obj + _DATA)
        nbytes[i] = size * itemsize
    return -1


def _bytes_at_typed(typingctx: Any, addr: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))

    return types.CPointer(types.uint8)(types.int64), codegen


def _bytes_at_py(addr: int) -> int:  # NUMBA_DISABLE_JIT: numba.carray then reads via ctypes
    import ctypes

    return ctypes.cast(int(addr), ctypes.POINTER(ctypes.c_uint8))  # type: ignore[return-value]


_bytes_at: Any = _bytes_at_py if _NO_JIT else intrinsic(_bytes_at_typed)


# Holds the GIL, like array_spans: no Python thread frees or reshapes an array while it is read.
@numba.njit(cache=True, nogil=False)
def copy_spans(iov: np.ndarray, state: np.ndarray, out: np.ndarray) -> int:
    """Copy the memory ranges ``iov`` back to back into ``out``, from where ``state`` says.

    Parameters
    ----------
    iov : numpy.ndarray
        int64, shape (k, 2): (address, bytes) of live memory (numpy arrays the caller holds;
        from :func:`array_spans`).
    state : numpy.ndarray
        int64, shape (2,): the row and the bytes of it already copied; advanced in place.
    out : numpy.ndarray
        uint8, shape (m,): filled from its start.

    Returns
    -------
    int
        The bytes written into ``out`` (``m`` unless the ranges ran out).
    """
    row, skip = state[0], state[1]
    pos = 0
    m = out.shape[0]
    while row < iov.shape[0] and pos < m:
        take = min(iov[row, 1] - skip, m - pos)
        src = numba.carray(_bytes_at(iov[row, 0] + skip), (take,))
        dst = out[pos : pos + take]
        for j in range(take):
            dst[j] = src[j]
        pos += take
        skip += take
        if skip == iov[row, 1]:
            row += 1
            skip = 0
    state[0] = row
    state[1] = skip
    return pos
