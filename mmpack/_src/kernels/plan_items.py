"""Plan items: what each document becomes before it is placed, and the plan's statistics slots.

Document ``d`` of ``n`` tokens occupies ``T = n + e`` slots (``e = 1`` when an end-of-text token
follows it).  A document longer than a bin is, by ``long_mode``, split (``k = (T-1) // S`` *full*
pieces of ``S`` tokens, each a bin of its own, then one remainder item of ``T - k*S`` slots in
``[1, S]`` that ends the document), truncated (one item of ``S`` slots: the first ``S - e`` tokens
and the eot) or dropped.  An empty document is an item of one slot (its eot) with ``e = 1`` and
nothing without.  :func:`item_sizes` computes, per document, the remainder item's size (``0``:
nothing placed) and counts what happened, in one O(n) pass; :func:`n_full_pieces` gives the full
pieces before it.

The placement kernels (:mod:`mmpack._src.kernels.plan_bestfit`) take items in one of two shapes, both
built here in O(n + S): :func:`bfd_items` writes the bins of size-``S`` items at once and
counting-sorts the others by size; :func:`online_items` lists every item in document order.
None of these kernels calls into another module (numba's cache does not follow callees across
files); the plan's Python driver chains them.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

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
    "ST_UNIVERSE",
    "bfd_items",
    "item_sizes",
    "n_full_pieces",
    "online_items",
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
ST_UNIVERSE = 9  # min(S, 1 + slots of all items smaller than S): see plan_bestfit
N_STATS = 10


@njit
def n_full_pieces(n: int, seqlen: int, eot: int, long_mode: int) -> int:
    """Full pieces a document of ``n`` tokens is split into before its last item."""
    t = n + eot
    if long_mode == LONG_SPLIT and t > seqlen:
        return (t - 1) // seqlen
    return 0


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
    before it are :func:`n_full_pieces`).  ``doc_lens`` (int64) >= 0; ``stats`` (int64,
    ``N_STATS``) is zeroed first; ``stats[ST_UNIVERSE]`` bounds every item size smaller than
    ``seqlen`` and every open bin's used slots (see :mod:`mmpack._src.kernels.plan_bestfit`)."""
    for s in range(stats.shape[0]):
        stats[s] = 0
    small = 0
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
            if r < seqlen and small < seqlen:
                small += r
        stats[ST_TOKENS] += k * seqlen + r
    stats[ST_UNIVERSE] = min(seqlen, small + 1)


@njit
def bfd_items(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    univ: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit decreasing's items: bins of the size-``seqlen`` items, then the others sorted.

    Every full piece and every item of ``seqlen`` slots fills a bin of its own: they are written
    first, in document order, into the CSR arrays (see :func:`~mmpack._src.kernels.plan_bestfit.bfd_groups`).
    The other items are counting-sorted by size (all sizes are ``< univ``).

    Returns
    -------
    n_bins, n_pieces : int
        Bins and pieces written.
    count : int64, shape (univ + 1,)
        Items of each size.
    pool : int64, shape (univ + 1,)
        Items of size ``L`` are ``order[pool[L]:pool[L] + count[L]]``, in document order.
    order, order_start : int64, shape (m,)
        Each sorted item's document and first token.
    """
    n = rem_occ.shape[0]
    nb = 0
    p = 0
    count = np.empty(univ + 1, dtype=np.int64)  # np.empty + loops: fewer overloads to compile
    for size in range(univ + 1):
        count[size] = 0
    for d in range(n):
        k = n_full_pieces(doc_lens[d], seqlen, eot, long_mode)
        for j in range(k):
            bin_ptr[nb] = p
            piece_doc[p] = d
            piece_start[p] = j * seqlen
            piece_len[p] = seqlen
            p += 1
            nb += 1
        r = rem_occ[d]
        if r == seqlen:
            bin_ptr[nb] = p
            piece_doc[p] = d
            piece_start[p] = k * seqlen
            piece_len[p] = seqlen - eot
            p += 1
            nb += 1
        elif r > 0:
            count[r] += 1
    pool = np.empty(univ + 1, dtype=np.int64)
    cursor = np.empty(univ + 1, dtype=np.int64)
    m = 0
    for size in range(univ + 1):
        pool[size] = m
        cursor[size] = m
        if 0 < size < univ:
            m += count[size]
    order = np.empty(m, dtype=np.int64)
    order_start = np.empty(m, dtype=np.int64)
    for d in range(n):
        r = rem_occ[d]
        if 0 < r < seqlen:
            order[cursor[r]] = d
            order_start[cursor[r]] = n_full_pieces(doc_lens[d], seqlen, eot, long_mode) * seqlen
            cursor[r] += 1
    return nb, p, count, pool, order, order_start


@njit
def online_items(
    doc_lens: np.ndarray, rem_occ: np.ndarray, seqlen: int, eot: int, long_mode: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every item in document order: its document, first token and tokens (int64 arrays of
    n_items each).  An item of fewer than ``seqlen`` tokens ends its document and is followed
    by the eot, so its slots are ``min(seqlen, tokens + eot)``."""
    n = rem_occ.shape[0]
    n_items = 0
    for d in range(n):
        n_items += n_full_pieces(doc_lens[d], seqlen, eot, long_mode) + (1 if rem_occ[d] > 0 else 0)
    item_doc = np.empty(n_items, dtype=np.int64)
    item_start = np.empty(n_items, dtype=np.int64)
    item_len = np.empty(n_items, dtype=np.int64)
    k = 0
    for d in range(n):
        nf = n_full_pieces(doc_lens[d], seqlen, eot, long_mode)
        for j in range(nf):
            item_doc[k] = d
            item_start[k] = j * seqlen
            item_len[k] = seqlen
            k += 1
        if rem_occ[d] > 0:
            item_doc[k] = d
            item_start[k] = nf * seqlen
            item_len[k] = rem_occ[d] - eot
            k += 1
    return item_doc, item_start, item_len
