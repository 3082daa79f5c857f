"""Packing kernels, by path: best-fit bin packing of whole documents into ``seqlen``-token bins,
and the batch gather that turns bins into model inputs.

The kernels live in modules split along the call graph (numba's cache does not follow callees
across files, so jitted functions that call each other share a module); callers import each from
its module.  This one holds the two plan drivers, plain Python that chains them:

- :mod:`mmpack._src.kernels.plan_items`: what each document becomes (``item_sizes``, O(n)) and the
  plan's statistics slots; the items in the shape each placement takes (O(n + S));
- :mod:`mmpack._src.kernels.plan_bestfit`: the 64-ary bitset tree over free space, best-fit
  decreasing's packing loop (O(steps * log_64 S)) and online best fit (O(n log_64 S + S));
- :mod:`mmpack._src.kernels.plan_emit` (online best fit) and :func:`~mmpack._src.kernels.plan_bestfit.emit_groups`
  (best-fit decreasing): placements to the CSR plan (O(n_pieces));
- :func:`bfd` and :func:`stream` here: the whole placement, one kernel call per phase;
- :mod:`mmpack._src.kernels.packed_rows`: bins to ``input_ids``, positions, labels, attention mask and
  ``cu_seqlens`` (``select_pieces``, ``fill_rows``, ``one_bin``; O(B * seqlen)).

First-call cost: with numba's cache empty, a fresh process compiles the ``bfd`` plan's kernels in
about 3 s (``bfd_groups`` the largest part; no kernel formats an error message or compiles a
second, literal-typed specialization, which would add seconds); ``"online"`` then adds about
1.2 s of CPU.  With the cache filled they load in milliseconds (``python -m
benchmarks.bench_first_call --quick``: medians of fresh interpreters).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels.plan_bestfit import bfd_groups, emit_groups, online_place
from mmpack._src.kernels.plan_emit import emit_by_rank
from mmpack._src.kernels.plan_items import bfd_items, online_items

__all__ = ["bfd", "stream", "universe"]


def universe(rem_occ: np.ndarray, seqlen: int) -> int:
    """``min(seqlen, T + 1)``, ``T`` the slots of all items smaller than ``seqlen`` (what
    :func:`~mmpack._src.kernels.plan_items.item_sizes` records in ``stats[ST_UNIVERSE]``)."""
    small = rem_occ[(rem_occ > 0) & (rem_occ < seqlen)]
    return int(min(seqlen, int(small.sum(dtype=np.int64)) + 1))


def bfd(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    univ: int | None = None,
) -> int:
    """Best-fit decreasing over size classes; writes the CSR plan, returns the number of bins.

    ``doc_lens`` int64, ``rem_occ`` int32 (from :func:`~mmpack._src.kernels.plan_items.item_sizes`);
    ``bin_ptr`` (int64) needs room for n_items + 1 entries, the piece arrays (int64, int64,
    int32) for n_items, where n_items = (full pieces) + count(rem_occ > 0).  ``univ`` is
    ``stats[ST_UNIVERSE]`` of ``item_sizes`` (computed when None); any value in
    ``[that, seqlen]`` gives the same plan.

    Items of one size are interchangeable and best fit gives a chosen bin of free space ``f``
    ``f // L`` items of size ``L`` in a row, so bins are handled in *groups* of identical bins
    (same sizes placed, same free space): each step moves or splits a whole group, and the steps
    per size are the groups it exhausts plus one.  A group's contents are a path in a tree of
    ``(size, count)`` nodes.  At the end groups are emitted in creation order, and the documents
    of each size are dealt, in document order, to the bins in output order.
    """
    if univ is None:
        univ = universe(rem_occ, seqlen)
    out = (bin_ptr, piece_doc, piece_start, piece_len)
    nb, p, count, pool, order, order_start = bfd_items(
        doc_lens, rem_occ, seqlen, eot, long_mode, univ, *out
    )
    nodes, groups, n_groups = bfd_groups(count, seqlen, univ)
    return emit_groups(nodes, groups, n_groups, pool, order, order_start, eot, nb, p, *out)


def stream(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    window: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    univ: int | None = None,
) -> int:
    """Order-preserving best fit over at most ``window`` (>= 1) open bins; same contract as
    :func:`bfd`, bins numbered in emission order."""
    if univ is None:
        univ = universe(rem_occ, seqlen)
    item_doc, item_start, item_len = online_items(doc_lens, rem_occ, seqlen, eot, long_mode)
    item_bin, emit_rank, n_bins = online_place(item_len, eot, seqlen, univ, window)
    out = (bin_ptr, piece_doc, piece_start, piece_len)
    return emit_by_rank(item_doc, item_start, item_len, item_bin, emit_rank, n_bins, *out)
