"""Where the regions of a packing plan begin: consecutive documents cut by cumulative tokens,
each cut moved to a nearby document boundary where the regions pack their bins full.

Rule.  ``T`` tokens and regions of ``R`` tokens make ``K = max(1, ceil(T / R))`` region *slots*;
slot ``k``'s nominal edge ``n_k`` is the first document starting at or after ``k * R`` (a binary
search; slot 0's edge is document 0).  A region packed alone fills its last bin only if its slot
total is just under a multiple of ``S = seqlen``, so each inner edge is the document ``d`` within
:data:`EDGE_SEARCH_DOCS` of ``n_k`` (starting in ``[k R - R // 2, (k + 1) R - R // 2)``) with the
smallest ``u = (offsets[d] + eot * d + k * sigma) mod S`` (ties: nearest ``n_k``, then lower):
a region is left about ``sigma`` free slots, the room its best fit needs for the small gaps it
cannot fill, ``G`` (:func:`region_slack`: 1.3 times the most ``G`` of :data:`_EDGE_PROBES` slots'
regions packed alone, plus 32, at most :func:`edge_slack`; 0.05-0.6 bins a region over the
whole-store best fit, against 0.4-0.8 for nominal edges; ``python -m benchmarks regions``).  No
edge depends on another, so any process cuts a range of slots alike (given ``sigma``); the search
windows are disjoint and ordered, so edges never decrease.  Slot counts are exact for
``long_docs="split"``, estimates otherwise.  Cost: O(log n + EDGE_SEARCH_DOCS) per slot, reading
only those offsets, and the best fit of the probes' documents once.

Blocks (:func:`region_blocks`).  The bins of a region hold documents from anywhere in it, so the
smallest set of bins that reads one contiguous span of the store is a region; a block is a run
of whole consecutive regions: regions are taken left to right into the current block while its
span stays within ``block_bytes``; a region larger than ``block_bytes`` is a block of its own.
Adjacent regions read adjacent spans, so a block reads one contiguous span.  O(n_regions).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mmpack._src.kernels import packing as _k
from mmpack._src.kernels import plan_items as _items

__all__ = [
    "EDGE_SEARCH_DOCS",
    "edge_slack",
    "n_region_slots",
    "region_blocks",
    "region_edges",
    "region_slack",
    "whole_store_edges",
]

EDGE_SEARCH_DOCS = 256
"""Documents on each side of a nominal region edge among which the edge is chosen."""

_EDGE_SLACK = 1024
"""The most free slots a region's edges leave it (``sigma``, see :func:`edge_slack`) at
``seqlen`` 2560-6553; fewer below (``2 S // 5``), ``5 S // 32`` above."""

_EDGE_PROBES = 3
"""Region slots packed alone to measure the gaps best fit leaves (:func:`region_slack`)."""


def n_region_slots(num_tokens: int, region_tokens: int) -> int:
    """``K = max(1, ceil(num_tokens / region_tokens))``: the region slots of a store of
    ``num_tokens`` tokens (``region_tokens >= 1``)."""
    return max(1, -(-int(num_tokens) // int(region_tokens)))


def whole_store_edges(n_docs: int) -> np.ndarray:
    """The edges of a plan over the whole store: one region ``[0, n_docs]`` (none without
    documents)."""
    return np.array([0, n_docs] if n_docs else [0], dtype=np.int64)


def edge_slack(seqlen: int) -> int:
    """``sigma = min(2 * seqlen // 5, max(_EDGE_SLACK, 5 * seqlen // 32))``: the free slots a
    region's edges aim at.  Best fit's gaps in a region of 2048-8192 bins add up to 150-1000 slots
    at ``seqlen`` 2048 and 300-1300 at 8192 (more for longer documents), so the floor of 1024 would
    leave a region of long documents too little room at 8192 (a bin more in most regions)."""
    s = int(seqlen)
    return min(2 * s // 5, max(_EDGE_SLACK, 5 * s // 32))


def region_slack(
    offsets: np.ndarray,
    region_tokens: int,
    seqlen: int,
    eot: int,
    doc_bounds: Callable[[int, int], np.ndarray] | None = None,
) -> int:
    """``sigma``: the free slots every region's edges leave it, a pure function of the lengths.

    The slots ``(2 i + 1) K // (2 _EDGE_PROBES)`` (``i < _EDGE_PROBES``, distinct; none when
    ``K == 1``) are probes: each one's documents (those starting in ``[k R, (k + 1) R)``) are
    packed alone by best-fit decreasing (``long_docs="split"``) and ``G``, the free slots of all
    its bins but the emptiest, is what a region needs free for its last bin to take the rest.
    ``sigma = min(edge_slack(seqlen), (13 * max G + 9) // 10 + 32)``.  Reads ``_EDGE_PROBES``
    regions' offsets and packs them: about as long as that many regions of a plan.

    Parameters
    ----------
    offsets : numpy.ndarray, int64, shape (n_docs + 1,)
        As :func:`region_edges`; region_tokens, seqlen, eot as there.
    doc_bounds : callable, optional
        ``doc_bounds(a, b)``: ``offsets[a : b + 1]``, checked (a store's
        :meth:`~mmpack.TokenStore.doc_bounds`, where ``offsets`` is its
        :attr:`~mmpack.TokenStore.paged_offsets`: the probes' lengths are read through it);
        default ``offsets`` itself.

    Returns
    -------
    int
        In ``[0, edge_slack(seqlen)]``.
    """
    n = int(offsets.shape[0]) - 1
    r_tokens, s = int(region_tokens), int(seqlen)
    k_slots = n_region_slots(int(offsets[n]), r_tokens)
    probes = {(2 * i + 1) * k_slots // (2 * _EDGE_PROBES) for i in range(_EDGE_PROBES)}
    most = 0
    for k in sorted(probes) if k_slots > 1 else []:
        a = int(offsets.searchsorted(k * r_tokens, side="left"))
        b = max(a, min(n, int(offsets.searchsorted((k + 1) * r_tokens, side="left"))))
        bounds = offsets[a : b + 1] if doc_bounds is None else doc_bounds(a, b)
        lens = np.diff(np.asarray(bounds, dtype=np.int64))
        most = max(most, _unfilled(lens, s, eot))
    return min(edge_slack(s), (13 * most + 9) // 10 + 32)


def _unfilled(lens: np.ndarray, seqlen: int, eot: int) -> int:
    """The free slots of all but the emptiest bin of the best-fit-decreasing plan of documents of
    ``lens`` tokens (int64; split at ``seqlen``, an eot slot after each when ``eot``), sized and
    placed as :func:`~mmpack._src.packing.plan.pack_regions` does one region."""
    lens.flags.writeable = False  # the plan's kernel signature (read-only int64)
    rem_occ, stats = np.empty(lens.shape[0], np.int32), np.zeros(_items.N_STATS, np.int64)
    _items.item_sizes(lens, seqlen, eot, _items.LONG_SPLIT, rem_occ, stats)
    m = int(stats[_items.ST_FULL_PIECES] + stats[_items.ST_PLACED_DOCS])
    bin_ptr, piece_len = np.zeros(m + 1, np.int64), np.empty(m, np.int32)
    out = (bin_ptr, np.empty(m, np.int64), np.empty(m, np.int64), piece_len)
    univ = int(stats[_items.ST_UNIVERSE])
    nb = _k.place(lens, rem_occ, seqlen, eot, _items.LONG_SPLIT, 0, out, univ)
    if nb == 0:
        return 0
    slots = np.minimum(piece_len.astype(np.int64) + eot, seqlen)  # a full piece has no eot
    free = seqlen - np.add.reduceat(slots, bin_ptr[:nb])
    return int(free.sum() - free.max())


def region_edges(
    offsets: np.ndarray,
    region_tokens: int,
    seqlen: int,
    eot: int,
    lo: int = 0,
    hi: int | None = None,
    slack: int | None = None,
) -> np.ndarray:
    """The document edges of the non-empty regions among slots ``[lo, hi)``.

    Parameters
    ----------
    offsets : numpy.ndarray, int64, shape (n_docs + 1,)
        Document ``d`` is tokens ``[offsets[d], offsets[d + 1])``; ``offsets[0] == 0``,
        non-decreasing (a store's offsets, possibly memory-mapped; or any object with
        ``shape``, int and slice indexing and ``searchsorted`` of one value, such as a store's
        :attr:`~mmpack.TokenStore.paged_offsets`, which checks the pages it reads).
    region_tokens : int
        ``R >= 1``.
    seqlen : int
        Slots of a bin, ``S >= 1``.
    eot : int
        Slots after every document (1 with an end-of-text token, else 0).
    lo, hi : int
        Slots, ``0 <= lo <= hi <= K`` (``hi`` None: ``K``, see :func:`n_region_slots`).
    slack : int, optional
        ``sigma``, :func:`region_slack` of these arguments (computed when None: a caller
        cutting the slots in parts computes it once and passes it to each).

    Returns
    -------
    numpy.ndarray, int64, shape (m + 1,)
        Strictly increasing document indices: region ``j`` of the ``m`` non-empty ones is
        documents ``[edges[j], edges[j + 1])``; ``edges[0]`` is slot ``lo``'s first document and
        ``edges[-1]`` the end of slot ``hi - 1`` (one entry, ``m = 0``, when all are empty, as for
        a store without documents).  Each inner edge is chosen near its nominal one (see the
        module docstring).
    """
    n = int(offsets.shape[0]) - 1
    r_tokens, s, e = int(region_tokens), int(seqlen), int(eot)
    k_slots = n_region_slots(int(offsets[n]), r_tokens)
    hi = k_slots if hi is None else hi
    if not 0 <= lo <= hi <= k_slots:
        raise ValueError(f"region slots [{lo}, {hi}) are outside [0, {k_slots}]")
    sigma = region_slack(offsets, r_tokens, s, e) if slack is None else int(slack)
    half = r_tokens // 2
    edges = np.empty(hi - lo + 1, dtype=np.int64)
    for j, k in enumerate(range(lo, hi + 1)):
        if k == 0 or k >= k_slots:
            edges[j] = 0 if k == 0 else n
            continue
        nominal = int(offsets.searchsorted(k * r_tokens, side="left"))
        first = int(offsets.searchsorted(k * r_tokens - half, side="left"))
        stop = int(offsets.searchsorted((k + 1) * r_tokens - half, side="left"))
        first = max(first, nominal - EDGE_SEARCH_DOCS)
        stop = min(stop, nominal + EDGE_SEARCH_DOCS + 1, n)
        if stop <= first:
            edges[j] = min(nominal, n)
            continue
        docs = np.arange(first, stop, dtype=np.int64)
        slots = np.asarray(offsets[first:stop], dtype=np.int64) + e * docs
        u = (slots + k * sigma) % s
        # smallest u, then nearest to the nominal edge, then lowest (argmin: the first)
        edges[j] = first + int(np.argmin(u * (2 * EDGE_SEARCH_DOCS + 2) + np.abs(docs - nominal)))
    keep = np.ones(edges.shape[0], dtype=bool)
    keep[1:] = edges[1:] > edges[:-1]
    return edges[keep]


def region_blocks(
    region_bin: np.ndarray,
    region_doc: np.ndarray,
    offsets: np.ndarray,
    itemsize: int,
    block_bytes: int,
) -> np.ndarray:
    """Bin bounds of blocks of whole consecutive regions, each reading at most ``block_bytes``
    unless it is one region larger than that (see the module docstring).

    Parameters
    ----------
    region_bin, region_doc : numpy.ndarray, int64, shape (n_regions + 1,)
        A plan's regions (:class:`~mmpack._src.packing.plan.PackingPlan`).
    offsets : numpy.ndarray, int64, shape (n_docs + 1,)
        The store's document offsets, in tokens.
    itemsize : int
        Bytes per token.
    block_bytes : int
        ``>= 1``.

    Returns
    -------
    numpy.ndarray, int64, shape (n_blocks + 1,)
        ``[0, ..., n_bins]``, strictly increasing (regions without bins add no block; ``[0]``
        for a plan without bins): block ``j`` is bins ``[bounds[j], bounds[j + 1])``.
    """
    span = (np.asarray(offsets[region_doc], dtype=np.int64) * int(itemsize)).tolist()
    rb = np.asarray(region_bin, dtype=np.int64).tolist()
    cuts = [0]
    start = 0  # first region of the current block
    for r in range(1, len(rb) - 1):
        if span[r + 1] - span[start] > block_bytes:  # region r starts a block
            cuts.append(rb[r])
            start = r
    cuts.append(rb[-1])
    bounds = np.asarray(cuts, dtype=np.int64)
    keep = np.ones(bounds.shape[0], dtype=bool)
    keep[1:] = bounds[1:] > bounds[:-1]
    return bounds[keep]
