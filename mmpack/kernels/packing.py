"""Packing kernels, by path: best-fit bin packing of whole documents into ``seqlen``-token bins,
and the batch gather that turns bins into model inputs.

This module owns nothing itself; it names the packing kernels in one place, split along the
call graph (numba's cache does not follow callees across files, so kernels that call each other
share a module):

- :mod:`mmpack.kernels.plan_items`: what each document becomes (:func:`item_sizes`, O(n)) and the
  plan's statistics slots;
- :mod:`mmpack.kernels.plan_bestfit`: the 64-ary bitset tree over free space, best-fit
  decreasing (:func:`bfd`, O(n + steps * log_64 S)) and online best fit (:func:`stream`,
  O(n log_64 S + S));
- :mod:`mmpack.kernels.packed_rows`: bins to ``input_ids``, positions, labels, attention mask and
  ``cu_seqlens`` (:func:`select_pieces`, :func:`fill_rows`, :func:`one_bin`; O(B * seqlen)).
"""

from __future__ import annotations

from mmpack.core.constants import IGNORE_INDEX
from mmpack.kernels.packed_rows import (
    LABELS_HF,
    LABELS_NEXT,
    LABELS_NONE,
    fill_rows,
    one_bin,
    select_pieces,
)
from mmpack.kernels.plan_bestfit import bfd, n_full_pieces, stream
from mmpack.kernels.plan_items import (
    LONG_DROP,
    LONG_SPLIT,
    LONG_TRUNCATE,
    N_STATS,
    ST_DROPPED,
    ST_EMPTY,
    ST_FULL_PIECES,
    ST_LONG,
    ST_LOST_TOKENS,
    ST_PLACED_DOCS,
    ST_SPLIT,
    ST_TOKENS,
    ST_TRUNCATED,
    item_sizes,
)

__all__ = [
    "IGNORE",
    "LABELS_HF",
    "LABELS_NEXT",
    "LABELS_NONE",
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
    "bfd",
    "fill_rows",
    "item_sizes",
    "n_full_pieces",
    "one_bin",
    "select_pieces",
    "stream",
]

IGNORE = IGNORE_INDEX
"""Label of a position without loss (:data:`mmpack.core.constants.IGNORE_INDEX`)."""
