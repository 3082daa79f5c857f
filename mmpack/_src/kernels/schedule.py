"""Kernels of :mod:`mmpack._src.sampling.schedule_plan`: lookups in a mixture whose positions are dealt
by nested two-way splits of the schedule's integral.

The plan is four arrays.  ``epochs`` (int64, (E, 2)): the first position and the root node of
the schedule and of each change of it.  ``nodes`` (int64, (N, 4)): per internal node of the
split trees, ``[left, right, first row, number of rows]``; a child ``c >= 0`` is internal node
``c``, ``c < 0`` is source ``-c - 1``.  ``rows`` (float64, (R, ROW)) with ``levels`` (int64,
(R,)): a node's rows cover its count ``m`` from ``levels[r]`` to the next row's; a row is one
stretch of the schedule's axis on which the node's density and the density of its *computed*
child (the smaller one there) are linear: ``side`` (which child is computed), the length ``L``,
``G0`` / ``g0`` / ``gam`` (the node's integral, density and slope at the start), ``A0`` / ``a0``
/ ``alpha`` (the computed child's), ``A1`` / ``a1`` (its integral and density at the end).

The computed child's count at node count ``m`` is ``floor(Phi(m) + 1/2)``, ``Phi(m) = A(u(m))``:
the child's integral where the node's integral reaches ``m``.  Every floating-point operation is
monotone in ``m`` (sums of non-negative terms), so ``Phi`` is non-decreasing as computed, and it
grows by at most 1/2 per count: each count of the node adds 0 or 1 to each child.  The plan
checks the row switches at construction.

Cost: a position is located by one descent of its epoch's tree (depth ``ceil(log2 K)`` for
balanced weights), each level a binary search over the node's rows and two evaluations of
``Phi``; counts at a position are one evaluation per internal node.  Memory: ``ROW`` float64 per
row, rows O(segments) per node.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["ROW", "row_count", "split_counts", "split_locate", "split_positions"]

ROW = 10
"""Float64 values per row: side, L, G0, g0, gam, A0, a0, alpha, A1, a1."""


@njit
def _row_of(levels: np.ndarray, first: int, n_rows: int, m: int, guess: int) -> int:
    """The row of a node applying to count ``m``: the last of its rows with ``levels <= m``
    (``guess``, a row of the node, is tried first)."""
    last = first + n_rows - 1
    if levels[guess] <= m and (guess == last or m < levels[guess + 1]):
        return guess
    lo = first
    hi = last
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if levels[mid] <= m:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit
def row_count(rows: np.ndarray, r: int, m: int) -> np.int64:
    """Count of the *left* child of the node of row ``r`` when the node's count is ``m``."""
    y = float(m)
    big_l = rows[r, 1]
    z = y - rows[r, 2]
    if z < 0.0:
        z = 0.0
    g0 = rows[r, 3]
    gam = rows[r, 4]
    if z == 0.0 or (g0 == 0.0 and gam == 0.0):
        u = 0.0
    elif gam == 0.0:
        u = z / g0
    elif gam > 0.0:
        q = g0 / z
        u = 2.0 / (q + np.sqrt(q * q + 2.0 * gam / z))
    else:
        s = g0 * g0 + 2.0 * gam * z
        if s < 0.0:
            s = 0.0
        u = 2.0 * z / (g0 + np.sqrt(s))
    alpha = rows[r, 7]
    if alpha >= 0.0:
        phi = rows[r, 5] + u * (rows[r, 6] + 0.5 * alpha * u)
    else:
        v = big_l - u
        if v < 0.0:
            v = 0.0
        phi = rows[r, 8] - v * (rows[r, 9] - 0.5 * alpha * v)
    c = np.int64(np.floor(phi + 0.5))
    if rows[r, 0] == 0.0:
        return c
    return np.int64(m) - c


@njit
def _left_count(
    nodes: np.ndarray, levels: np.ndarray, rows: np.ndarray, g: int, m: int
) -> np.int64:
    r = _row_of(levels, nodes[g, 2], nodes[g, 3], m, nodes[g, 2])
    return row_count(rows, r, m)


@njit
def _epoch_of(epochs: np.ndarray, i: int) -> int:
    """The last epoch whose start (``epochs[e, 0]``) is ``<= i``."""
    lo = 0
    hi = epochs.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if epochs[mid, 0] <= i:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit
def split_locate(
    idx: np.ndarray,
    epochs: np.ndarray,
    nodes: np.ndarray,
    levels: np.ndarray,
    rows: np.ndarray,
    work: np.ndarray,
    out_src: np.ndarray,
    out_occ: np.ndarray,
) -> None:
    """Source and occurrence number of mixture positions.

    Parameters
    ----------
    idx : int64, shape (m,)
        Positions, ``0 <= idx < 2**62``.
    epochs : int64, shape (E, 2)
        ``[first position, root node]`` of each epoch (a schedule and every change of it),
        starts strictly increasing from 0.
    nodes, levels, rows
        The plan's tables (module docstring).
    work : int64, shape (N, 3)
        Scratch: per node, the row it last used and its last count asked for with the left
        child's count there.
    out_src, out_occ : int64, shape (m,)
        Out: the source of ``idx[t]`` and how many earlier positions drew it.
    """
    for g in range(nodes.shape[0]):
        work[g, 0] = nodes[g, 2]
        work[g, 1] = -1
    for t in range(idx.size):
        i = idx[t]
        g = epochs[_epoch_of(epochs, i), 1]
        m = i
        while True:
            first = nodes[g, 2]
            n_rows = nodes[g, 3]
            r = _row_of(levels, first, n_rows, m, work[g, 0])
            work[g, 0] = r
            if work[g, 1] == m:  # the previous position of a run asked for m + 1 here
                left0 = work[g, 2]
            else:
                left0 = row_count(rows, r, m)
            if r + 1 < first + n_rows and levels[r + 1] <= m + 1:
                r = _row_of(levels, first, n_rows, m + 1, r)
            left1 = row_count(rows, r, m + 1)
            work[g, 1] = m + 1
            work[g, 2] = left1
            if left1 > left0:
                child = nodes[g, 0]
                m = left0
            else:
                child = nodes[g, 1]
                m = m - left0
            if child < 0:
                out_src[t] = -child - 1
                out_occ[t] = m
                break
            g = child


@njit
def split_counts(
    n: int,
    epochs: np.ndarray,
    nodes: np.ndarray,
    levels: np.ndarray,
    rows: np.ndarray,
    work: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[k]`` = draws of source ``k`` among positions ``[0, n)`` (``0 <= n < 2**62``).

    The internal nodes of an epoch are numbered parents first, from its root; ``work`` (int64,
    (N,)) is scratch space.  ``out``: int64 (K,).
    """
    e = _epoch_of(epochs, n)
    root = epochs[e, 1]
    stop = epochs[e + 1, 1] if e + 1 < epochs.shape[0] else nodes.shape[0]
    work[root] = n
    for g in range(root, stop):
        m = work[g]
        left = _left_count(nodes, levels, rows, g, m)
        for side in range(2):
            child = nodes[g, side]
            c = left if side == 0 else m - left
            if child < 0:
                out[-child - 1] = c
            else:
                work[child] = c


@njit
def split_positions(
    k: int,
    occ: np.ndarray,
    start: int,
    limit: int,
    epochs: np.ndarray,
    nodes: np.ndarray,
    levels: np.ndarray,
    rows: np.ndarray,
    work: np.ndarray,
    counts: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[t]``: the position of draw number ``occ[t]`` of source ``k`` (the smallest ``p`` with
    more than ``occ[t]`` draws of ``k`` among ``[0, p + 1)``), searched in ``[start, limit)``, or
    -1 when it has no such draw.  Binary search over positions; ``work``, ``counts`` as in :func:`split_counts`."""
    for t in range(occ.size):
        lo = start
        hi = limit
        while lo < hi:
            mid = lo + (hi - lo) // 2
            split_counts(mid + 1, epochs, nodes, levels, rows, work, counts)
            if counts[k] > occ[t]:
                hi = mid
            else:
                lo = mid + 1
        out[t] = lo if lo < limit else -1
