"""Kernels that write the streaming packer's rows (:mod:`mmpack.streaming.placement`) from a
token source (a store's mapping): the placed pieces and the padding, O(tokens).  The placement
itself is :func:`mmpack.kernels.plan_bestfit.place_batch` (the plan's free-space index);
:mod:`mmpack.kernels.streaming_batch` lays the batch out.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["pad_rows", "scatter_pieces"]


@njit
def scatter_pieces(
    src: np.ndarray,
    src_starts: np.ndarray,
    lens: np.ndarray,
    rows: np.ndarray,
    offs: np.ndarray,
    out_ids: np.ndarray,
) -> None:
    """``out_ids[rows[k], offs[k]:+lens[k]] = src[src_starts[k]:+lens[k]]`` for every piece k.

    Parameters
    ----------
    src : numpy.ndarray, integer, 1-D
        Token source (e.g. a store's mapped token array); offsets are int64.
    out_ids : numpy.ndarray, int64, shape (n_rows, n_cols)
        Validated by the caller: ``0 <= rows < n_rows``, ``offs + lens <= n_cols``.
    """
    for k in range(lens.shape[0]):
        r = rows[k]
        s = src_starts[k]
        o = offs[k]
        for t in range(lens[k]):
            out_ids[r, o + t] = src[s + t]


@njit
def pad_rows(used: np.ndarray, pad_id: int, out_ids: np.ndarray) -> None:
    """``out_ids[r, used[r]:] = pad_id`` for every row (int64, (n_rows, n_cols))."""
    for r in range(out_ids.shape[0]):
        out_ids[r, used[r] :] = pad_id
