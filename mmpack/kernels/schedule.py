"""Kernels of :mod:`mmpack.sampling.schedule_plan`: lookups in a mixture drawn as a chain of runs.

A *run* ``j`` covers mixture positions ``[starts[j], starts[j + 1])`` (the last one has no end)
and repeats one period of the chairman sequence of its quotas ``quotas[j]`` (period
``periods[j]``) from its draw ``phases[j]``: position ``starts[j] + r`` is draw ``phases[j] + r``
of the periodic sequence, and its occurrence is ``base[j, k]`` plus the draws of ``k`` before
that draw.  Every run's table (``seq``, ``ckpt`` of :func:`mmpack.kernels.mixture.build_period`) lies in
one concatenated array: ``seq_all[seq_off[j]:seq_off[j] + periods[j]]`` and the checkpoint rows
``ckpt_all[ckpt_off[j]:...]``.  Runs with equal quotas share a table.

Position ``i`` is found by a binary search over ``starts`` (skipped when ``i`` falls in the run of
the previous position, the usual case in a batch of consecutive positions), then the lookup of
:func:`mmpack.kernels.mixture.locate_many` inside the run.  Cost: O(log S + B) per position, S runs.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["locate_runs", "run_counts"]


@njit
def _run_of(i: int, starts: np.ndarray, guess: int) -> int:
    """The run holding position ``i >= 0``: the last ``j`` with ``starts[j] <= i``."""
    n_runs = starts.size
    if starts[guess] <= i and (guess + 1 == n_runs or i < starts[guess + 1]):
        return guess
    lo = 0
    hi = n_runs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= i:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit
def locate_runs(
    idx: np.ndarray,
    starts: np.ndarray,
    phases: np.ndarray,
    periods: np.ndarray,
    quotas: np.ndarray,
    base: np.ndarray,
    seq_off: np.ndarray,
    ckpt_off: np.ndarray,
    seq_all: np.ndarray,
    ckpt_all: np.ndarray,
    block: int,
    out_src: np.ndarray,
    out_occ: np.ndarray,
) -> None:
    """Source and occurrence number of mixture positions.

    Parameters
    ----------
    idx : int64, shape (m,)
        Positions, ``idx >= 0``.
    starts, phases, periods, seq_off, ckpt_off : int64, shape (S,)
        ``starts[0] == 0``, strictly increasing; ``0 <= phases < periods``.
    quotas, base : int64, shape (S, K)
        ``base[j]``: the counts entering run ``j`` minus its table's counts before draw
        ``phases[j]``.
    seq_all : uint8 or int32, shape (sum of table periods,)
    ckpt_all : int32, shape (sum of table rows, K)
    block : int
        Checkpoint spacing of the tables.
    out_src, out_occ : int64, shape (m,)
        Out: the source of ``idx[t]`` and how many earlier positions drew it.
    """
    j = 0
    for t in range(idx.size):
        i = idx[t]
        j = _run_of(i, starts, j)
        r = i - starts[j] + phases[j]
        period = periods[j]
        cycle = r // period
        r -= cycle * period
        k = np.int64(seq_all[seq_off[j] + r])
        b = r // block
        total = np.int64(ckpt_all[ckpt_off[j] + b, k])
        off = seq_off[j]
        for u in range(b * block, r):
            if seq_all[off + u] == k:
                total += 1
        out_src[t] = k
        out_occ[t] = base[j, k] + cycle * quotas[j, k] + total


@njit
def run_counts(
    n: int,
    starts: np.ndarray,
    phases: np.ndarray,
    periods: np.ndarray,
    quotas: np.ndarray,
    base: np.ndarray,
    seq_off: np.ndarray,
    ckpt_off: np.ndarray,
    seq_all: np.ndarray,
    ckpt_all: np.ndarray,
    block: int,
    out: np.ndarray,
) -> None:
    """``out[k]`` = draws of source ``k`` among positions ``[0, n)`` (``n >= 0``); ``out``: int64
    (K,); the other arguments as in :func:`locate_runs`."""
    j = _run_of(n, starts, 0)
    r = n - starts[j] + phases[j]
    period = periods[j]
    cycle = r // period
    r -= cycle * period
    b = r // block
    for k in range(out.size):
        out[k] = base[j, k] + cycle * quotas[j, k] + ckpt_all[ckpt_off[j] + b, k]
    off = seq_off[j]
    for u in range(b * block, r):
        out[seq_all[off + u]] += 1
