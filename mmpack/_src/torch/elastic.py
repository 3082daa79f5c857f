"""Elastic resume: a sampler state saved at world size ``W1`` resumed at any world size ``W2``.

The epoch order of :class:`~mmpack.ResumableSampler` is global: position ``p`` of
epoch ``e`` holds sample ``order[p % n]``, and with ``W`` ranks rank ``r`` takes positions ``r, r
+ W, ...``.  Ranks advance in lockstep, so after ``k`` draws each the ranks have consumed exactly
the positions ``[0, G)``, ``G = offset + position * world_size`` as the state records it.  Rule of
the resumed epoch at any ``W2 >= 1`` (example: ``n = 10``, saved at ``W1 = 4`` after ``k = 1``,
so ``G = 4``; resumed at ``W2 = 3``)::

    positions not consumed: G .. n-1                     4 5 6 7 8 9
    rank r of W2 takes G + r, G + r + W2, ...          r0: 4 7   r1: 5 8   r2: 6 9

* ``drop_last=False``: every rank takes ``ceil((n - G) / W2)`` positions; positions ``p >= n`` are
  padding holding ``order[p % n]`` (as ``DistributedSampler`` pads): every unconsumed sample once,
  plus at most ``W2 - 1`` repeats of the epoch's first samples.
* ``drop_last=True``: every rank takes ``floor((n - G) / W2)`` positions; the last ``(n - G) %
  W2`` are dropped, nothing repeated.

With ``W2 == W1`` (or ``G`` a multiple of ``W2``) this is the ordinary resume; otherwise the
epoch starts at the global offset ``G`` (the state's ``offset``), and after ``k`` more draws per
rank records ``offset = G, position = k``, so it can be resumed elastically again.  With skips or
replays (:mod:`mmpack._src.sampling.sampler_edits`) the rule deals the epoch's *stream* (``n`` its
length); edits are global positions, the same at every world size.  Cost: O(1) arithmetic, no
replay (the StatefulDataLoader recipe: ``docs/guide/sampler.md``, "Elastic resume").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.sampling.dealing import share_length
from mmpack.errors import FormatError

__all__ = ["resume_point", "resumed_positions", "sampler_state"]


def resumed_positions(
    n: int, global_position: int, rank: int, world_size: int, drop_last: bool
) -> np.ndarray:
    """Global epoch positions rank ``rank`` of ``world_size`` takes after ``global_position``.

    Returns
    -------
    numpy.ndarray, int64, shape (share_length(n, global_position, world_size, drop_last),)
        Positions ``>= n`` are padding: they hold sample ``order[p % n]``.
    """
    count = share_length(n, global_position, world_size, drop_last)
    return global_position + rank + world_size * np.arange(count, dtype=np.int64)


def _int_field(state: dict[str, Any], name: str) -> int:
    """Field ``name`` of a sampler state as a plain int (a Python or NumPy integer, not a bool).

    Raises
    ------
    mmpack.errors.FormatError
        The field is missing or not an integer; the message names it and its value.
    """
    if name not in state:
        raise FormatError(f"sampler state lacks the field {name!r}")
    value = state[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"sampler state field {name} must be an int, got {value!r}")
    return int(value)


def resume_point(
    state: dict[str, Any], n: int, world_size: int, drop_last: bool
) -> tuple[int, int]:
    """Where a sampler of ``world_size`` ranks resumes a validated state: ``(position, base)``.

    ``base`` is the global position of the resumed epoch's first round (0 for an ordinary resume)
    and ``position`` the index of each rank's first draw in its share from ``base``.

    Raises
    ------
    mmpack.errors.FormatError
        The state's ``world_size``, ``position`` or ``offset`` are not ints or out of range.
    """
    saved_ws = _int_field(state, "world_size")
    if saved_ws < 1:
        raise FormatError(f"sampler state has world_size={saved_ws}, expected >= 1")
    offset = _int_field(state, "offset")
    if not 0 <= offset <= n:
        raise FormatError(f"sampler state has offset={offset}, expected 0 <= offset <= n={n}")
    position = _int_field(state, "position")
    limit = share_length(n, offset, saved_ws, drop_last)
    if not 0 <= position <= limit:
        raise FormatError(
            f"sampler state has position={position}, expected 0 <= position <= {limit} (len)"
        )
    global_position = offset + position * saved_ws
    if global_position % world_size == 0 and global_position // world_size <= share_length(
        n, 0, world_size, drop_last
    ):
        return global_position // world_size, 0  # the ordinary resume
    if global_position >= n:
        return 0, n  # every sample consumed: the epoch is over (and stays over when saved again)
    return 0, global_position


def sampler_state(loader_state: dict[str, Any]) -> dict[str, Any]:
    """The :class:`ResumableSampler` state inside a ``StatefulDataLoader.state_dict()``.

    Use it to resume on another world size or another number of workers (a StatefulDataLoader
    refuses a state saved with a different ``num_workers``): load it into the new rank's sampler
    and iterate a fresh loader.

    Raises
    ------
    mmpack.errors.FormatError
        No sampler state is found (the loader had no ``ResumableSampler``).
    """
    found = _find(loader_state)
    if found is None:
        raise FormatError(
            "no ResumableSampler state found in this loader state (keys: "
            f"{sorted(loader_state)[:8]})"
        )
    return found


def _find(node: Any) -> dict[str, Any] | None:
    if isinstance(node, dict):
        if "offset" in node and "seed" in node and "n" in node:
            return node
        for key in (
            "_snapshot",
            "_main_snapshot",
            "_sampler_iter_state",
            "_index_sampler_state",
            "sampler_state",
        ):
            if key in node:
                found = _find(node[key])
                if found is not None:
                    return found
    return None
