"""Kernels of the store: offsets validation for huge indexes, the build's one pass over the
tokens (convert to the store's dtype while checking the token range) and the block hash (XXH64;
:func:`xxh64_stripes`: one digest per block of a run in one call).

:func:`convert_tokens` copies ``src`` into ``out`` (the store's dtype) in strips of 4096 tokens:
each strip is converted and range-checked without a branch per token (LLVM vectorises it), and
only a strip holding a bad value is scanned again for the first one.  :func:`xxh64` is Yann
Collet's XXH64 (the published algorithm, same digests as the ``xxhash`` package): four 64-bit
lanes, each consuming one little-endian word per 32-byte stripe with a multiply-rotate-multiply
round, then a merge and a final avalanche.  Every round is a bijection of its lane for a fixed
input word, so a change confined to one word always changes that lane; in general a corrupted
block goes unnoticed with probability about 2**-64.  Cost: ``python -m benchmarks.bench_store
--profile`` (a 16 MiB stripe) and ``python -m benchmarks.bench_block_fetch`` (16 KiB pages, alone
and in one call); docs/benchmarks.md, "Checksums".

:func:`check_ranges` hashes, for the remote node cache, each present page of a batch's token
ranges not checked yet, in one call for the whole batch.  It lives here because it calls
:func:`xxh64` (a jitted function calls only jitted functions of its own module: numba's cache
does not follow callees across files).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["check_ranges", "convert_tokens", "first_decrease", "xxh64", "xxh64_stripes"]


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


@njit
def xxh64_stripes(data: np.ndarray, words: np.ndarray, block: int, out: np.ndarray) -> None:
    """XXH64 (seed 0) of each ``block`` bytes of ``data`` (the last block may be short).

    Parameters
    ----------
    data : numpy.ndarray
        uint8, shape (n,).
    words : numpy.ndarray
        uint64, shape (n // 8,): ``data`` read as little-endian words.
    block : int
        Bytes per block, a positive multiple of 8 (checked by the caller).
    out : numpy.ndarray
        uint64, shape (ceil(n / block),): the digests, written here.
    """
    n = data.shape[0]
    for k in range(out.shape[0]):
        lo = k * block
        hi = min(lo + block, n)
        out[k] = xxh64(data[lo:hi], words[lo // 8 : hi // 8], np.uint64(0))


@njit
def check_ranges(
    data: np.ndarray,
    words: np.ndarray,
    state: np.ndarray,
    digests: np.ndarray,
    checked: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    itemsize: int,
    shift: int,
    bad: np.ndarray,
) -> int:
    """Check the present, unchecked pages that token ranges ``[starts[k], starts[k] +
    lengths[k])`` touch, each once: page ``b`` (bytes ``[b << shift, min((b + 1) << shift,
    data.size))``) with ``state[b] == 1`` and ``checked[b] == 0`` gets ``checked[b] = 1`` when
    its XXH64 equals ``digests[b]``, else ``checked[b] = 2`` and its id is written to ``bad``
    (as far as ``bad`` has room).  Returns the number of ids written to ``bad``.

    ``data``: uint8, (nbytes,); ``words``: uint64, (nbytes // 8,), the same bytes as
    little-endian words (``shift >= 3``: each page starts on a word); ``state``, ``checked``:
    uint8 and ``digests``: uint64, (npages,) with ``npages = ceil(nbytes / 2**shift)``;
    ``starts``, ``lengths``: int64, (k,); ``bad``: int64.  Empty ranges, ranges starting before
    0 and pages past ``npages`` are skipped, never read."""
    n = data.shape[0]
    last_page = state.shape[0] - 1
    nb = 0
    for k in range(starts.shape[0]):
        length = lengths[k]
        lo = starts[k] * itemsize
        if length <= 0 or lo < 0:
            continue
        first = lo >> shift
        last = min((lo + length * itemsize - 1) >> shift, last_page)
        for b in range(first, last + 1):
            if checked[b] != 0 or state[b] != 1:
                continue
            blo = b << shift
            if blo >= n:
                continue
            bhi = min(blo + (1 << shift), n)
            w = blo >> 3
            if xxh64(data[blo:bhi], words[w : w + ((bhi - blo) >> 3)], np.uint64(0)) == digests[b]:
                checked[b] = 1
            else:
                checked[b] = 2
                if nb < bad.shape[0]:
                    bad[nb] = b
                    nb += 1
    return nb
