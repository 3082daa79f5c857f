"""The node cache's hit test: are all the pages that a batch's token ranges touch present.

:func:`all_pages_present` is one pass over the ranges, reading the state byte of every page
each range touches (a window of 2048 uint16 tokens touches one or two 16 KiB pages); the hit
path of :mod:`mmpack._src.remote.backend` calls it once per batch (cost: ``python -m
benchmarks.trust_costs node_cache``, docs/benchmarks.md "Checksums").

The check of cached pages against their digests, :func:`mmpack._src.kernels.store.check_ranges`,
lives beside the hash it calls.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["all_pages_present"]


@njit
def all_pages_present(
    state: np.ndarray, starts: np.ndarray, lengths: np.ndarray, itemsize: int, shift: int
) -> bool:
    """True when ``state[b] == 1`` for every page ``b`` (of ``1 << shift`` bytes) touched by
    the token ranges ``[starts[k], starts[k] + lengths[k])`` of ``itemsize``-byte tokens.

    ``state``: uint8, (npages,); ``starts``, ``lengths``: int64, (k,), of one length.  Empty
    ranges touch no page; a range reaching a page outside ``state`` (or starting before 0)
    answers False, never reading out of bounds."""
    n = state.shape[0]
    for k in range(starts.shape[0]):
        length = lengths[k]
        if length <= 0:
            continue
        lo = starts[k] * itemsize
        if lo < 0:
            return False
        first = lo >> shift
        last = (lo + length * itemsize - 1) >> shift
        if last >= n:
            return False
        for b in range(first, last + 1):
            if state[b] != 1:
                return False
    return True
