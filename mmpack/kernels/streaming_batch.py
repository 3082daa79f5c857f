"""Kernels that turn the streaming packer's placements into a batch (:mod:`mmpack.streaming`).

After the best-fit kernel (:func:`mmpack.kernels.plan_bestfit.place_batch`) has placed a prefix of the held
pieces, :func:`layout_batch` does the rest of the bookkeeping in one pass, so that a batch costs
a fixed number of Python calls whatever its number of pieces:

- the placed pieces in *row-major order* (row by row, each row's pieces by increasing offset),
  with their row, offset, length, source index, offset in the source and position (or slot);
- every row's ``cu_seqlens`` (0, the end of each piece, and ``row_len`` when the row has padding),
  its longest segment (padding included, as ModernBERT's packer) and its real tokens;
- the held pieces that stay (the deferred ones, then those not scanned), compacted in place;
- the *order* of the batch's token runs: each row's pieces, then its padding written as the
  binary digits of its length, each digit ``2**k`` a fixed view of ``2**k`` padding tokens
  (slot ``k``).  A row of 2048 with 37 tokens of padding ends with the views of 32, 4 and 1.

The tokens of an in-memory source are then written by :func:`write_pieces`, one call per
token chunk (an incoming batch's sequences one after the other, in any integer dtype): every
placed token copied once into the int64 ``(rows, row_len)`` batch and or-ed into a check value
(negative when a token is), ~2.5 us for a batch of 16K tokens in cache.  The ``order`` of runs
(pieces, then padding as powers of two) serves a writer of runs; :func:`token_bits` checks the
real tokens of a written batch.  O(pieces + rows) and O(rows * row_len).
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["layout_batch", "token_bits", "write_pieces"]


@njit
def layout_batch(
    out: np.ndarray,
    processed: int,
    held: np.ndarray,
    n_held: int,
    remaining: np.ndarray,
    n_rows: int,
    row_len: int,
    pad_bits: int,
    placed: np.ndarray,
    cu: np.ndarray,
    rows_out: np.ndarray,
    order: np.ndarray,
    out_mask: np.ndarray,
) -> tuple[int, int, int, int]:
    """Lay out a batch from the placements of the first ``processed`` held pieces.

    Parameters
    ----------
    out : numpy.ndarray, int64, shape (2, >= processed)
        Row and start column of each scanned piece (-1 when deferred), from ``place_batch``.
    held : numpy.ndarray, int64, shape (4, >= n_held)
        The held pieces (rows: length, source index, offset in the source sequence, and an
        int64 carried along: a run slot, or the packer's global token position);
        ``processed <= n_held``.  Compacted in place: on return its first ``n_left`` columns
        are the pieces that stay, in order.
    remaining : numpy.ndarray, int64, shape (>= n_rows,)
        Each row's free space (the best-fit kernel's row state).
    pad_bits : int
        Slots ``0 .. pad_bits - 1`` hold padding of ``1, 2, 4, ...`` tokens (``row_len <
        2**pad_bits``); 0 when there are no slots (a store-like source).
    placed : numpy.ndarray, int64, shape (6, n_placed)
        Out: row, offset, length, source index, source offset and slot (position) of every
        placed piece, in row-major order (``n_placed`` is the number of ``out_row[:processed] >= 0``).
    cu : numpy.ndarray, int32, shape (n_placed + 2 * n_rows,)
        Out: the rows' ``cu_seqlens`` one after the other.
    rows_out : numpy.ndarray, int64, shape (3 * n_rows + 1,)
        Out: ``[0, n_rows]`` the bounds of each row's ``cu_seqlens`` in ``cu`` (row ``r`` is
        ``cu[rows_out[r]:rows_out[r + 1]]``), ``[n_rows + 1, 2 n_rows + 1)`` each row's longest
        segment, ``[2 n_rows + 1, 3 n_rows + 1)`` each row's real tokens.
    order : numpy.ndarray, int64, shape (n_placed + n_rows * pad_bits,)
        Out (with ``pad_bits``): the slots whose tokens, one after the other, are the batch --
        each row's pieces, then its padding as powers of two (the binary digits of its length).
    out_mask : numpy.ndarray, int64, shape (n_rows, row_len)
        Out: the attention mask, 1 on each row's real tokens, 0 on its padding.

    Returns
    -------
    (n_left, total, empty_rows, n_order) : (int, int, int, int)
        Held pieces left, real tokens in the batch, rows without a piece, entries of ``order``.
    """
    out_row = out[0]
    out_off = out[1]
    cursor = np.zeros(n_rows, dtype=np.int64)
    for i in range(processed):
        if out_row[i] >= 0:
            cursor[out_row[i]] += 1
    # Row-major positions of the placed pieces, and cu_seqlens bounds: row r has its
    # pieces, a leading 0 and, with padding, a trailing row_len.
    start = 0
    pos = 0
    total = 0
    empty_rows = 0
    for r in range(n_rows):
        n = cursor[r]
        used = row_len - remaining[r]
        total += used
        if n == 0:
            empty_rows += 1
        rows_out[r] = pos
        rows_out[2 * n_rows + 1 + r] = used
        out_mask[r, :used] = 1
        out_mask[r, used:] = 0
        pos += n + 1 + (1 if used < row_len else 0)
        cursor[r] = start
        start += n
    rows_out[n_rows] = pos
    for i in range(processed):
        r = out_row[i]
        if r >= 0:
            k = cursor[r]
            cursor[r] = k + 1
            placed[0, k] = r
            placed[1, k] = out_off[i]
            placed[2, k] = held[0, i]
            placed[3, k] = held[1, i]
            placed[4, k] = held[2, i]
            placed[5, k] = held[3, i]
    k = 0
    n_order = 0
    for r in range(n_rows):
        b = rows_out[r]
        used = rows_out[2 * n_rows + 1 + r]
        cu[b] = 0
        longest = 0
        j = b + 1
        while k < placed.shape[1] and placed[0, k] == r:
            length = placed[2, k]
            cu[j] = placed[1, k] + length
            if length > longest:
                longest = length
            if pad_bits:
                order[n_order] = placed[5, k]
                n_order += 1
            j += 1
            k += 1
        if used < row_len:
            cu[j] = row_len
            if row_len - used > longest:
                longest = row_len - used
            for bit in range(pad_bits - 1, -1, -1):
                if (row_len - used) >> bit & 1:
                    order[n_order] = bit
                    n_order += 1
        rows_out[n_rows + 1 + r] = longest
    # The pieces that stay: deferred (out_row < 0) among the scanned, then the rest.
    # (Field rows as 1-D views, the four moves written out: 2x faster than held[f, i].)
    h0 = held[0]
    h1 = held[1]
    h2 = held[2]
    h3 = held[3]
    n_left = 0
    for i in range(processed):
        if out_row[i] < 0:
            h0[n_left] = h0[i]
            h1[n_left] = h1[i]
            h2[n_left] = h2[i]
            h3[n_left] = h3[i]
            n_left += 1
    shift = processed - n_left
    if shift:  # the pieces not scanned move down as one block (forward: never overwritten)
        for i in range(processed, n_held):
            h0[i - shift] = h0[i]
            h1[i - shift] = h1[i]
            h2[i - shift] = h2[i]
            h3[i - shift] = h3[i]
    return n_left + n_held - processed, total, empty_rows, n_order


@njit
def token_bits(ids: np.ndarray, used: np.ndarray) -> int:
    """The bitwise or of the real tokens of a batch (negative when one of them is).

    ``ids`` is int64 of shape (n_rows, n_cols) with ``used[r]`` real tokens at the start of
    row ``r`` (``used``: int64, shape (n_rows,), each in ``[0, n_cols]``); 0 when there are none.
    """
    bits = 0
    for r in range(ids.shape[0]):
        row = ids[r]
        for c in range(used[r]):
            bits |= row[c]
    return bits


@njit
def write_pieces(
    chunk: np.ndarray,
    base: int,
    placed: np.ndarray,
    n_rows: int,
    ids: np.ndarray,
    used: np.ndarray,
    pad_id: int,
) -> int:
    """Copy the placed pieces whose tokens lie in ``chunk`` into their rows of ``ids``, then
    write the padding of the rows given in ``used``.

    Parameters
    ----------
    chunk : numpy.ndarray, integer (any width), shape (m,)
        Tokens at global positions ``base .. base + m`` (an incoming batch's sequences).
    placed : numpy.ndarray, int64, shape (6, n_placed)
        From :func:`layout_batch`: row, offset, length, source index, source offset and global
        position of every placed piece.  Pieces whose positions are not all in the chunk are
        skipped (another chunk holds them); the others are written
        ``ids[row, offset:offset + length] = chunk[position - base:][:length]``.
    n_rows : int
        Rows of the batch: a piece with ``row >= n_rows`` or past the row's end is skipped
        (never written out of bounds; :func:`layout_batch` gives none).
    ids : numpy.ndarray, int64, shape (>= n_rows, row_len)
    used : numpy.ndarray, int64, shape (n_pad,)
        ``ids[r, used[r]:] = pad_id`` for ``r < min(n_pad, n_rows)`` (a ``used[r]`` outside
        ``[0, row_len]`` is clamped to it); an empty ``used`` writes no padding (a batch's
        second chunk).

    Returns
    -------
    int
        The bitwise or of the tokens written, as int64 (negative when one of them is negative,
        or is a uint64 id ``>= 2**63``); 0 when none is written.
    """
    bits = np.int64(0)
    m = chunk.shape[0]
    row_len = ids.shape[1]
    for k in range(placed.shape[1]):
        r = placed[0, k]
        o = placed[1, k]
        length = placed[2, k]
        s = placed[5, k] - base
        if s < 0 or s + length > m or r < 0 or r >= n_rows or o < 0 or o + length > row_len:
            continue
        row = ids[r]
        for t in range(length):
            v = np.int64(chunk[s + t])
            bits |= v
            row[o + t] = v
    for r in range(min(used.shape[0], n_rows)):
        row = ids[r]
        for c in range(min(max(used[r], 0), row_len), row_len):
            row[c] = pad_id
    return int(bits)
