"""The plan drivers: best-fit bin packing of whole documents into ``seqlen``-token bins, plain
Python chaining the placement kernels (each module holds kernels that call each other):

- :mod:`mmpack._src.kernels.plan_items`: what each document becomes (``item_sizes``, O(n)), the
  plan's statistics slots, the items in the shape each placement takes (O(n + S));
- :mod:`mmpack._src.kernels.plan_bestfit`: the free-space index, best-fit decreasing
  (O(steps * log_64 S)) and online best fit (O(n log_64 S + S));
- :func:`~mmpack._src.kernels.plan_bestfit.emit_by_rank` and
  :func:`~mmpack._src.kernels.plan_bestfit.emit_groups`: placements to the CSR plan (O(n_pieces));
- :func:`place` here: the whole placement, a kernel call a phase; :func:`pack_alone` sizes and
  places one set of documents.

First-call compile times: ``docs/benchmarks.md`` (``python -m benchmarks.bench_first_call``).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels.plan_bestfit import bfd_groups, emit_by_rank, emit_groups, online_place
from mmpack._src.kernels.plan_items import (
    N_STATS,
    ST_FULL_PIECES,
    ST_PLACED_DOCS,
    ST_UNIVERSE,
    bfd_items,
    item_sizes,
    online_items,
)

__all__ = ["pack_alone", "place"]


def place(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    window: int,
    out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    univ: int,
) -> int:
    """Place the items of ``doc_lens`` into bins, writing the CSR plan ``out = (bin_ptr,
    piece_doc, piece_start, piece_len)``; returns the number of bins.

    ``doc_lens`` int64, ``rem_occ`` int32 (from :func:`~mmpack._src.kernels.plan_items.item_sizes`);
    ``bin_ptr`` (int64) needs room for n_items + 1 entries, the piece arrays (int64, int64,
    int32) for n_items, where n_items = (full pieces) + count(rem_occ > 0).  ``univ`` is
    ``stats[ST_UNIVERSE]`` of ``item_sizes``; any value in ``[that, seqlen]`` gives the same plan.

    ``window == 0``: best-fit decreasing over size classes, bins in the order they were opened.
    Items of one size are interchangeable and best fit gives a chosen bin of free space ``f``
    ``f // L`` items of size ``L`` in a row, so bins are handled in *groups* of identical bins
    (same sizes placed, same free space): each step moves or splits a whole group, and the steps
    per size are the groups it exhausts plus one.  A group's contents are a path in a tree of
    ``(size, count)`` nodes.  At the end groups are emitted in creation order, and the documents
    of each size are dealt, in document order, to the bins in output order.

    ``window >= 1``: order-preserving best fit over at most ``window`` open bins, bins numbered
    in emission order.
    """
    if window == 0:
        nb, p, count, pool, order, order_start = bfd_items(
            doc_lens, rem_occ, seqlen, eot, long_mode, univ, *out
        )
        nodes, groups, n_groups = bfd_groups(count, seqlen, univ)
        return emit_groups(nodes, groups, n_groups, pool, order, order_start, eot, nb, p, *out)
    item_doc, item_start, item_len = online_items(doc_lens, rem_occ, seqlen, eot, long_mode)
    item_bin, emit_rank, n_bins = online_place(item_len, eot, seqlen, univ, window)
    return emit_by_rank(item_doc, item_start, item_len, item_bin, emit_rank, n_bins, *out)


def pack_alone(
    doc_lens: np.ndarray, seqlen: int, eot: int, long_mode: int, window: int = 0
) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Size and :func:`place` the documents of ``doc_lens`` (read-only int64, shape (n,)) on
    their own: ``(n_bins, (bin_ptr, piece_doc, piece_start, piece_len))``, the arrays sized
    for the items (``bin_ptr[: n_bins + 1]`` holds the bins)."""
    rem_occ = np.empty(doc_lens.shape[0], dtype=np.int32)
    stats = np.zeros(N_STATS, dtype=np.int64)
    item_sizes(doc_lens, seqlen, eot, long_mode, rem_occ, stats)
    m = int(stats[ST_FULL_PIECES] + stats[ST_PLACED_DOCS])
    bin_ptr = np.zeros(m + 1, dtype=np.int64)
    out = (bin_ptr, np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int32))
    univ = int(stats[ST_UNIVERSE])
    return place(doc_lens, rem_occ, seqlen, eot, long_mode, window, out, univ), out
