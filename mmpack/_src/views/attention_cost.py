"""What a sample's causal attention costs, from the plan or the offsets, without reading a token.

A row's attention over its segments (its ``cu_seqlens``: every document piece with its eot, and
the padding of a packed or a last window) costs about ``sum(s**2)`` over the segment lengths
``s``: the cost :mod:`mmpack._src.sampling.balance` deals steps by.  A packed view's segments are
its plan's pieces (:func:`~mmpack._src.views.packed_gather.piece_ranges`, the ranges its read takes);
a window's are the documents it spans (:func:`~mmpack._src.kernels.window.window_pieces`, its
provenance kernel, over the ``seqlen`` input positions).  Cost: O(pieces) of the rows asked
(a window also one binary search for its first document).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.core.validation import check_indices
from mmpack._src.kernels.window import find_doc, window_pieces

__all__ = ["packed_costs", "row_costs", "window_costs"]


def row_costs(segments: np.ndarray, row_ptr: np.ndarray, seqlen: int) -> np.ndarray:
    """``sum(s**2)`` per row over its segments ``segments[row_ptr[b]:row_ptr[b + 1]]`` (int64)
    plus its padding, ``seqlen`` minus the segments' total, as one more segment (int64, (B,))."""
    rows = row_ptr.shape[0] - 1
    owner = np.repeat(np.arange(rows, dtype=np.int64), np.diff(row_ptr))
    squares = np.bincount(owner, weights=(segments * segments).astype(np.float64), minlength=rows)
    covered = np.bincount(owner, weights=segments.astype(np.float64), minlength=rows)
    pad = seqlen - covered.astype(np.int64)
    return squares.astype(np.int64) + pad * pad


def packed_costs(ds: Any, indices: Any) -> np.ndarray:
    """The costs of bins ``indices`` of the ``PackedDataset`` ``ds`` (int64, (k,))."""
    idx = check_indices(indices, len(ds))
    _, lengths, has_eot, row_ptr, _ = ds._piece_ranges(idx)
    return row_costs(lengths + has_eot, row_ptr, ds.seqlen)


def window_costs(ds: Any, indices: Any) -> np.ndarray:
    """The costs of windows ``indices`` of the ``WindowDataset`` ``ds`` (int64, (k,))."""
    idx = check_indices(indices, len(ds))
    vstarts = idx * ds.stride
    offsets, top, use_eot = ds._offsets, ds._top, ds._use_eot
    first = np.array([find_doc(offsets, top, use_eot, v) for v in vstarts.tolist()], np.int64)
    block, row_ptr = window_pieces(offsets, use_eot, first, vstarts, ds.seqlen, ds.total)
    return row_costs(block[3] - block[2] + block[4], row_ptr, ds.seqlen)
