"""Packed-row assembly kernels: a batch of plan bins becomes model inputs.

:func:`select_pieces` turns a batch of bins into the flat token ranges of its pieces (validated
against the document lengths; a corrupt plan is reported, never read out of bounds; a piece
shorter than ``seqlen`` is its document's last and carries the eot); :func:`fill_rows` then
writes, in one pass per row, ``input_ids``, ``position_ids``, causal labels (``label_mode``:
:data:`LABELS_NONE`, :data:`LABELS_NEXT`, :data:`LABELS_HF`), the attention mask and
``cu_seqlens``; :func:`one_bin` is both for a single bin with few arguments, and reads one
token per cache line of every piece first (the pieces lie in unrelated places and are too short
for the hardware prefetcher; touched first, their misses overlap).  Cost O(B * seqlen); a single
bin is bound by the bytes it writes (4 x seqlen x 8 with int64 output) and by four dependent
random reads (bin_ptr, the pieces, offsets, the tokens).
"""

from __future__ import annotations

import numpy as np

from mmpack.core.constants import IGNORE_INDEX
from mmpack.kernels._jit import njit

__all__ = ["LABELS_HF", "LABELS_NEXT", "LABELS_NONE", "fill_rows", "one_bin", "select_pieces"]

LABELS_NONE = 0
LABELS_NEXT = 1
LABELS_HF = 2


@njit
def select_pieces(
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    offsets: np.ndarray,
    seqlen: int,
    eot: int,
    bins: np.ndarray,
    row_ptr: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
) -> int:
    """Flat token ranges of the pieces of ``bins`` (indices already checked, ``row_ptr`` the
    prefix sum of their piece counts, each bin's piece range inside the piece arrays).

    Returns -1, or the first row whose bin is inconsistent with the documents (a piece outside
    its document, or more than ``seqlen`` slots); nothing is read out of bounds either way.
    """
    n_docs = offsets.shape[0] - 1
    for r in range(bins.shape[0]):
        lo = bin_ptr[bins[r]]
        used = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            p = lo + q - row_ptr[r]
            d = piece_doc[p]
            s = piece_start[p]
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
            starts[q] = offsets[d] + s
            lengths[q] = ln
            has_eot[q] = e
        if used > seqlen:
            return r
    return -1


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
    input_ids: np.ndarray,
    position_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
    cu_seqlens: np.ndarray,
    n_segments: np.ndarray,
    max_seqlen: np.ndarray,
) -> None:
    """Write rows ``r`` of the (B, seqlen) outputs from pieces ``row_ptr[r]:row_ptr[r+1]``.

    ``src[src_starts[q]:src_starts[q]+lengths[q]]`` must be in bounds and each row's pieces
    (plus their eot) must fit in seqlen (both checked by the caller).  ``cu_seqlens`` is (B, C)
    with C >= pieces + 2; row r's boundaries are ``cu_seqlens[r, :n_segments[r] + 1]``, padding
    (if any) being the last segment.
    """
    # Work on 1-D row and segment views: LLVM vectorises these loops (not the 2-D indexing).
    seqlen = input_ids.shape[1]
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
            s0 = t
            n = lengths[q]
            a = src_starts[q]
            seg_src = src[a : a + n]
            seg_ids = ids[s0 : s0 + n]
            for i in range(n):
                seg_ids[i] = seg_src[i]
            t += n
            if has_eot[q] != 0:
                ids[t] = eot_id
                t += 1
            m = t - s0
            seg_pos = pos[s0:t]
            seg_att = att[s0:t]
            for i in range(m):
                seg_pos[i] = i
                seg_att[i] = 1
            seg_lab = lab[s0:t]
            if m > 0:
                if label_mode == LABELS_NEXT:
                    nxt = ids[s0 + 1 : t]
                    for i in range(m - 1):
                        seg_lab[i] = nxt[i]
                    seg_lab[m - 1] = IGNORE_INDEX
                elif label_mode == LABELS_HF:
                    cur = ids[s0:t]
                    seg_lab[0] = IGNORE_INDEX
                    for i in range(1, m):
                        seg_lab[i] = cur[i]
                else:
                    for i in range(m):
                        seg_lab[i] = IGNORE_INDEX
            seg += 1
            cu_seqlens[r, seg] = t
            if m > longest:
                longest = m
        if t < seqlen:
            for i in range(t, seqlen):
                ids[i] = pad_id
                pos[i] = i - t
                lab[i] = IGNORE_INDEX
                att[i] = 0
            seg += 1
            cu_seqlens[r, seg] = seqlen
            if seqlen - t > longest:
                longest = seqlen - t
        n_segments[r] = seg
        max_seqlen[r] = longest


@njit
def _touch_pieces(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray, cu: np.ndarray) -> None:
    """Read one token per 64-byte line of every piece before the copies.  The pieces lie in
    unrelated places and are too short for the hardware prefetcher to ramp up, so copying them
    in turn waits for their cache (and TLB) misses one after another; touched first, the misses
    are all in flight together.  The sum goes to ``cu``'s last slot (past the entries returned,
    or overwritten by them) so the loads are kept."""
    step = max(1, 64 // src.itemsize)
    acc = 0
    for q in range(starts.shape[0]):
        a, n = starts[q], lengths[q]
        for t in range(a, a + n, step):
            acc += src[t]
    cu[cu.shape[0] - 1] = acc


@njit
def one_bin(
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    offsets: np.ndarray,
    src: np.ndarray,
    b: int,
    params: np.ndarray,
    out: np.ndarray,
    cu: np.ndarray,
) -> tuple[int, int]:
    """:func:`select_pieces` then :func:`fill_rows` for the single bin ``b``, reading straight
    from the whole flat token array ``src``.  ``params`` is ``[seqlen, eot, eot_id, pad_id,
    label_mode]``; ``out`` (1-D, int64 or int32, at least ``4 * seqlen``) receives ids,
    positions, labels, attention mask one after the other; ``cu`` (1-D int32, ``C`` entries; it
    may be the tail of an int32 ``out``) the segment boundaries.  Few arguments: numba's
    dispatch cost grows with each one, and this is the single-sample path.

    Returns ``(n_segments, longest_segment)``, or ``(-1, 0)`` when the bin is inconsistent with
    the plan or the documents (``b`` outside ``bin_ptr``, a decreasing or out-of-range
    ``bin_ptr``, a piece outside its document, more than ``seqlen`` slots), or ``(-2, 0)`` when
    ``cu`` has fewer than ``pieces + 2`` entries or ``out`` fewer than ``4 * seqlen``; nothing
    is read or written then."""
    seqlen, eot, eot_id, pad_id, label_mode = params[0], params[1], params[2], params[3], params[4]
    if b < 0 or b + 1 >= bin_ptr.shape[0]:
        return -1, 0
    lo, hi = bin_ptr[b], bin_ptr[b + 1]
    if lo < 0 or hi < lo or hi > piece_doc.shape[0]:
        return -1, 0
    n = hi - lo
    if n + 2 > cu.shape[0] or out.shape[0] < 4 * seqlen:
        return -2, 0
    # One scratch allocation: the bin, row_ptr, the two scalars, then starts, lengths, eot flags.
    scratch = np.empty(5 + 3 * n, dtype=np.int64)
    bins = scratch[0:1]
    bins[0] = b
    row_ptr = scratch[1:3]
    row_ptr[0], row_ptr[1] = 0, n
    scalars = scratch[3:5]
    starts = scratch[5 : 5 + n]
    lengths = scratch[5 + n : 5 + 2 * n]
    has_eot = scratch[5 + 2 * n : 5 + 3 * n]
    bad = select_pieces(
        bin_ptr,
        piece_doc,
        piece_start,
        piece_len,
        offsets,
        seqlen,
        eot,
        bins,
        row_ptr,
        starts,
        lengths,
        has_eot,
    )
    if bad >= 0:
        return -1, 0
    _touch_pieces(src, starts, lengths, cu)
    rows = out[: 4 * seqlen].reshape((4, 1, seqlen))
    fill_rows(
        src,
        starts,
        lengths,
        has_eot,
        row_ptr,
        eot_id,
        pad_id,
        label_mode,
        rows[0],
        rows[1],
        rows[2],
        rows[3],
        cu.reshape((1, cu.shape[0])),
        scalars[0:1],
        scalars[1:2],
    )
    return scalars[0], scalars[1]
