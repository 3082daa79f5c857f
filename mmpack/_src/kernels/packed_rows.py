"""Packed-row assembly kernels: a batch of plan bins becomes model inputs.

:func:`select_pieces` turns a batch of bins into the flat token ranges of their pieces, checked
against the documents (a corrupt plan is reported, never read out of bounds; the ranges may lie
in another array that holds the documents, a subset's parent); :func:`fill_rows`, the one row
writer of the packed view's bins and the streaming packer's batches
(:mod:`mmpack._src.kernels.streaming_batch`) alike, writes the rows from them; :func:`one_bin` is
both for a single bin, with few arguments; :func:`mask_pieces` applies a loss mask to rows
already written; :func:`bin_pieces` gives a batch's provenance.  Every segment is written by the
same helpers (:func:`_segment_positions`, :func:`_segment_ids` and the one label rule,
:func:`_segment_labels`: plain loops LLVM vectorises).

Cost O(B * seqlen).  A single bin (``ds[i]``, 2048 tokens) is bound by memory, not by the
loops: the chain of dependent reads ``bin_ptr`` -> pieces -> ``offsets`` -> tokens, the
scattered token lines of its pieces, and writing four rows of ``seqlen`` values; numba's
dispatch types each of :func:`one_bin`'s ten arguments on every call.  Measured, stage by
stage, with ``python -m benchmarks.bench_getitem --quick --profile``.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = [
    "LABELS_HF",
    "LABELS_NEXT",
    "LABELS_NONE",
    "SPLIT_FLAG",
    "bin_pieces",
    "fill_rows",
    "mask_pieces",
    "one_bin",
    "select_pieces",
    "stream_rows",
]

LABELS_NONE = 0
LABELS_NEXT = 1
LABELS_HF = 2
SPLIT_FLAG = 1 << 31
"""A piece reference at or above this names a split entry (``ref - SPLIT_FLAG`` into its
region's), below it the document (``ref``, from the region's first); see
:mod:`mmpack._src.packing.plan_pieces`."""
_NO_MASK = np.zeros(0, dtype=np.uint8)  # a segment without a loss mask (a frozen constant)
_NO_STARTS = np.zeros(0, dtype=np.int64)


@njit
def _bin_region(regions: np.ndarray, b: int) -> tuple[int, int]:
    """``(first document, first split entry)`` of the region of bin ``b``: one binary search
    over ``regions[0]`` (its ``region_bin``), clamped to a region that exists."""
    r = int(np.searchsorted(regions[0], b, side="right")) - 1
    r = min(max(r, 0), regions.shape[1] - 1)
    return int(regions[1, r]), int(regions[2, r])


@njit
def _piece(
    piece_ref: np.ndarray, split: np.ndarray, doc0: int, split0: int, p: int
) -> tuple[int, int]:
    """``(document, start)`` of piece ``p`` of a bin of the region whose first document is
    ``doc0`` and first split entry ``split0``; document -1 for a split reference outside
    ``split`` (refused by the callers' document check)."""
    v = int(piece_ref[p])
    if v < SPLIT_FLAG:
        return doc0 + v, 0
    j = 2 * (split0 + v - SPLIT_FLAG)
    if j < 0 or j + 1 >= split.shape[0]:
        return -1, 0
    return doc0 + int(split[j]), int(split[j + 1])


@njit
def select_pieces(
    bin_ptr: np.ndarray,
    piece_ref: np.ndarray,
    piece_len: np.ndarray,
    regions: np.ndarray,
    split: np.ndarray,
    offsets: np.ndarray,
    doc_starts: np.ndarray,
    seqlen: int,
    eot: int,
    bins: np.ndarray,
    row_ptr: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
) -> int:
    """Token ranges of the pieces of ``bins`` (indices already checked, ``row_ptr`` the
    prefix sum of their piece counts, each bin's piece range inside the piece arrays; the
    plan's layout: :mod:`mmpack._src.packing.plan_pieces`): piece ``(d, s, n)`` is ``[doc_starts[d] + s, doc_starts[d] + s + n)``, checked against document
    ``d``'s length ``offsets[d + 1] - offsets[d]``.  ``doc_starts`` (int64, shape
    (>= docs,)) is ``offsets`` for ranges in the store's own flat tokens, or where each
    document starts in the array that holds it (a subset's parent:
    :func:`mmpack._src.store.subset.token_source`).

    Returns -1, or the first row whose bin is inconsistent with the documents (a piece outside
    its document, or more than ``seqlen`` slots); nothing is read out of bounds either way.
    """
    n_docs = offsets.shape[0] - 1
    for r in range(bins.shape[0]):
        lo = bin_ptr[bins[r]]
        doc0, split0 = _bin_region(regions, bins[r])
        used = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            p = lo + q - row_ptr[r]
            d, s = _piece(piece_ref, split, doc0, split0, p)
            ln = piece_len[p]
            if d < 0 or d >= n_docs or s < 0 or ln < 0:
                return r
            dl = offsets[d + 1] - offsets[d]
            if s > dl or ln > dl - s:
                return r
            e = 0
            if eot != 0 and ln < seqlen:
                e = 1
            used += ln + e
            starts[q] = doc_starts[d] + s
            lengths[q] = ln
            has_eot[q] = e
        if used > seqlen:
            return r
    return -1


@njit
def _segment_positions(pos: np.ndarray) -> None:
    """Positions ``0, 1, ...`` of one segment (a view of its slots)."""
    for i in range(pos.shape[0]):
        pos[i] = i


@njit
def _segment_ids(seg_src: np.ndarray, e: int, eot_id: int, ids: np.ndarray) -> None:
    """``input_ids`` of one segment: the piece ``seg_src`` (n tokens), then eot when ``e``
    (``ids`` a view of its ``n + e`` slots)."""
    n = seg_src.shape[0]
    for i in range(n):
        ids[i] = seg_src[i]
    if e != 0:
        ids[n] = eot_id


@njit
def _segment_labels(
    seg_src: np.ndarray,
    e: int,
    eot_id: int,
    label_mode: int,
    ignore: int,
    lab: np.ndarray,
    seg_mask: np.ndarray,
) -> None:
    """The label rule, of one segment: the piece ``seg_src`` (n tokens) then eot when ``e``,
    ``lab`` a view of its ``n + e`` slots.  Labels are read from the source (not from the ids
    just written), so the loops are plain vectorised copies: ``LABELS_NEXT`` the next token
    (``ignore`` at the segment's last slot), ``LABELS_HF`` the token itself (``ignore`` at its
    first slot), ``LABELS_NONE`` ``ignore`` everywhere.  A non-empty ``seg_mask`` (uint8, (n,):
    the piece's loss mask) makes a label ``ignore`` where its token's mask is 0."""
    n = seg_src.shape[0]
    m = n + e
    if m == 0:
        return
    masked = seg_mask.shape[0] > 0
    if label_mode == LABELS_NEXT:
        if masked:
            for i in range(n - 1):
                lab[i] = seg_src[i + 1] if seg_mask[i + 1] != 0 else ignore
        else:
            for i in range(n - 1):
                lab[i] = seg_src[i + 1]
        if e != 0 and n > 0:
            lab[n - 1] = eot_id
        lab[m - 1] = ignore
    elif label_mode == LABELS_HF:
        lab[0] = ignore
        if masked:
            for i in range(1, n):
                lab[i] = seg_src[i] if seg_mask[i] != 0 else ignore
        else:
            for i in range(1, n):
                lab[i] = seg_src[i]
        if e != 0 and n > 0:
            lab[n] = eot_id
    else:
        for i in range(m):
            lab[i] = ignore


@njit
def _padding(
    pad_id: int, ignore: int, ids: np.ndarray, pos: np.ndarray, lab: np.ndarray, att: np.ndarray
) -> None:
    """The padding segment (views of its slots): ``pad_id``, positions from 0, ``ignore``,
    mask 0."""
    for i in range(ids.shape[0]):
        ids[i] = pad_id
    for i in range(pos.shape[0]):
        pos[i] = i
    for i in range(lab.shape[0]):
        lab[i] = ignore
    for i in range(att.shape[0]):
        att[i] = 0


@njit
def fill_rows(
    src: np.ndarray,
    src_starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
    row_ptr: np.ndarray,
    eot_id: int,
    pad_id: int,
    label_mode: int,
    ignore: int,
    input_ids: np.ndarray,
    position_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
    cu_seqlens: np.ndarray,
    n_segments: np.ndarray,
    max_seqlen: np.ndarray,
    mask: np.ndarray,
    mask_starts: np.ndarray,
) -> None:
    """Write rows ``r`` of the (B, seqlen) outputs from pieces ``row_ptr[r]:row_ptr[r+1]``.

    ``src[src_starts[q]:src_starts[q]+lengths[q]]`` must be in bounds and each row's pieces
    (plus their eot) must fit in seqlen (both checked by the caller).  With a loss mask
    (``mask_starts`` of shape (pieces,), ``mask[mask_starts[q]:+lengths[q]]`` in bounds; empty
    arrays for none), a causal label is ``ignore`` (the label of a position without loss,
    :data:`mmpack._src.core.constants.IGNORE_INDEX`) where the token it holds has mask 0.
    ``cu_seqlens`` is (B, C) with C >= (the most pieces of a row) + 2; row r's boundaries are
    ``cu_seqlens[r, :n_segments[r] + 1]``, padding (if any) being the last segment (the entries
    past them are unspecified); ``max_seqlen[r]`` its longest segment, padding included.
    ``position_ids`` or ``labels`` of shape (B, 0) are not written (a caller that has no use
    for them: the streaming packer).
    """
    # Work on 1-D row and segment views: LLVM vectorises these loops (not the 2-D indexing).
    seqlen = input_ids.shape[1]
    masked = mask_starts.shape[0] > 0
    positioned = position_ids.shape[1] > 0
    labelled = labels.shape[1] > 0
    # First one load of every piece's first token (and mask), for the whole batch: pieces lie
    # anywhere in src, and this puts all their page walks and cache misses in flight together
    # instead of one piece's after the previous piece's copy.  The sum lands in row 0's last
    # cu_seqlens slot, past its boundaries or overwritten by them, so the loads are kept.
    acc = 0
    for q in range(row_ptr[0], row_ptr[input_ids.shape[0]]):
        if lengths[q] > 0:
            acc += src[src_starts[q]]
            if masked:
                acc += mask[mask_starts[q]]
    if input_ids.shape[0] > 0:
        cu_seqlens[0, cu_seqlens.shape[1] - 1] = acc
    for r in range(input_ids.shape[0]):
        ids = input_ids[r]
        pos = position_ids[r]
        lab = labels[r]
        att = attention_mask[r]
        t = 0
        seg = 0
        longest = 0
        cu_seqlens[r, 0] = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            a, n, e = src_starts[q], lengths[q], has_eot[q]
            m = n + e
            if positioned:
                _segment_positions(pos[t : t + m])
            seg_src = src[a : a + n]
            _segment_ids(seg_src, e, eot_id, ids[t : t + m])
            if labelled:
                seg_mask = mask[mask_starts[q] : mask_starts[q] + n] if masked else _NO_MASK
                _segment_labels(seg_src, e, eot_id, label_mode, ignore, lab[t : t + m], seg_mask)
            t += m
            seg += 1
            cu_seqlens[r, seg] = t
            longest = max(longest, m)
        att[:t] = 1  # the row's segments, in one fill
        if t < seqlen:
            _padding(pad_id, ignore, ids[t:], pos[t:], lab[t:], att[t:])
            seg += 1
            cu_seqlens[r, seg] = seqlen
            longest = max(longest, seqlen - t)
        n_segments[r] = seg
        max_seqlen[r] = longest


@njit
def stream_rows(
    src: np.ndarray, placed: np.ndarray, no_eot: np.ndarray, rows: np.ndarray, params: np.ndarray,
    input_ids: np.ndarray, labels: np.ndarray, attention_mask: np.ndarray, cu_seqlens: np.ndarray,
    mask: np.ndarray, mask_starts: np.ndarray,
) -> None:  # fmt: skip
    """:func:`fill_rows` of a streaming batch, its arguments folded (numba's dispatch costs about
    0.1 us an argument): piece ``q`` is ``src[placed[4, q]:][:placed[0, q]]`` (``placed`` as
    :func:`~mmpack._src.kernels.streaming_batch.layout_batch` writes it), ``no_eot`` int64 zeros
    (one per piece at least), ``rows`` (int64, ``3 * B + 1``) ``row_ptr`` then out the segments
    and the longest segment of each row, ``params`` ``[pad_id, label_mode, ignore]``,
    ``cu_seqlens`` the ``(B, C)`` boundaries flat (int32, ``B * C``); no positions, no eot."""
    b = input_ids.shape[0]
    cu = cu_seqlens.reshape((b, cu_seqlens.shape[0] // max(b, 1)))
    fill_rows(
        src, placed[4], placed[0], no_eot, rows[: b + 1], 0, params[0], params[1], params[2],
        input_ids, labels[:, :0], labels, attention_mask, cu, rows[b + 1 : 2 * b + 1],
        rows[2 * b + 1 : 3 * b + 1], mask, mask_starts,
    )  # fmt: skip


@njit
def one_bin(
    bin_ptr: np.ndarray,
    piece_ref: np.ndarray,
    piece_len: np.ndarray,
    regions: np.ndarray,
    split: np.ndarray,
    offsets: np.ndarray,
    src: np.ndarray,
    b: int,
    params: np.ndarray,
    out: np.ndarray,
    cu: np.ndarray,
) -> tuple[int, int]:
    """The rows of the single bin ``b``: :func:`select_pieces` then :func:`fill_rows` over one
    row, reading straight from the whole flat token array ``src``.  ``params``
    is ``[seqlen, eot, eot_id, pad_id, label_mode, cu_at, ignore]`` (``ignore``: the label of a
    position without loss); ``out`` (1-D, int64 or int32, at
    least ``4 * seqlen``) receives ids, positions, labels, attention mask one after the other;
    ``cu[cu_at:]`` (1-D int32, ``C`` entries) the segment boundaries: with int32 output ``cu``
    may be ``out`` itself and ``cu_at >= 4 * seqlen`` (one array unboxed less per call).
    Few arguments: numba's dispatch cost grows with each one, and this is the single-sample
    path.

    Returns ``(n_segments, longest_segment)``, or ``(-1, 0)`` when the bin is inconsistent with
    the plan or the documents (``b`` outside ``bin_ptr``, a decreasing or out-of-range
    ``bin_ptr``, a piece outside its document, more than ``seqlen`` slots), or ``(-2, 0)`` when
    ``cu`` has fewer than ``pieces + 2`` entries or ``out`` fewer than ``4 * seqlen``; nothing
    is read out of bounds then, nor written to ``out`` (``cu`` may be).  ``cu_at`` must be
    >= 0 (and, when ``cu`` is ``out``, >= ``4 * seqlen``): the caller's to check."""
    seqlen = params[0]
    cu = cu[params[5] :]
    if b < 0 or b + 1 >= bin_ptr.shape[0]:
        return -1, 0
    lo, hi = bin_ptr[b], bin_ptr[b + 1]
    if lo < 0 or hi < lo or hi > piece_ref.shape[0]:
        return -1, 0
    n = hi - lo
    if n + 2 > cu.shape[0] or out.shape[0] < 4 * seqlen:
        return -2, 0
    # One scratch array: the bin, row_ptr, the segments and longest segment, then the pieces'
    # starts, lengths and eot flags.
    scratch = np.empty(5 + 3 * n, dtype=np.int64)
    scratch[0], scratch[1], scratch[2] = b, 0, n
    ranges = scratch[5:].reshape((3, n))
    layout = (bin_ptr, piece_ref, piece_len, regions, split, offsets, offsets, seqlen, params[1])
    if select_pieces(*layout, scratch[:1], scratch[1:3], ranges[0], ranges[1], ranges[2]) >= 0:
        return -1, 0
    rows = out[: 4 * seqlen].reshape((4, 1, seqlen))
    fill_rows(
        src, ranges[0], ranges[1], ranges[2], scratch[1:3], params[2], params[3], params[4],
        params[6], rows[0], rows[1], rows[2], rows[3], cu.reshape((1, cu.shape[0])),
        scratch[3:4], scratch[4:5], _NO_MASK, _NO_STARTS,
    )  # fmt: skip
    return scratch[3], scratch[4]


@njit
def mask_pieces(
    mask: np.ndarray,
    mask_starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
    row_ptr: np.ndarray,
    shift: int,
    fill: int,
    out: np.ndarray,
) -> None:
    """Write ``fill`` into ``out[r, p - shift]`` for every position ``p`` of row ``r`` that holds
    a piece's token whose loss mask is 0 (positions before 0 skipped): with ``shift=1`` the
    causal labels that predict it (``label_shift="next"``), with ``shift=0`` its own label
    (``"hf"``) or its MLM eligibility.

    Parameters
    ----------
    mask : ndarray, uint8
        Piece ``q``'s mask is ``mask[mask_starts[q] : mask_starts[q] + lengths[q]]``
        (validated).
    lengths, has_eot : ndarray, int64, (pieces,)
        The pieces in row order (:func:`select_pieces`); a piece with an eot takes one more
        position.
    row_ptr : ndarray, int64, (rows + 1,)
    out : ndarray, (rows, seqlen)
    """
    for r in range(row_ptr.shape[0] - 1):
        at = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            a = mask_starts[q]
            for i in range(lengths[q]):
                p = at + i - shift
                if mask[a + i] == 0 and p >= 0:
                    out[r, p] = fill
            at += lengths[q] + has_eot[q]


@njit
def bin_pieces(
    bin_ptr: np.ndarray,
    piece_ref: np.ndarray,
    regions: np.ndarray,
    split: np.ndarray,
    bins: np.ndarray,
    row_ptr: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
    out: np.ndarray,
) -> None:
    """The pieces of packed bins ``bins`` (checked: ``row_ptr`` is the prefix sum of their piece
    counts, ``lengths`` and ``has_eot`` (int64, (row_ptr[-1],)) their lengths and eot flags as
    :func:`~mmpack._src.kernels.packed_rows.select_pieces` wrote them): piece ``q`` of row ``r`` is
    column ``row_ptr[r] + q`` of ``out`` (int64, (6, row_ptr[-1])), whose rows are the row ``r``,
    the document, ``start``, ``stop``, ``eot`` and ``at`` (the lengths and eots of the pieces
    before it in the row)."""
    for r in range(bins.shape[0]):
        lo = bin_ptr[bins[r]] - row_ptr[r]
        doc0, split0 = _bin_region(regions, bins[r])
        a = 0
        for p in range(row_ptr[r], row_ptr[r + 1]):
            d, s = _piece(piece_ref, split, doc0, split0, lo + p)
            out[0, p] = r
            out[1, p] = d
            out[2, p] = s
            out[3, p] = s + lengths[p]
            out[4, p] = has_eot[p]
            out[5, p] = a
            a += lengths[p] + has_eot[p]
