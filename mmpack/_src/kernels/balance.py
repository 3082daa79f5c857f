"""Dealing a step's samples to ranks so that the costliest rank costs as little as it can.

A *group* is the ``m * W`` samples of one step (``W`` ranks, ``m`` samples each, ``m`` the batch
size except in an epoch's last, partial step), each with an integer cost.  :func:`deal_groups`
gives every sample of every group its rank, every rank exactly ``m`` samples of the group:

1. longest processing time first under the cardinality constraint: samples in decreasing cost
   (ties: lower slot first), each to the least loaded rank that holds fewer than ``m`` (ties:
   lower rank);
2. improvement: while some swap of a sample of the most loaded rank (ties: lower rank) with a
   cheaper sample of another rank makes both their loads smaller than the largest, the swap that
   leaves the smaller of the two new maxima is made (ties: first found in slot order).  Every
   swap lowers the sorted vector of loads lexicographically, so the loop ends; it is also
   capped at ``4 * m * W`` swaps.

With ``m = 2`` step 1 alone pairs the ``i``-th costliest sample with the ``i``-th cheapest, which
minimises the largest pair (the classic exchange argument), so the result is optimal; with
``m = 1`` every dealing is.  Cost: ``O(k log k + k W)`` for step 1 of a group of ``k``
samples, ``O(m k)`` per swap of step 2.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["deal_groups"]


@njit
def _deal_group(costs: np.ndarray, world_size: int, owner: np.ndarray) -> None:
    """Deal one group (``costs`` int64, (m * W,)) into ``owner`` (int64, same shape)."""
    k = costs.shape[0]
    m = k // world_size
    load = np.zeros(world_size, dtype=np.int64)
    held = np.zeros(world_size, dtype=np.int64)
    order = np.argsort(-costs, kind="mergesort")
    for t in range(k):
        s = order[t]
        best = -1
        for r in range(world_size):
            if held[r] < m and (best < 0 or load[r] < load[best]):
                best = r
        owner[s] = best
        load[best] += costs[s]
        held[best] += 1
    for _ in range(4 * k):
        top = 0
        for r in range(1, world_size):
            if load[r] > load[top]:
                top = r
        peak = load[top]
        best_a = -1
        best_b = -1
        best_max = peak
        for a in range(k):
            if owner[a] != top:
                continue
            for b in range(k):
                other = owner[b]
                if other == top or costs[b] >= costs[a]:
                    continue
                delta = costs[a] - costs[b]
                new_max = max(peak - delta, load[other] + delta)
                if new_max < best_max:
                    best_max = new_max
                    best_a = a
                    best_b = b
        if best_a < 0:
            return
        other = owner[best_b]
        delta = costs[best_a] - costs[best_b]
        load[top] -= delta
        load[other] += delta
        owner[best_a] = other
        owner[best_b] = top


@njit
def deal_groups(costs: np.ndarray, group_ptr: np.ndarray, world_size: int) -> np.ndarray:
    """The rank of every sample of consecutive groups.

    Parameters
    ----------
    costs : numpy.ndarray, int64, shape (k,)
        Every group's sample costs, ``>= 0``, group ``g`` at ``group_ptr[g]:group_ptr[g + 1]``.
    group_ptr : numpy.ndarray, int64, shape (G + 1,)
        ``0 = p_0 <= p_1 <= ... = k``, each group's size a multiple of ``world_size``.
    world_size : int
        ``W >= 1``.

    Returns
    -------
    numpy.ndarray, int64, shape (k,)
        ``owner[s]``: the rank of sample ``s``; each rank holds ``size / W`` of each group.
    """
    owner = np.empty(costs.shape[0], dtype=np.int64)
    for g in range(group_ptr.shape[0] - 1):
        lo = group_ptr[g]
        hi = group_ptr[g + 1]
        if hi > lo:
            _deal_group(costs[lo:hi], world_size, owner[lo:hi])
    return owner
