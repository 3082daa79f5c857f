"""Provenance kernels: the document pieces of a batch's sources laid into the batch's order.

A batch drawn from several sources (a mixture) holds, per source ``k``, the rows ``where`` it
filled and that source's own pieces (a ``(6, m_k)`` block in row order with its row offsets, as
:func:`~mmpack._src.kernels.window.window_pieces` or :func:`~mmpack._src.kernels.packed_rows.bin_pieces`
wrote them).  :func:`place_pieces`, called once per source to count, gives every batch row its
number of pieces (their prefix sum, ``cu_docs``, is the batch's row offsets), then once per
source to copy that source's block into the batch's at the columns its rows own, renaming each
piece's row and stamping the source: no sort.  Cost: O(K + m_k) per source.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["place_pieces"]


@njit
def place_pieces(
    block: np.ndarray,
    row_ptr: np.ndarray,
    where: np.ndarray,
    cu_docs: np.ndarray,
    source: int,
    out: np.ndarray,
) -> None:
    """Count (``out`` empty) or write (``out`` of ``cu_docs[-1]`` columns) one source's pieces
    in the batch's block.

    Parameters
    ----------
    block : ndarray, int64, (6, row_ptr[-1])
        The source's pieces, rows ``sample, doc, start, stop, eot, at`` (its own batch's rows).
    row_ptr : ndarray, int64, (K + 1,)
        Its rows' offsets into ``block``.
    where : ndarray, int64, (K,)
        The batch row of each of its rows (checked: distinct, ``0 <= where[r] < len(cu_docs) -
        1``).
    cu_docs : ndarray, int64, (B + 1,)
        Counting: ``cu_docs[where[r] + 1]`` receives row ``r``'s number of pieces (its prefix
        sum is then the batch's row offsets).  Writing: the batch's row offsets, batch row
        ``where[r]`` owning ``row_ptr[r + 1] - row_ptr[r]`` columns of ``out``.
    source : int
        Written into row 6 of every column written.
    out : ndarray, int64, (7, 0) or (7, cu_docs[-1])
        Receives, at columns ``cu_docs[where[r]] ..``, row ``r``'s pieces with ``sample =
        where[r]`` and ``source``.
    """
    if out.shape[1] == 0:
        for r in range(where.shape[0]):
            cu_docs[where[r] + 1] = row_ptr[r + 1] - row_ptr[r]
        return
    for r in range(where.shape[0]):
        b = where[r]
        c = cu_docs[b] - row_ptr[r]
        for q in range(row_ptr[r], row_ptr[r + 1]):
            out[0, c + q] = b
            for f in range(1, 6):
                out[f, c + q] = block[f, q]
            out[6, c + q] = source
