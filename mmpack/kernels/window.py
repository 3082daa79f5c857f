"""Window kernels: resolve (seqlen, stride) windows of the virtual stream and copy them.

The virtual stream ``S`` is ``doc0, eot, doc1, eot, ...`` (``use_eot``) or the plain
concatenation.  Document ``j`` starts in ``S`` at ``voff(j) = offsets[j] + j * use_eot``; a
window starting at ``v`` begins in the last document ``j`` with ``voff(j) <= v``, found by a
binary search over ``offsets`` itself (no ``voff`` array is materialised: nothing grows with the
corpus beyond the memory-mapped index).  The real tokens of a window are consecutive in the flat
token array, so a copy walks one cursor through the flat array and writes ``eot`` where a document
segment ends.  Cost: O(log n_docs) to resolve (one search per window: the copy derives its
flat cursor from the document it found) plus O(width) to copy, per window; before copying, one
token per cache line of the window's flat range is read, so the source's misses overlap (the
copy, which casts, keeps only a few in flight); with a sampled index and the whole flat array
as source, one token per page of the window's possible flat range is read before the search
of ``offsets``, so the page walks of both overlap.

Single samples (``ds[i]``) go through :func:`one_window_at` / :func:`one_window_at_flat`, which
take the token and offsets mappings as addresses in ``meta`` (two or one array arguments
through the compiled entry instead of four or three; see :mod:`mmpack.kernels.entry`).  Where
the ~2 us of :func:`one_window` go on random 2049-token windows of a 2M-document store (int64
output, an A/B of kernel variants in one process, 2-core VM, load average ~1.5): ~0.2 us
calling the entry, ~0.1 us the sampled-index search, ~0.37 us the search of ``offsets`` (a
page walk and cache miss the raw copy does not pay), ~0.55 us the token misses (the raw copy
pays them too), ~0.33 us the cast copy and ~0.34 us the positions (16 KiB written each).
Tried and not kept (no gain measured): prefetching every line of the ``offsets`` bracket or of
the window's possible flat range before the search, software prefetch (``llvm.prefetch``)
instead of reading the lines, writing the positions in the copy loop or before it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from mmpack.kernels._jit import njit
from mmpack.kernels.entry import address

__all__ = [
    "INDEX_STEP",
    "META_FIELDS",
    "copy_window",
    "fill_sampled_index",
    "find_doc",
    "flat_position",
    "gather_windows",
    "one_window",
    "one_window_at",
    "one_window_at_flat",
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
    casts and stores several bytes per byte read, holds only a few (an A/B of this kernel with
    and without the touch, in one process while writing it, on random 2049-token windows of a
    0.2 GB store: about -0.2 us per window; the script was not kept)."""
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


INDEX_STEP = 256
"""Stride of the sampled index: ``top[k] = voff(k * INDEX_STEP)``."""

META_FIELDS = 10
"""Fields at the head of :func:`one_window`'s ``meta`` (the sampled index follows them):
``use_eot, eot, seqlen, width, total, pad_id`` then, for :func:`one_window_at`, the address and
length of the token array and of ``offsets`` (0 where unused)."""


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
) -> int:
    """Copy ``S[v : v + width]`` into ``row`` (length ``width``: ``seqlen``, or ``seqlen + 1``
    when the caller takes labels as ``row[1:]``), padding past the end of ``S`` with ``pad_id``;
    fill ``pos`` (length ``seqlen``) and ``cu`` (length ``seqlen + 1``) for ``row[:seqlen]``.
    ``src[cursor]`` must be the window's first real token; a negative ``cursor`` means ``src``
    is the whole flat array and the cursor is taken from the document search this function
    does anyway (one binary search per window, not two).  Returns the entries written to ``cu``.

    Copies run piece by piece, one tight loop per document piece over views indexed from 0, so
    the inner loops vectorise."""
    real = min(width, total - v)
    filled = min(real, seqlen)
    lo, hi = _bracket(offsets, top, v)
    acc = 0
    if cursor < 0 and hi - lo < offsets.shape[0] - 1:
        # The window's flat start lies in [v - (hi - 1) * use_eot, v - lo * use_eot] (one eot
        # per document before it): read one token per page of that range plus the window
        # before searching ``offsets``, so the page walks of ``src`` overlap the search's
        # misses instead of following them (random windows of a 2M-document store:
        # kernel alone 2.22 -> 2.08 us, interleaved A/B of the two kernels in one process).
        a = max(0, min(v - (hi - 1) * use_eot, src.shape[0]))
        b = max(a, min(v - lo * use_eot + width, src.shape[0]))
        acc = _touch_pages(src, a, b - a)
    j = _search(offsets, use_eot, v, lo, hi)
    r = v - (offsets[j] + j * use_eot)
    if cursor < 0:  # flat_position(v), from the document just found
        cursor = offsets[j] + r if r < offsets[j + 1] - offsets[j] else offsets[j + 1]
    # The sum lands in cu's last slot, past the entries returned (or overwritten by them), so
    # the loads are kept.
    acc += _touch(src, cursor, _flat_tokens(offsets, j, r, use_eot, real))
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
        cursor += n
        t += n
        r += n
        if t < real and r == dl and use_eot:
            row[t] = eot
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
) -> None:
    """:func:`copy_window` for every ``k``, into row ``k`` of the 2-D outputs.  A negative
    ``cursors[0]`` means ``src`` is the whole flat array: each window's cursor is found by
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
        )


@njit
def one_window(
    src: np.ndarray, offsets: np.ndarray, meta: np.ndarray, v: int, out: np.ndarray, cu: np.ndarray
) -> int:
    """:func:`copy_window` for a single window read straight from the whole flat array ``src``.

    ``meta`` is ``[use_eot, eot, seqlen, width, total, pad_id, ...]`` (:data:`META_FIELDS`
    fields) followed by the sampled index (``top``, possibly empty) and ``out`` (int64 or
    int32) holds the row (``width``) then the positions (``seqlen``), then anything (the
    caller's int32 ``cu`` may be its tail): few
    arguments, because numba's dispatch costs ~45 ns per array argument and this is the
    single-sample path (packing the scalars took ``ds[i]`` from 6.5 to 3.9 us in
    ``python -m benchmarks --quick window``)."""
    use_eot, eot, seqlen, width = meta[0], meta[1], meta[2], meta[3]
    total, pad_id = meta[4], meta[5]
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
        cu,
    )


@njit
def one_window_at(meta: np.ndarray, dtype: Any, v: int, out: np.ndarray, cu: np.ndarray) -> int:
    """:func:`one_window` with the token and offsets arrays given as addresses in ``meta``:
    ``meta[6:8]`` the address and length of the flat token array (of ``dtype``), ``meta[8:10]``
    those of ``offsets`` (int64), both C-contiguous and alive for the call (the caller's
    responsibility: :class:`mmpack.views.window.WindowDataset` holds both for its lifetime and
    checks them before writing their addresses).  Two array arguments instead of four: ~40 ns
    a call each through the compiled entry (:mod:`mmpack.kernels.entry`).  Compiled code only."""
    src = numba.carray(address(meta[6]), meta[7], dtype)
    offsets = numba.carray(address(meta[8]), meta[9], np.int64)
    return one_window(src, offsets, meta, v, out, cu)


@njit
def one_window_at_flat(meta: np.ndarray, dtype: Any, v: int, out: np.ndarray) -> int:
    """:func:`one_window_at` with ``cu`` in ``out`` itself: ``out`` (int32, the output type whose
    cu_seqlens share the buffer) holds the row (``width``), the positions (``seqlen``) and then
    ``cu`` (``seqlen + 1``): one array argument fewer again."""
    cut = meta[3] + meta[2]
    return one_window_at(meta, dtype, v, out, out[cut : cut + meta[2] + 1])
