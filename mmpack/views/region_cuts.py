"""Where the regions of a packing plan begin: consecutive documents cut by cumulative tokens.

Rule.  With ``T`` tokens in all and regions of ``R`` tokens there are ``K = max(1, ceil(T / R))``
region *slots*; document ``d``, whose first token is ``offsets[d]``, belongs to slot
``min(offsets[d] // R, K - 1)`` (the slot its first token falls in; a trailing empty document at
``T`` to the last).  Slots are non-decreasing in ``d``, so each is a run of consecutive documents
and no document is ever cut; a document longer than ``R`` leaves the slots after it empty, and
empty slots are not regions.  The edge of slot ``k`` is the first document starting at or after
``k * R``: one binary search over the offsets, O(log n) per cut, so the edges of slots
``[lo, hi)`` cost O((hi - lo) log n) and read only the offsets those searches touch (a
memory-mapped store's offsets are never read whole).

Blocks (:func:`region_blocks`).  The bins of a region hold documents from anywhere in it, so the
smallest set of bins that reads one contiguous span of the store is a region; a block is a run
of whole consecutive regions: regions are taken left to right into the current block while its
span stays within ``block_bytes``; a region larger than ``block_bytes`` is a block of its own.
Adjacent regions read adjacent spans, so a block reads one contiguous span.  O(n_regions).
"""

from __future__ import annotations

import numpy as np

__all__ = ["n_region_slots", "region_blocks", "region_edges", "whole_store_edges"]


def n_region_slots(num_tokens: int, region_tokens: int) -> int:
    """``K = max(1, ceil(num_tokens / region_tokens))``: the region slots of a store of
    ``num_tokens`` tokens (``region_tokens >= 1``)."""
    return max(1, -(-int(num_tokens) // int(region_tokens)))


def whole_store_edges(n_docs: int) -> np.ndarray:
    """The edges of a plan over the whole store: one region ``[0, n_docs]`` (none without
    documents)."""
    return np.array([0, n_docs] if n_docs else [0], dtype=np.int64)


def region_edges(
    offsets: np.ndarray, region_tokens: int, lo: int = 0, hi: int | None = None
) -> np.ndarray:
    """The document edges of the non-empty regions among slots ``[lo, hi)``.

    Parameters
    ----------
    offsets : numpy.ndarray, int64, shape (n_docs + 1,)
        Document ``d`` is tokens ``[offsets[d], offsets[d + 1])``; ``offsets[0] == 0``,
        non-decreasing (a store's offsets, possibly memory-mapped).
    region_tokens : int
        ``R >= 1``.
    lo, hi : int
        Slots, ``0 <= lo <= hi <= K`` (``hi`` None: ``K``, see :func:`n_region_slots`).

    Returns
    -------
    numpy.ndarray, int64, shape (m + 1,)
        Strictly increasing document indices: region ``j`` of the ``m`` non-empty ones is
        documents ``[edges[j], edges[j + 1])``; ``edges[0]`` is slot ``lo``'s first document and
        ``edges[-1]`` the end of slot ``hi - 1`` (one entry, ``m = 0``, when all are empty, as for
        a store without documents).
    """
    n = int(offsets.shape[0]) - 1
    k_slots = n_region_slots(int(offsets[n]), region_tokens)
    hi = k_slots if hi is None else hi
    if not 0 <= lo <= hi <= k_slots:
        raise ValueError(f"region slots [{lo}, {hi}) are outside [0, {k_slots}]")
    slots = np.arange(lo, hi + 1, dtype=np.int64)
    inner = (slots > 0) & (slots < k_slots)
    edges = np.where(slots == 0, 0, n).astype(np.int64)
    edges[inner] = np.searchsorted(offsets, slots[inner] * np.int64(region_tokens), side="left")
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
        A plan's regions (:class:`~mmpack.views.plan.PackingPlan`).
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
