"""Provenance kernels: the documents and token ranges a batch of samples holds, as flat arrays.

A sample's provenance is the list its view's ``locate`` gives (one entry per document piece, in
row order: document ``doc``, token range ``[start, stop)`` inside it, ``eot`` 1 when the
document's eot follows the piece in the row, ``at`` the row position the piece starts at); a
batch's is those lists laid end to end, row ``r`` owning entries ``row_ptr[r] .. row_ptr[r + 1]``.

:func:`window_pieces` walks the documents a window of the virtual stream ``S`` (see
:mod:`mmpack.kernels.window`) spans: it finds the first one by the same search as the copy
(:func:`~mmpack.kernels.window.find_doc`), then steps through ``offsets`` until the window's end;
a document whose span in ``S`` is empty (an empty document without eot) is not listed.  It runs
twice per batch, once to count (``fill=0``: the prefix sum of the pieces per window into
``row_ptr``) and once to write, into one ``(6, m)`` array whose rows are the fields.  :func:`bin_pieces` reads the pieces of packed bins from the plan, given the lengths
and eot flags :func:`~mmpack.kernels.packed_rows.select_pieces` already checked.  Cost:
O(log n_docs + documents spanned) per window, O(pieces) per packed batch; no token is read.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit
from mmpack.kernels.window import find_doc

__all__ = ["bin_pieces", "window_pieces"]


@njit
def window_pieces(
    offsets: np.ndarray,
    top: np.ndarray,
    use_eot: int,
    vstarts: np.ndarray,
    width: int,
    total: int,
    fill: int,
    row_ptr: np.ndarray,
    out: np.ndarray,
) -> None:
    """The document pieces of the windows ``S[v : min(v + width, total)]``, ``v`` in ``vstarts``
    (each ``0 <= v < total``).

    ``fill=0``: ``row_ptr`` (int64, (K + 1,), ``row_ptr[0] = 0``) becomes the prefix sum of the
    pieces per window (``out`` untouched, may be empty).  ``fill=1``: given that ``row_ptr``,
    piece ``q`` of window ``k`` is column ``row_ptr[k] + q`` of ``out`` (int64, (6, row_ptr[K])),
    whose rows are the window ``k``, the document, ``start``, ``stop``, ``eot`` and ``at``.
    """
    for k in range(vstarts.shape[0]):
        v0 = vstarts[k]
        v = v0
        end = min(v0 + width, total)
        j = find_doc(offsets, top, use_eot, v0)
        q = row_ptr[k]
        while v < end:
            doc_v0 = offsets[j] + j * use_eot
            dl = offsets[j + 1] - offsets[j]
            seg_end = doc_v0 + dl + use_eot
            stop_v = min(seg_end, end)
            if stop_v > v:
                if fill:
                    out[0, q] = k
                    out[1, q] = j
                    out[2, q] = min(v - doc_v0, dl)
                    out[3, q] = min(stop_v - doc_v0, dl)
                    out[4, q] = 1 if use_eot and stop_v == seg_end else 0
                    out[5, q] = v - v0
                q += 1
                v = stop_v
            j += 1
        if not fill:
            row_ptr[k + 1] = q


@njit
def bin_pieces(
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    bins: np.ndarray,
    row_ptr: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
    out: np.ndarray,
) -> None:
    """The pieces of packed bins ``bins`` (checked: ``row_ptr`` is the prefix sum of their piece
    counts, ``lengths`` and ``has_eot`` (int64, (row_ptr[-1],)) their lengths and eot flags as
    :func:`~mmpack.kernels.packed_rows.select_pieces` wrote them): piece ``q`` of row ``r`` is
    column ``row_ptr[r] + q`` of ``out`` (int64, (6, row_ptr[-1])), whose rows are the row ``r``,
    the document, ``start``, ``stop``, ``eot`` and ``at`` (the lengths and eots of the pieces
    before it in the row)."""
    for r in range(bins.shape[0]):
        lo = bin_ptr[bins[r]] - row_ptr[r]
        a = 0
        for p in range(row_ptr[r], row_ptr[r + 1]):
            s = piece_start[lo + p]
            out[0, p] = r
            out[1, p] = piece_doc[lo + p]
            out[2, p] = s
            out[3, p] = s + lengths[p]
            out[4, p] = has_eot[p]
            out[5, p] = a
            a += lengths[p] + has_eot[p]
