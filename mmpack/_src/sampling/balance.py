"""Balanced dealing: each step's global batch dealt to the ranks by attention cost.

Without balance, rank ``r`` of ``W`` takes stream indices ``base + r, base + r + W, ...``
(:mod:`mmpack._src.sampling.dealing`), so its batch ``t`` of ``B`` samples holds stream indices
``base + (t B + j) W + r``, ``j < B``.  With a :class:`Balance`, step ``t``'s *group*, the
``B W`` stream indices ``base + t B W .. base + (t + 1) B W - 1`` (the same samples as without
it; in an epoch's last step the ``m W`` that remain), is dealt by cost instead:
:func:`mmpack._src.kernels.balance.deal_groups` gives every rank exactly ``m`` of the group's samples
so that the largest per-rank cost is as small as that rule finds (optimal for ``B <= 2``), and
rank ``r``'s batch ``t`` is its samples of group ``t`` in stream order.

A sample's cost is its causal attention's, ``sum(s**2)`` over the segments of its row, given by
the view without reading a token (``view.attention_cost(indices)``).  The dealing of a step is a
pure function of the samples it draws (``seed``, epoch, step, ``W``): every rank computes it
alone, with no communication, and a resume at the same world size continues exactly; at another
world size the rest is dealt for the new ``W`` (a state taken at a step boundary).

Cost: per step, ``B W`` cost lookups (vectorised, ``O(pieces)``) and one kernel call,
``O(k log k + k W)`` for ``k = B W`` plus its improvement swaps; against each step's optimum:
``python -m benchmarks.bench_balance``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mmpack._src.core.validation import check_positive_int
from mmpack._src.kernels.balance import deal_groups

__all__ = [
    "Balance",
    "attention_costs",
    "balanced_positions",
    "balanced_resume",
    "deal_balanced",
    "largest_load",
    "rank_slots",
]


class Balance:
    """What a balanced dealing needs: the samples' costs and the per-rank batch size.

    Parameters
    ----------
    costs : callable
        ``costs(indices)`` for ``indices`` (int64, (k,)) of the dataset returns their costs
        (integers ``>= 0``, shape (k,)): e.g. a view's ``attention_cost``.
    batch_size : int
        Samples per rank per step, ``>= 1``.
    """

    __slots__ = ("batch_size", "costs")

    def __init__(self, costs: Callable[[np.ndarray], Any], batch_size: int) -> None:
        if not callable(costs):
            raise TypeError(f"costs must be callable, got {type(costs).__name__} {costs!r}")
        self.costs = costs
        self.batch_size = check_positive_int(batch_size, "batch_size")

    def __repr__(self) -> str:
        return f"Balance(costs={self.costs!r}, batch_size={self.batch_size})"


def attention_costs(costs: Callable[[np.ndarray], Any], samples: np.ndarray) -> np.ndarray:
    """``costs(samples)`` checked: int64, shape ``samples.shape``, every value ``>= 0``;
    ``ValueError`` naming what came back otherwise."""
    got = np.asarray(costs(samples))
    if got.shape != samples.shape or got.dtype.kind not in "iu":
        raise ValueError(
            f"the cost function returned {got.dtype} of shape {got.shape} for {samples.shape[0]} "
            "samples; it must return one integer cost per sample"
        )
    got = got.astype(np.int64, copy=False)
    if got.size and int(got.min()) < 0:
        raise ValueError(f"the cost function returned a negative cost {int(got.min())}")
    return got


def deal_balanced(costs: Any, world_size: int) -> np.ndarray:
    """The rank of every sample of one group (:func:`~mmpack._src.kernels.balance.deal_groups`).

    Parameters
    ----------
    costs : array-like of int, shape (m * world_size,)
        The group's costs, ``>= 0``.
    world_size : int
        ``W >= 1``; ``len(costs)`` must be a multiple of it.

    Returns
    -------
    numpy.ndarray, int64, shape (m * world_size,)
        Each sample's rank; every rank holds ``m`` samples.
    """
    world_size = check_positive_int(world_size, "world_size")
    arr = np.asarray(costs)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"costs must be a 1-D integer array, got {arr.dtype} of shape {arr.shape}")
    arr = arr.astype(np.int64)
    if arr.size % world_size:
        raise ValueError(
            f"a group of {arr.size} samples does not deal evenly to world_size={world_size}"
        )
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"costs must be >= 0, got {int(arr.min())}")
    return deal_groups(arr, np.array([0, arr.size], dtype=np.int64), world_size)


def largest_load(costs: Any, owner: np.ndarray, world_size: int) -> int:
    """The largest per-rank sum of ``costs`` under the dealing ``owner`` (both (k,))."""
    loads = np.bincount(owner, weights=np.asarray(costs, dtype=np.float64), minlength=world_size)
    return int(round(float(loads.max()))) if loads.size else 0


def balanced_positions(
    lo: int, hi: int, share: int, batch_size: int, world_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The groups covering a rank's share positions ``[lo, hi)`` (``0 <= lo <= hi <= share``):
    ``(offsets, group_ptr)``, ``offsets`` (int64, (k,)) every group's stream offsets from the
    base, ``group_ptr`` (int64, (G + 1,)) their bounds; group ``g`` is rank positions
    ``[(g0 + g) B, min((g0 + g + 1) B, share))``, ``g0 = lo // B``."""
    first, last = lo // batch_size, -(-hi // batch_size)
    starts = np.arange(first, last, dtype=np.int64) * batch_size
    sizes = (np.minimum(starts + batch_size, share) - starts) * world_size
    group_ptr = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=group_ptr[1:])
    offsets = np.arange(int(group_ptr[-1]), dtype=np.int64)
    offsets += np.repeat(starts * world_size - group_ptr[:-1], sizes)
    return offsets, group_ptr


def rank_slots(
    owner: np.ndarray, group_ptr: np.ndarray, rank: int, lo: int, hi: int, batch_size: int
) -> np.ndarray:
    """The slots (indices into the groups' samples, int64, (hi - lo,)) of rank ``rank``'s share
    positions ``[lo, hi)``: its samples of each group in slot order, the groups end to end, cut
    to the positions asked (the first group starts at position ``(lo // B) B``)."""
    mine = np.flatnonzero(owner == rank)
    skip = lo - (lo // batch_size) * batch_size
    return mine[skip : skip + hi - lo]


def balanced_resume(
    state: dict[str, Any], length: int, world_size: int, balance: Balance, point: tuple[int, int]
) -> tuple[int, int]:
    """Where a balanced sampler of ``world_size`` ranks resumes a checked ``state`` of an epoch
    of ``length`` stream indices, given the ordinary ``point`` ``(position, base)``
    (:func:`mmpack._src.torch.elastic.resume_point`): at the saved world size exactly where the state
    stands (the steps' groups are where they were); at another, after the ``G`` stream indices
    consumed, which must be whole steps of the saving ranks (``ValueError`` otherwise)."""
    position, offset, saved = state["position"], state["offset"], state["world_size"]
    if saved == world_size:
        return position, offset
    size = balance.batch_size
    remaining = max(0, length - offset)  # what each saving rank draws from offset on
    done = remaining // saved if state["drop_last"] else -(-remaining // saved)
    if position % size and position < done:
        raise ValueError(
            f"the state stands at position {position}, inside a step of batch_size {size}; a "
            f"balanced sampler resumes at another world size (here {saved} -> {world_size}) only "
            "from a state taken at a step boundary (as the loader takes it)"
        )
    if point[0] % size:
        return 0, point[1] + point[0] * world_size
    return point
