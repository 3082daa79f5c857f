"""Window kernels: resolve (seqlen, stride) windows of the virtual stream and copy them.

The virtual stream ``S`` is ``doc0, eot, doc1, eot, ...`` (``use_eot``) or the plain
concatenation.  Document ``j`` starts in ``S`` at ``voff(j) = offsets[j] + j * use_eot``; a
window starting at ``v`` begins in the last document ``j`` with ``voff(j) <= v``, found by a
binary search over ``offsets`` itself (no ``voff`` array is materialised).  The real tokens of a
window are consecutive in the flat token array, so a copy walks one cursor through it and writes
``eot`` where a document segment ends.  Cost: O(log n_docs) to resolve plus O(width) to copy,
per window; one token per cache line of the window's flat range is read first, so the source's
misses overlap (with a sampled index, one token per page before the search of ``offsets``).

:func:`window_pieces` lists the documents a window spans (what ``locate`` says of it): the one
the copy's search found, then a walk through ``offsets`` to the window's end; one call counts,
allocates and writes.  Cost: O(documents spanned) per window, no search.

A single sample (``ds[i]``) is :func:`one_window`: :func:`copy_window` called with few arguments
(the scalars and the sampled index in one ``meta`` array, the row and positions in one output
buffer, ``cu_seqlens`` in a second), through numba's ordinary dispatch.  Cost on random
2049-token windows: ``python -m benchmarks.bench_getitem --quick --profile``.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = [
    "INDEX_STEP",
    "META_FIELDS",
    "copy_window",
    "fill_sampled_index",
    "find_doc",
    "flat_position",
    "gather_masked_windows",
    "gather_windows",
    "one_window",
    "window_pieces",
    "window_ranges",
]


@njit
def _copy_cast(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[:] = src`` with a cast; loops over views indexed from 0 so LLVM can vectorise (an
    index that could be negative would keep numba's wraparound check in the loop)."""
    for q in range(dst.shape[0]):
        dst[q] = src[q]


@njit
def _flat_tokens(offsets: np.ndarray, j: int, r: int, use_eot: int, real: int) -> int:
    """Real tokens among ``real`` stream positions from position ``r`` of document ``j`` on
    (``real`` minus the eots among them)."""
    if not use_eot:
        return real
    t = 0
    n = 0
    while t < real:
        dl = offsets[j + 1] - offsets[j]
        take = min(dl + 1 - r, real - t)
        if r < dl:
            n += min(dl - r, take)
        t += take
        j += 1
        r = 0
    return n


@njit
def _touch(src: np.ndarray, a: int, n: int) -> int:
    """The sum of one token per 64-byte line of ``src[a : a + n]``: reading the lines before the
    copy puts all their cache (and TLB) misses in flight together, where the copy loop, which
    casts and stores several bytes per byte read, holds only a few."""
    acc = 0
    for t in range(a, a + n, max(1, 64 // src.itemsize)):
        acc += src[t]
    return acc


@njit
def _touch_pages(src: np.ndarray, a: int, n: int) -> int:
    """The sum of one token per 4 KiB page of ``src[a : a + n]`` and of its last token."""
    acc = 0
    for t in range(a, a + n, max(1, 4096 // src.itemsize)):
        acc += src[t]
    if n > 0:
        acc += src[a + n - 1]
    return acc


@njit
def _arange(dst: np.ndarray) -> None:
    for q in range(dst.shape[0]):
        dst[q] = q


@njit
def _mask_labels(
    row: np.ndarray, mask: np.ndarray, m: int, t: int, n: int, ignore: int, lab: np.ndarray
) -> None:
    """The labels whose targets are ``row[t : t + n]`` (tokens whose masks are
    ``mask[m : m + n]``): ``lab[q - 1] = row[q]`` where the mask is not 0, else ``ignore``
    (``row[0]`` is no label's target).  Views indexed from 0, so LLVM vectorises the select."""
    lo = 1 if t == 0 else 0
    got = row[t + lo : t + n]
    flag = mask[m + lo : m + n]
    out = lab[t + lo - 1 : t + n - 1]
    for q in range(out.shape[0]):
        out[q] = got[q] if flag[q] != 0 else ignore


INDEX_STEP = 256
"""Stride of the sampled index: ``top[k] = voff(k * INDEX_STEP)``."""

META_FIELDS = 7
"""Fields at the head of :func:`one_window`'s ``meta`` (the sampled index follows them):
``use_eot, eot, seqlen, width, total, pad_id, cu_at``."""


@njit
def fill_sampled_index(offsets: np.ndarray, use_eot: int, out: np.ndarray) -> None:
    """``out[k] = offsets[k * INDEX_STEP] + k * INDEX_STEP * use_eot`` (``out`` sized
    ``(len(offsets) - 1) // INDEX_STEP + 1``): a small, cache-resident first level over the
    document starts, so a lookup in 10^8 documents touches a few cache lines of ``offsets``
    instead of ~27 scattered ones."""
    for k in range(out.shape[0]):
        j = k * INDEX_STEP
        out[k] = offsets[j] + j * use_eot


@njit
def _bracket(offsets: np.ndarray, top: np.ndarray, v: int) -> tuple[int, int]:
    """Documents ``[lo, hi)`` with ``voff(lo) <= v < voff(hi)``, narrowed by the sampled index
    ``top`` to at most ``INDEX_STEP`` documents when it is non-empty (else all of them)."""
    lo = 0
    hi = offsets.shape[0] - 1
    if top.shape[0] > 1:
        a, b = 0, top.shape[0]  # largest k with top[k] <= v
        while b - a > 1:
            mid = (a + b) >> 1
            if top[mid] <= v:
                a = mid
            else:
                b = mid
        lo = a * INDEX_STEP
        hi = min(lo + INDEX_STEP, hi)
    return lo, hi


@njit
def _search(offsets: np.ndarray, use_eot: int, v: int, lo: int, hi: int) -> int:
    """The largest ``j`` in ``[lo, hi)`` with ``offsets[j] + j * use_eot <= v`` (given
    ``voff(lo) <= v < voff(hi)``)."""
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if offsets[mid] + mid * use_eot <= v:
            lo = mid
        else:
            hi = mid
    return lo


@njit
def find_doc(offsets: np.ndarray, top: np.ndarray, use_eot: int, v: int) -> int:
    """The document containing virtual position ``v`` (``0 <= v < len(S)``): the largest ``j``
    with ``offsets[j] + j * use_eot <= v`` (empty documents without eot are skipped).  With a
    sampled index ``top`` (non-empty), the search first narrows to ``INDEX_STEP`` documents."""
    lo, hi = _bracket(offsets, top, v)
    return _search(offsets, use_eot, v, lo, hi)


@njit
def flat_position(offsets: np.ndarray, top: np.ndarray, use_eot: int, v: int) -> int:
    """Flat index of the first real token at or after virtual position ``v`` (``v <= len(S)``)."""
    n = offsets.shape[0] - 1
    if v >= offsets[n] + n * use_eot:
        return offsets[n]
    j = find_doc(offsets, top, use_eot, v)
    r = v - (offsets[j] + j * use_eot)
    dl = offsets[j + 1] - offsets[j]
    if r < dl:
        return offsets[j] + r
    return offsets[j + 1]


@njit
def window_ranges(
    offsets: np.ndarray,
    top: np.ndarray,
    use_eot: int,
    vstarts: np.ndarray,
    width: int,
    total: int,
    out_start: np.ndarray,
    out_len: np.ndarray,
) -> None:
    """The flat token range ``[out_start[k], out_start[k] + out_len[k])`` of window ``k``
    (``vstarts[k]`` to ``vstarts[k] + width``, clipped at ``total = len(S)``)."""
    for k in range(vstarts.shape[0]):
        v = vstarts[k]
        end = min(v + width, total)
        a = flat_position(offsets, top, use_eot, v)
        b = flat_position(offsets, top, use_eot, end)
        out_start[k] = a
        out_len[k] = b - a


@njit
def copy_window(
    src: np.ndarray,
    cursor: int,
    offsets: np.ndarray,
    top: np.ndarray,
    use_eot: int,
    eot: int,
    v: int,
    seqlen: int,
    width: int,
    total: int,
    pad_id: int,
    row: np.ndarray,
    pos: np.ndarray,
    cu: np.ndarray,
    mask: np.ndarray,
    mshift: int,
    ignore: int,
    lab: np.ndarray,
    doc: np.ndarray,
) -> int:
    """Copy ``S[v : v + width]`` into ``row`` (length ``width``: ``seqlen``, or ``seqlen + 1``
    when the caller takes labels as ``row[1:]``), padding past the end of ``S`` with ``pad_id``;
    fill ``pos`` (length ``seqlen``) and ``cu`` (length ``seqlen + 1``) for ``row[:seqlen]``.
    ``src[cursor]`` must be the window's first real token; a negative ``cursor`` means ``src``
    is the whole flat array and the cursor is taken from the document search this function
    does anyway (one binary search per window, not two).  Returns the entries written to ``cu``.

    With a non-empty ``lab`` (length ``seqlen``, and ``width == seqlen + 1``) the labels are
    written in the same pass: ``lab[t] = row[t + 1]`` where that token is a target, ``ignore``
    where it is not or lies past the end of ``S``.  The token read from ``src[c]`` is a target
    where ``mask[c + mshift] != 0``; an eot is one.  An empty ``lab`` writes no labels (``mask``
    is then not read).  A non-empty ``doc`` (int64, (1,)) receives the document the window starts
    in (the search's result, which :func:`window_pieces` starts from).

    Copies run piece by piece, one tight loop per document piece over views indexed from 0, so
    the inner loops vectorise.  With the whole flat array as ``src`` (and a sampled index), the
    window's flat start lies in ``[v - (hi - 1) * use_eot, v - lo * use_eot]`` (one eot per
    document before it): one token per page of that range plus the window is read before
    ``offsets`` is searched, so the page walks of ``src`` overlap the search's misses instead of
    following them."""
    real = min(width, total - v)
    filled = min(real, seqlen)
    lo, hi = _bracket(offsets, top, v)
    acc = 0
    if cursor < 0 and hi - lo < offsets.shape[0] - 1:
        a = max(0, min(v - (hi - 1) * use_eot, src.shape[0]))
        b = max(a, min(v - lo * use_eot + width, src.shape[0]))
        acc = _touch_pages(src, a, b - a)
    j = _search(offsets, use_eot, v, lo, hi)
    doc[:] = j  # nothing when it is empty
    r = v - (offsets[j] + j * use_eot)
    if cursor < 0:  # flat_position(v), from the document just found
        cursor = offsets[j] + r if r < offsets[j + 1] - offsets[j] else offsets[j + 1]
    # The sum lands in cu's last slot, past the entries returned (or overwritten by them), so
    # the loads are kept.
    masked = lab.shape[0] > 0
    n_flat = _flat_tokens(offsets, j, r, use_eot, real)
    acc += _touch(src, cursor, n_flat) + (_touch(mask, cursor + mshift, n_flat) if masked else 0)
    cu[cu.shape[0] - 1] = acc
    ncu = 1
    cu[0] = 0
    t = 0
    while t < real:
        dl = offsets[j + 1] - offsets[j]
        seg = dl + use_eot
        if r >= seg:
            j += 1
            r = 0
            continue
        n = min(dl - r, real - t) if r < dl else 0
        _copy_cast(src[cursor : cursor + n], row[t : t + n])
        if masked and n:
            _mask_labels(row, mask, cursor + mshift, t, n, ignore, lab)
        cursor += n
        t += n
        r += n
        if t < real and r == dl and use_eot:
            row[t] = eot
            if masked and t:
                lab[t - 1] = eot
            t += 1
            r += 1
        if r == seg and t < seqlen:
            cu[ncu] = t
            ncu += 1
    if filled < seqlen and cu[ncu - 1] != filled:
        cu[ncu] = filled
        ncu += 1
    cu[ncu] = seqlen
    ncu += 1
    row[real:width] = pad_id
    if masked:
        lab[max(real - 1, 0) :] = ignore  # their targets lie past the end of S
    for c in range(ncu - 1):
        _arange(pos[cu[c] : cu[c + 1]])
    return ncu


@njit
def gather_windows(
    src: np.ndarray,
    cursors: np.ndarray,
    offsets: np.ndarray,
    top: np.ndarray,
    use_eot: int,
    eot: int,
    vstarts: np.ndarray,
    seqlen: int,
    width: int,
    total: int,
    pad_id: int,
    rows: np.ndarray,
    pos: np.ndarray,
    cu: np.ndarray,
    ncu: np.ndarray,
    first: np.ndarray,
) -> None:
    """:func:`copy_window` for every ``k``, into row ``k`` of the 2-D outputs; ``first[k]``
    (int64, (k,)) receives the document window ``k`` starts in.  A negative ``cursors[0]``
    means ``src`` is the whole flat array: each window's cursor is found by
    :func:`copy_window`'s own document search."""
    resolve = cursors.shape[0] > 0 and cursors[0] < 0
    for k in range(vstarts.shape[0]):
        cursor = -1 if resolve else cursors[k]
        ncu[k] = copy_window(
            src,
            cursor,
            offsets,
            top,
            use_eot,
            eot,
            vstarts[k],
            seqlen,
            width,
            total,
            pad_id,
            rows[k],
            pos[k],
            cu[k],
            src[:0],
            0,
            0,
            rows[k][:0],
            first[k : k + 1],
        )


@njit
def one_window(
    src: np.ndarray, offsets: np.ndarray, meta: np.ndarray, v: int, out: np.ndarray, cu: np.ndarray
) -> int:
    """:func:`copy_window` of the single window at virtual position ``v``, read straight from
    the whole flat token array ``src``; returns the entries written to ``cu_seqlens``.

    Parameters
    ----------
    src : ndarray, (n_tokens,)
        The flat token array.
    offsets : ndarray, int64, (n_docs + 1,)
    meta : ndarray, int64, (META_FIELDS + n_top,)
        ``[use_eot, eot, seqlen, width, total, pad_id, cu_at]`` then the sampled index
        (``top``, possibly empty).
    v : int
        The window's start in the virtual stream, ``0 <= v < total``.
    out : ndarray, int64 or int32, (>= width + seqlen,)
        Receives the row (``width``) then the positions (``seqlen``).
    cu : ndarray, int32, (>= cu_at + seqlen + 1,)
        Receives ``cu_seqlens`` from ``cu[cu_at]`` on.  With int32 output the caller may pass
        ``out`` itself with ``cu_at >= width + seqlen``: one buffer for the whole sample.
    """
    use_eot, eot, seqlen, width = meta[0], meta[1], meta[2], meta[3]
    total, pad_id, cu_at = meta[4], meta[5], meta[6]
    return copy_window(
        src,
        -1,
        offsets,
        meta[META_FIELDS:],
        use_eot,
        eot,
        v,
        seqlen,
        width,
        total,
        pad_id,
        out[:width],
        out[width : width + seqlen],
        cu[cu_at : cu_at + seqlen + 1],
        src[:0],
        0,
        0,
        out[:0],
        meta[:0],
    )


@njit
def gather_masked_windows(
    src: np.ndarray,
    cursors: np.ndarray,
    mask: np.ndarray,
    mshift: np.ndarray,
    offsets: np.ndarray,
    top: np.ndarray,
    use_eot: int,
    eot: int,
    vstarts: np.ndarray,
    seqlen: int,
    total: int,
    pad_id: int,
    ignore: int,
    rows: np.ndarray,
    pos: np.ndarray,
    cu: np.ndarray,
    ncu: np.ndarray,
    labels: np.ndarray,
    first: np.ndarray,
) -> None:
    """:func:`gather_windows` of windows with labels (``width = seqlen + 1``) over a store with
    a loss mask, the labels written in the copy's own pass (:func:`copy_window`):
    ``labels[k, t] = rows[k, t + 1]`` where the token at virtual position ``vstarts[k] + t + 1``
    is a target, ``ignore`` where it is not (its mask is 0) or lies past ``total``; an eot is a
    target.

    Parameters
    ----------
    mask : ndarray, uint8
        The mask of the token read from ``src[c]`` for window ``k`` is ``mask[c + mshift[k]]``.
    mshift : ndarray, int64, (k,)
        Validated: every token of window ``k`` has its mask inside ``mask`` that way.
    rows : ndarray, (k, seqlen + 1)
    labels : ndarray, (k, seqlen)
        Written, with ``rows``, ``pos``, ``cu``, ``ncu`` and ``first`` as by
        :func:`gather_windows`.
    """
    resolve = cursors.shape[0] > 0 and cursors[0] < 0
    for k in range(vstarts.shape[0]):
        cursor = -1 if resolve else cursors[k]
        ncu[k] = copy_window(
            src,
            cursor,
            offsets,
            top,
            use_eot,
            eot,
            vstarts[k],
            seqlen,
            seqlen + 1,
            total,
            pad_id,
            rows[k],
            pos[k],
            cu[k],
            mask,
            mshift[k],
            ignore,
            labels[k],
            first[k : k + 1],
        )


@njit
def _walk_pieces(
    offsets: np.ndarray,
    use_eot: int,
    j: int,
    v0: int,
    end: int,
    k: int,
    q: int,
    out: np.ndarray,
) -> int:
    """The pieces of window ``k``, ``S[v0 : end]``, starting in document ``j``: written from
    column ``q`` of ``out`` on when it is non-empty (else only counted); returns the column
    after the last."""
    fill = out.shape[1] > 0
    v = v0
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
    return q


@njit
def window_pieces(
    offsets: np.ndarray,
    use_eot: int,
    first: np.ndarray,
    vstarts: np.ndarray,
    width: int,
    total: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The document pieces of the windows ``S[v : min(v + width, total)]``, ``v`` in ``vstarts``
    (int64, (K,), each ``0 <= v < total``), window ``k`` starting in document ``first[k]`` (int64,
    (K,), as :func:`gather_windows` wrote it: the read's own search, not done again).

    Returns ``(out, row_ptr)``: ``row_ptr`` (int64, (K + 1,)) the prefix sum of the pieces per
    window, piece ``q`` of window ``k`` column ``row_ptr[k] + q`` of ``out`` (int64, (6,
    row_ptr[K])), whose rows are the window ``k``, the document, ``start``, ``stop``, ``eot``
    and ``at``.  One walk through ``offsets`` counts, a second writes.
    """
    n = vstarts.shape[0]
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    none = np.empty((6, 0), dtype=np.int64)
    for k in range(n):
        end = min(vstarts[k] + width, total)
        row_ptr[k + 1] = _walk_pieces(
            offsets, use_eot, first[k], vstarts[k], end, k, row_ptr[k], none
        )
    out = np.empty((6, row_ptr[n]), dtype=np.int64)
    if row_ptr[n]:
        for k in range(n):
            end = min(vstarts[k] + width, total)
            _walk_pieces(offsets, use_eot, first[k], vstarts[k], end, k, row_ptr[k], out)
    return out, row_ptr
