"""The plan's pieces as they are stored: a document reference per piece relative to its region,
a sparse table for the pieces that start inside their document.

Layout (per :class:`~mmpack._src.packing.plan.PackingPlan`, in memory and in its file):

- ``piece_ref`` (uint32, per piece): below :data:`~mmpack._src.kernels.packed_rows.SPLIT_FLAG`, the
  piece is ``[0, piece_len)`` of document ``region_doc[r] + ref``; at or above it, the piece is
  split entry ``region_split[r] + ref - SPLIT_FLAG``; ``r`` the region of the piece's bin;
- ``piece_len`` (int32, per piece): tokens taken;
- ``split`` (int64, 2 per entry): ``(document - region_doc[r], start)`` of each piece that starts
  inside its document (the second and later pieces of a document ``long_docs="split"`` cut: a
  few per million documents on C4-like data), region by region in piece order;
- ``region_split`` (int64, per region + 1): region ``r``'s split entries are
  ``region_split[r]:region_split[r + 1]``.

So a piece costs 8 bytes and a bin 8 (``bin_ptr``), and every array but ``bin_ptr``,
``region_bin`` and ``region_split`` is relative to its region: parts of a plan are joined by
copying them (:mod:`mmpack._src.packing.plan_regions`).  Reading a bin: one binary search over the
regions, then O(1) per piece (the row kernels, :mod:`mmpack._src.kernels.packed_rows`).  A region
holds fewer than ``SPLIT_FLAG`` documents and pieces (:func:`check_region_size`).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels.packed_rows import SPLIT_FLAG
from mmpack.errors import FormatError

__all__ = ["MAX_REGION_ITEMS", "check_region_size", "decode_pieces", "encode_region"]

MAX_REGION_ITEMS = SPLIT_FLAG - 1
"""The most documents, and the most pieces, one region may hold (a uint32 reference each)."""


def check_region_size(n_docs: int, n_pieces: int, region: int) -> None:
    """Raise ``ValueError`` unless a region of ``n_docs`` documents packed into ``n_pieces``
    pieces fits the references (at most :data:`MAX_REGION_ITEMS` of each)."""
    most = max(int(n_docs), int(n_pieces))
    if most > MAX_REGION_ITEMS:
        raise ValueError(
            f"plan region {region} holds {n_docs} documents in {n_pieces} pieces; a region "
            f"holds at most {MAX_REGION_ITEMS} of each: pass a smaller region_tokens "
            "(region_tokens=None packs the whole store as one region)"
        )


def encode_region(docs: np.ndarray, starts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write the references of one region's pieces into ``out`` (uint32, (m,)) and return its
    split entries (int64, (2 * k,)).

    Parameters
    ----------
    docs : numpy.ndarray, int64, shape (m,)
        Each piece's document, counted from the region's first (in ``[0, MAX_REGION_ITEMS]``,
        :func:`check_region_size`).
    starts : numpy.ndarray, int64, shape (m,)
        Each piece's first token inside its document.
    """
    split = np.flatnonzero(starts != 0)
    out[:] = docs
    out[split] = SPLIT_FLAG + np.arange(split.shape[0], dtype=np.int64)
    entries = np.empty((split.shape[0], 2), dtype=np.int64)
    entries[:, 0] = docs[split]
    entries[:, 1] = starts[split]
    return entries.reshape(-1)


def decode_pieces(
    bin_ptr: np.ndarray,
    piece_ref: np.ndarray,
    split: np.ndarray,
    region_bin: np.ndarray,
    region_doc: np.ndarray,
    region_split: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(piece_doc, piece_start)`` (int64, (n_pieces,)) of every piece, in the store's numbering.
    O(n_pieces) time and memory.  ``FormatError`` for a reference outside its region's split
    entries or bins outside the regions."""
    n_pieces = piece_ref.shape[0]
    counts: np.ndarray = np.diff(np.asarray(bin_ptr, dtype=np.int64))
    per_region: np.ndarray = np.diff(np.asarray(region_bin, dtype=np.int64))
    if (
        int(region_bin[-1]) != counts.shape[0]
        or int(counts.sum()) != n_pieces
        or (counts < 0).any()
        or (per_region < 0).any()
    ):
        raise FormatError("plan: bin_ptr and region_bin do not cut the pieces in order")
    bin_region = np.repeat(np.arange(region_bin.shape[0] - 1), per_region)
    piece_region = np.repeat(bin_region, counts)
    ref = piece_ref.astype(np.int64)
    docs = np.asarray(region_doc, dtype=np.int64)[piece_region] + ref
    starts = np.zeros(n_pieces, dtype=np.int64)
    cut = np.flatnonzero(ref >= SPLIT_FLAG)
    if cut.size:
        r = piece_region[cut]
        j = region_split[r] + ref[cut] - SPLIT_FLAG
        if (j >= region_split[r + 1]).any() or 2 * int(region_split[-1]) > split.shape[0]:
            raise FormatError("plan: a piece names a split entry outside its region")
        docs[cut] = region_doc[r] + split[2 * j]
        starts[cut] = split[2 * j + 1]
    return docs, starts
