"""Kernels of :mod:`mmpack._src.sampling.mixture`: one period of Tijdeman's chairman sequence, and lookups in it.

A period is ``P`` draws among ``K`` sources with integer quotas ``c`` (``sum(c) == P``).  Draw
``n = 1, 2, ..., P`` goes, among the sources whose deficit ``n c_k / P - count_k`` is at least
``s = 1 / (2 K' - 2)`` (``K'`` = number of sources with ``c_k > 0``), to the one whose deadline
``(count_k + 1 - s) P / c_k`` comes first; equal deadlines go to the smallest ``k``.  Tijdeman
(1980) proved this keeps ``|n c_k / P - count_k| <= 1 - s`` for every prefix, so after ``P`` draws
every count is exactly ``c_k`` and the sequence repeats with period ``P``.  All comparisons are exact
int64 arithmetic (``P <= 10**6``, ``K' <= 2**20``).

Random access: ``seq`` (shape (P,)) holds the source of each draw and ``ckpt`` (shape
(P // B + 1, K), int32) the per-source counts before draws ``0, B, 2B, ...``; position ``r`` of a
period is located by a checkpoint read plus a scan of at most ``B`` entries of ``seq``.

Cost: building a period is O(P K) (about 10 ms for P = 10**6, K = 8); a lookup is O(B); finding
the position of the ``t``-th draw of a source is O(log(P / B) + B).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = [
    "build_period",
    "locate_many",
    "max_prefix_error",
    "occurrence_position",
    "prefix_counts",
]


@njit
def build_period(c: np.ndarray, period: int, block: int, seq: np.ndarray, ckpt: np.ndarray) -> None:
    """Fill one period of the chairman sequence.

    Parameters
    ----------
    c : int64, shape (K,)
        Quotas, ``c >= 0``, ``sum(c) == period``, at least one positive.
    period : int
    block : int
        Checkpoint spacing ``B``.
    seq : uint8 or int32, shape (period,)
        Out: source of each draw.
    ckpt : int32, shape (period // block + 1, K)
        Out: ``ckpt[b, k]`` = draws of ``k`` among the first ``b * block``.
    """
    n_src = c.size
    n_pos = 0
    for k in range(n_src):
        if c[k] > 0:
            n_pos += 1
    m = 2 * n_pos - 2  # s = 1 / m; with a single source m = 0 and every test below passes
    count = np.zeros(n_src, np.int64)
    for n in range(1, period + 1):
        if (n - 1) % block == 0:
            b = (n - 1) // block
            for k in range(n_src):
                ckpt[b, k] = count[k]
        best = -1
        for k in range(n_src):
            if c[k] == 0:
                continue
            if (n * c[k] - period * count[k]) * m < period:
                continue
            if best < 0 or ((count[k] + 1) * m - 1) * c[best] < ((count[best] + 1) * m - 1) * c[k]:
                best = k
        if best < 0:  # unreachable by Tijdeman's theorem; fall back to the largest deficit
            top = np.int64(0)
            for k in range(n_src):
                if c[k] > 0 and (best < 0 or n * c[k] - period * count[k] > top):
                    best = k
                    top = n * c[k] - period * count[k]
        seq[n - 1] = best
        count[best] += 1
    if period % block == 0:
        b = period // block
        for k in range(n_src):
            ckpt[b, k] = count[k]


@njit
def _rank_in_period(
    r: int, k: int | np.int64, seq: np.ndarray, ckpt: np.ndarray, block: int
) -> np.int64:
    """Draws of source ``k`` among the first ``r`` draws of a period (``0 <= r < P``)."""
    b = r // block
    total = np.int64(ckpt[b, k])
    for t in range(b * block, r):
        if seq[t] == k:
            total += 1
    return total


@njit
def locate_many(
    idx: np.ndarray,
    c: np.ndarray,
    period: int,
    block: int,
    seq: np.ndarray,
    ckpt: np.ndarray,
    out_src: np.ndarray,
    out_occ: np.ndarray,
) -> None:
    """Source and occurrence number of mixture positions.

    ``out_src[t]`` is the source of position ``idx[t]`` and ``out_occ[t]`` how many earlier positions
    drew the same source.  ``idx``, ``out_src``, ``out_occ``: int64, shape (m,), ``idx >= 0``.
    """
    for t in range(idx.size):
        i = idx[t]
        cycle = i // period
        r = i - cycle * period
        k = np.int64(seq[r])
        out_src[t] = k
        out_occ[t] = cycle * c[k] + _rank_in_period(r, k, seq, ckpt, block)


@njit
def prefix_counts(
    n: int,
    c: np.ndarray,
    period: int,
    block: int,
    seq: np.ndarray,
    ckpt: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[k]`` = draws of source ``k`` among mixture positions ``[0, n)``; ``out``: int64 (K,)."""
    cycle = n // period
    r = n - cycle * period
    b = r // block
    for k in range(c.size):
        out[k] = cycle * c[k] + ckpt[b, k]
    for t in range(b * block, r):
        out[seq[t]] += 1


@njit
def occurrence_position(
    k: int, occ: int, c: np.ndarray, period: int, block: int, seq: np.ndarray, ckpt: np.ndarray
) -> int:
    """Mixture position of the draw number ``occ`` (0-based) of source ``k`` (``c[k] > 0``)."""
    cycle = occ // c[k]
    target = occ - cycle * c[k]
    lo = 0
    hi = ckpt.shape[0] - 1
    if (hi * block) >= period:
        hi -= 1  # the last checkpoint row may describe the end of the period, not a block start
    while lo < hi:  # last block whose starting count is <= target
        mid = (lo + hi + 1) // 2
        if ckpt[mid, k] <= target:
            lo = mid
        else:
            hi = mid - 1
    seen = np.int64(ckpt[lo, k])
    t = lo * block
    while t < period:
        if seq[t] == k:
            if seen == target:
                break
            seen += 1
        t += 1
    return cycle * period + t


@njit
def max_prefix_error(c: np.ndarray, period: int, seq: np.ndarray, limit: int) -> np.int64:
    """Largest ``|n c_k - period * count_k(n)|`` over ``1 <= n <= limit <= period`` and all ``k``.

    Divide by ``period`` for the error in samples.  Returns int64.
    """
    count = np.zeros(c.size, np.int64)
    worst = np.int64(0)
    for n in range(1, limit + 1):
        count[seq[n - 1]] += 1
        for k in range(c.size):
            e = abs(n * c[k] - period * count[k])
            if e > worst:
                worst = e
    return worst
