"""Online best fit's output pass: placements to the CSR plan (``bin_ptr``, ``piece_doc``,
``piece_start``, ``piece_len``), O(n_pieces).

:func:`emit_by_rank` writes online best fit's items bin by bin in emission order
(:func:`mmpack._src.kernels.plan_bestfit.online_place`); best-fit decreasing's output pass,
:func:`mmpack._src.kernels.plan_bestfit.emit_groups`, lives beside the node and group tables it
reads.  No jitted function here calls one of another module.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["emit_by_rank"]


@njit
def emit_by_rank(
    item_doc: np.ndarray,
    item_start: np.ndarray,
    item_len: np.ndarray,
    item_bin: np.ndarray,
    emit_rank: np.ndarray,
    n_bins: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> int:
    """Write the items bin by bin, bins in emission order (bin ``b`` is output bin
    ``emit_rank[b]``), items of a bin in document order; returns ``n_bins``."""
    n_items = item_bin.shape[0]
    fill = np.empty(n_bins + 1, dtype=np.int64)
    for r in range(n_bins + 1):
        fill[r] = 0
    for i in range(n_items):
        fill[emit_rank[item_bin[i]] + 1] += 1
    for r in range(n_bins):
        fill[r + 1] += fill[r]
    for r in range(n_bins + 1):
        bin_ptr[r] = fill[r]
    for i in range(n_items):
        r = emit_rank[item_bin[i]]
        q = fill[r]
        fill[r] += 1
        piece_doc[q] = item_doc[i]
        piece_start[q] = item_start[i]
        piece_len[q] = item_len[i]
    return n_bins
