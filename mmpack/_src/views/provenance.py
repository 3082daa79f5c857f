"""Where the samples of a batch come from: the document pieces of every row, as flat arrays.

A batch's provenance is its samples' ``locate`` lists laid end to end, one entry per document
piece, in row order, as a dict of int64 arrays of one length ``m``: ``sample`` (the row,
non-decreasing), ``doc`` (of the parent store for a subset: :func:`parent_docs`), ``start`` and
``stop`` (the piece's token range in its document), ``eot`` (1 when the document's eot follows
the piece), ``at`` (the row position it starts at: it fills ``[at, at + stop - start + eot)``)
and, from a :class:`~mmpack.Mixture`, ``source``; plus ``cu_docs`` (int64, (B +
1,)): row ``r`` owns entries ``cu_docs[r] .. cu_docs[r + 1]``.  A window lists every document it
spans (an entry with ``start == stop`` and ``eot=1`` holds only that document's eot); a packed
row lists its pieces, padding not listed.  Entry for entry what ``view.locate(i)`` returns
(``tests/views/test_provenance.py``).

A view's ``__getitems__`` hands its :class:`~mmpack.store.SampleBatch` the means to compute
this (:func:`window_provenance`, :func:`packed_provenance`, :func:`merged_provenance`) without
computing it: a batch pays only when asked (``collate(..., provenance=True)``).  Kernels:
:func:`~mmpack._src.kernels.window.window_pieces` and :func:`~mmpack._src.kernels.packed_rows.bin_pieces`,
each writing one ``(6, m)`` int64 array whose rows are :data:`PIECE_FIELDS`.

Cost: a window batch one kernel call of O(documents spanned) per row (no search again); a
packed batch one pass over its pieces; a mixture's, its sources' plus one copy into the batch's
row order (:func:`~mmpack._src.kernels.provenance.place_pieces`, O(m), no sort);
``python -m benchmarks.bench_provenance``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from mmpack._src.kernels.packed_rows import bin_pieces
from mmpack._src.kernels.provenance import place_pieces
from mmpack._src.kernels.window import window_pieces

__all__ = [
    "PIECE_FIELDS",
    "Pieces",
    "Provenance",
    "merged_provenance",
    "packed_provenance",
    "parent_docs",
    "parent_located",
    "window_provenance",
]

PIECE_FIELDS: tuple[str, ...] = ("sample", "doc", "start", "stop", "eot", "at")
"""The per-piece arrays of every provenance (a mixture's adds ``source``)."""

_COUNT = np.empty((len(PIECE_FIELDS) + 1, 0), dtype=np.int64)  # place_pieces' counting pass

Provenance = dict[str, np.ndarray]
"""``{"sample", "doc", "start", "stop", "eot", "at"[, "source"]: int64 (m,), "cu_docs": int64
(B + 1,)}`` (see the module docstring)."""


class Pieces(NamedTuple):
    """A batch's provenance as computed: ``block`` (int64, (len(fields), m)) holds one field a
    row, named by ``fields`` (:data:`PIECE_FIELDS`, a mixture's also ``source``); ``cu_docs``
    (int64, (B + 1,)) the rows' offsets into it."""

    fields: tuple[str, ...]
    block: np.ndarray
    cu_docs: np.ndarray

    def as_dict(self) -> Provenance:
        """The :data:`Provenance` dict (the fields are views of ``block``)."""
        out = dict(zip(self.fields, self.block))
        out["cu_docs"] = self.cu_docs
        return out


def parent_docs(store: Any, doc: np.ndarray) -> np.ndarray:
    """Document ids ``doc`` (int64, (m,)) of ``store`` as ids of the store it is a subset of:
    ``store.parent_doc_ids[doc]`` when the store has such an array (int64, (len(store),)), else
    ``doc`` itself.  Every document id a view reports goes through here."""
    ids = getattr(store, "parent_doc_ids", None)
    if ids is None:
        return doc
    return np.asarray(ids, dtype=np.int64)[doc]


def parent_located(store: Any, pieces: list[dict[str, int]]) -> list[dict[str, int]]:
    """A ``locate`` list of ``store`` with each ``"doc"`` mapped by :func:`parent_docs`."""
    if getattr(store, "parent_doc_ids", None) is None:
        return pieces
    docs = parent_docs(store, np.array([p["doc"] for p in pieces], dtype=np.int64)).tolist()
    return [{**p, "doc": d} for p, d in zip(pieces, docs)]


def _finished(store: Any, block: np.ndarray, cu_docs: np.ndarray) -> Pieces:
    """``Pieces`` of the kernel's ``block``, its documents mapped by :func:`parent_docs`."""
    if getattr(store, "parent_doc_ids", None) is not None:
        block[1] = parent_docs(store, block[1])
    return Pieces(PIECE_FIELDS, block, cu_docs)


def window_provenance(ds: Any, vstarts: np.ndarray, first: np.ndarray) -> Pieces:
    """The provenance of the windows of ``ds`` (a ``WindowDataset``) starting at virtual
    positions ``vstarts`` (int64, (B,), windows of ``ds``: ``index * stride``) in documents
    ``first`` (int64, (B,), what the read's kernel found)."""
    block, row_ptr = window_pieces(ds._offsets, ds._use_eot, first, vstarts, ds.width, ds.total)
    return _finished(ds.store, block, row_ptr)


def packed_provenance(ds: Any, idx: np.ndarray, ranges: tuple[np.ndarray, ...]) -> Pieces:
    """The provenance of bins ``idx`` (int64, (B,), checked) of ``ds`` (a ``PackedDataset``),
    from the ``(starts, lengths, has_eot, row_ptr, counts)`` its read checked
    (:func:`~mmpack._src.views.packed_gather.piece_ranges`)."""
    _, lengths, has_eot, row_ptr, _ = ranges
    plan = ds._plan  # the read checked bins idx (PackedDataset._check_bins)
    block = np.empty((len(PIECE_FIELDS), int(row_ptr[-1])), dtype=np.int64)
    if idx.shape[0]:
        layout = (plan.bin_ptr, plan.piece_ref, plan.regions, plan.split)
        bin_pieces(*layout, idx, row_ptr, lengths, has_eot, block)
    return _finished(ds.store, block, row_ptr)


def merged_provenance(
    parts: Sequence[tuple[int, np.ndarray, Callable[[], Pieces]]], n: int
) -> Pieces:
    """The provenance of a batch of ``n`` rows gathered from several sources: ``parts`` holds,
    per source ``k``, the batch rows ``where`` (int64, distinct, together every row once) it
    filled and its own batch's :class:`Pieces` function; the pieces of each row keep their
    order and gain ``source`` (:func:`~mmpack._src.kernels.provenance.place_pieces`, one call per
    source)."""
    got = [(k, where, pieces()) for k, where, pieces in parts]
    cu_docs = np.zeros(n + 1, dtype=np.int64)
    block = _COUNT
    for k, where, p in got:  # each row's number of pieces
        place_pieces(p.block, p.cu_docs, where, cu_docs, k, block)
    np.cumsum(cu_docs, out=cu_docs)
    block = np.empty((len(PIECE_FIELDS) + 1, int(cu_docs[-1])), dtype=np.int64)
    for k, where, p in got:
        place_pieces(p.block, p.cu_docs, where, cu_docs, k, block)
    return Pieces((*PIECE_FIELDS, "source"), block, cu_docs)
