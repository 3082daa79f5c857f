"""The plan drivers: best-fit bin packing of whole documents into ``seqlen``-token bins, plain
Python chaining the placement kernels (each module holds kernels that call each other):

- :mod:`mmpack._src.kernels.plan_items`: what each document becomes (``item_sizes``, O(n)), the
  plan's statistics slots, the items in the shape each placement takes (O(n + S));
- :mod:`mmpack._src.kernels.plan_bestfit`: the free-space index, best-fit decreasing
  (O(steps * log_64 S)) and online best fit (O(n log_64 S + S));
- :func:`~mmpack._src.kernels.plan_bestfit.emit_by_rank` and
  :func:`~mmpack._src.kernels.plan_bestfit.emit_groups`: placements to the CSR plan (O(n_pieces));
- :func:`place` here: the whole placement, a kernel call a phase.

First-call compile times: ``docs/benchmarks.md`` (``python -m benchmarks.bench_first_call``).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels.plan_bestfit import bfd_groups, emit_by_rank, emit_groups, online_place
from mmpack._src.kernels.plan_items import bfd_items, online_items

__all__ = ["place"]


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

    ``window == 0``: best-fit decreasing on groups of identical bins
    (:func:`~mmpack._src.kernels.plan_bestfit.bfd_groups`), bins in the order they were opened;
    ``window >= 1``: order-preserving best fit over at most ``window`` open bins
    (:func:`~mmpack._src.kernels.plan_bestfit.online_place`), bins numbered in emission order.
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
