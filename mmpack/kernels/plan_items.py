"""Plan items: what each document becomes before it is placed, and the plan's statistics slots.

Document ``d`` of ``n`` tokens occupies ``T = n + e`` slots (``e = 1`` when an end-of-text token
follows it).  A document longer than a bin is, by ``long_mode``, split (``k = (T-1) // S`` *full*
pieces of ``S`` tokens, each a bin of its own, then one remainder item of ``T - k*S`` slots in
``[1, S]`` that ends the document), truncated (one item of ``S`` slots: the first ``S - e`` tokens
and the eot) or dropped.  An empty document is an item of one slot (its eot) with ``e = 1`` and
nothing without.  :func:`item_sizes` computes, per document, the remainder item's size (``0``:
nothing placed) and counts what happened, in one O(n) pass; the number of full pieces is
:func:`mmpack.kernels.plan_bestfit.n_full_pieces` (it lives with the placement kernels that call
it: numba's cache does not follow callees across files).
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = [
    "LONG_DROP",
    "LONG_SPLIT",
    "LONG_TRUNCATE",
    "N_STATS",
    "ST_DROPPED",
    "ST_EMPTY",
    "ST_FULL_PIECES",
    "ST_LONG",
    "ST_LOST_TOKENS",
    "ST_PLACED_DOCS",
    "ST_SPLIT",
    "ST_TOKENS",
    "ST_TRUNCATED",
    "item_sizes",
]

LONG_SPLIT = 0
LONG_TRUNCATE = 1
LONG_DROP = 2

# Slots of the ``stats`` array filled by :func:`item_sizes`.
ST_PLACED_DOCS = 0
ST_EMPTY = 1
ST_LONG = 2
ST_SPLIT = 3
ST_TRUNCATED = 4
ST_DROPPED = 5
ST_TOKENS = 6
ST_LOST_TOKENS = 7
ST_FULL_PIECES = 8
N_STATS = 9


@njit
def item_sizes(
    doc_lens: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    rem_occ: np.ndarray,
    stats: np.ndarray,
) -> None:
    """Per document: ``rem_occ[d]`` slots of its last item (0 = not placed; the full pieces
    before it are
    :func:`~mmpack.kernels.plan_bestfit.n_full_pieces`).  ``doc_lens`` >= 0; ``stats`` (int64, ``N_STATS``) is
    zeroed first."""
    for s in range(stats.shape[0]):
        stats[s] = 0
    for d in range(doc_lens.shape[0]):
        n = doc_lens[d]
        t = n + eot
        k = 0
        r = t
        if n == 0:
            stats[ST_EMPTY] += 1
        if t > seqlen:
            stats[ST_LONG] += 1
            if long_mode == LONG_SPLIT:
                k = (t - 1) // seqlen
                r = t - k * seqlen
                stats[ST_SPLIT] += 1
            elif long_mode == LONG_TRUNCATE:
                r = seqlen
                stats[ST_TRUNCATED] += 1
                stats[ST_LOST_TOKENS] += t - seqlen
            else:
                r = 0
                stats[ST_DROPPED] += 1
                stats[ST_LOST_TOKENS] += n
        rem_occ[d] = r
        stats[ST_FULL_PIECES] += k
        if r > 0:
            stats[ST_PLACED_DOCS] += 1
        stats[ST_TOKENS] += k * seqlen + r
