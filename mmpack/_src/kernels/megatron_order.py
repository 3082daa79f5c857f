"""Kernels of megatron-core's ``GPTDataset`` sample order (:mod:`mmpack._src.formats.megatron_order`).

The epoch stream ``S`` is the concatenation of the sequences named by ``document_index`` (one
entry per sequence per epoch, shuffled); its length is ``total``.  With ``extra`` = 1 (Megatron's
``add_extra_token_to_sequence``) or 0, sample ``i`` is ``S[i * seqlen : i * seqlen + seqlen +
extra]``, and the sample index records each sample boundary ``p = i * seqlen`` as a pair
``(k, offset)``: the entry ``k`` of ``document_index`` and the offset in its sequence, of the
token at ``p`` when ``extra`` is 1, of the token before ``p`` plus one when ``extra`` is 0 (so an
offset may equal its sequence's length); empty sequences are never named.  A boundary whose
sample would run past the end of ``S`` (only the last, partial sample of a split that keeps
it) is recorded as the last entry of ``document_index`` with offset ``length - extra``, as
megatron-core's builder records it.

:func:`fill_sample_index` writes the whole index in one merge pass over the boundaries and
``document_index`` (O(samples + entries), no cumulative array); :func:`sample_pieces` resolves
a batch of samples into flat token ranges of the store, which :func:`copy_pieces` copies into
rows padded with ``pad``.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["copy_pieces", "fill_sample_index", "sample_pieces"]


@njit
def fill_sample_index(
    sizes: np.ndarray,
    document_index: np.ndarray,
    seqlen: int,
    extra: int,
    total: int,
    out: np.ndarray,
) -> None:
    """Fill ``out`` (shape ``(n + 1, 2)``) with the boundaries of samples ``0 .. n - 1``.

    ``sizes`` (int32, every sequence's length, all ``>= 0``), ``document_index`` (int32 entries
    in ``[0, len(sizes))``, non-empty) and ``total = sum(sizes[document_index])`` are validated
    by the caller; every read stays in bounds because a boundary that is not clamped lies
    before ``total``."""
    last = document_index.shape[0] - 1
    out[0, 0] = 0
    out[0, 1] = 0
    k = 0
    start = 0  # stream position of entry k's first token
    for i in range(1, out.shape[0]):
        p = i * seqlen
        if p + extra > total:  # the sample before this boundary runs past the stream's end
            out[i, 0] = last
            out[i, 1] = sizes[document_index[last]] - extra
            continue
        target = p - 1 + extra  # the token whose sequence names the boundary
        while start + sizes[document_index[k]] <= target:
            start += sizes[document_index[k]]
            k += 1
        out[i, 0] = k
        out[i, 1] = p - start


@njit
def sample_pieces(
    pointers: np.ndarray,
    itemsize: int,
    sizes: np.ndarray,
    document_index: np.ndarray,
    sample_index: np.ndarray,
    picks: np.ndarray,
    extra: int,
    width: int,
    piece_ptr: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> None:
    """The flat token ranges of samples ``picks`` (int64, rows of ``sample_index``).

    Sequence ``s`` starts at flat token ``pointers[s] // itemsize`` (Megatron's byte pointers,
    or token offsets with ``itemsize`` 1).  Sample ``r``'s pieces are
    ``piece_start[q], piece_len[q]`` for ``q`` in ``[piece_ptr[r], piece_ptr[r + 1])``:
    ``piece_ptr`` (int64, ``len(picks) + 1``) holds, on entry, the prefix sum of the entries
    each sample spans (``sample_index[j + 1, 0] - sample_index[j, 0] + 1``).  Every range is
    clipped to its sequence and the row's ``width``, so no index, however damaged, reads
    outside the sequences (the caller checks ``sample_index``'s entries against
    ``document_index``, and ``document_index``'s against ``sizes``)."""
    for r in range(picks.shape[0]):
        j = picks[r]
        kb = sample_index[j, 0]
        ob = sample_index[j, 1]
        ke = sample_index[j + 1, 0]
        oe = sample_index[j + 1, 1]
        q = piece_ptr[r]
        room = width
        for k in range(kb, ke + 1):
            s = document_index[k]
            size = sizes[s]
            lo = ob if k == kb else 0
            hi = oe + extra if k == ke else size
            lo = min(max(lo, 0), size)
            hi = min(max(hi, lo), size, lo + room)
            piece_start[q] = pointers[s] // itemsize + lo
            piece_len[q] = hi - lo
            room -= hi - lo
            q += 1


@njit
def copy_pieces(
    src: np.ndarray,
    cursors: np.ndarray,
    piece_ptr: np.ndarray,
    piece_len: np.ndarray,
    pad: int,
    rows: np.ndarray,
) -> None:
    """Row ``r`` of ``rows`` (int64, ``(k, width)``) = its pieces ``src[cursors[q] : cursors[q] +
    piece_len[q]]`` back to back, then ``pad`` to the end.  The pieces of a row fit its width
    (:func:`sample_pieces` clips them) and lie in ``src`` (the caller's read)."""
    width = rows.shape[1]
    for r in range(rows.shape[0]):
        row = rows[r]
        t = 0
        for q in range(piece_ptr[r], piece_ptr[r + 1]):
            c = cursors[q]
            for u in range(piece_len[q]):
                row[t + u] = src[c + u]
            t += piece_len[q]
        for u in range(t, width):
            row[u] = pad
