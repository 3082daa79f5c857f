"""Kernels that turn the streaming packer's placements into a batch (:mod:`mmpack._src.streaming`).

After the best-fit kernel (:func:`mmpack._src.kernels.plan_bestfit.place_batch`) has placed a prefix of
the held pieces, :func:`layout_batch` does the placement's bookkeeping in one pass, so that a
batch costs a fixed number of Python calls whatever its number of pieces: the placed pieces in
*row-major order* (row by row, each row's pieces in the order they were placed, which is by
increasing column: the best fit puts a piece at its row's first free column, so a row's pieces
lie one after another from column 0), each row's piece range (``row_ptr``), and the held pieces
that stay (the deferred ones, then those not scanned), compacted in place.  O(pieces + rows).

The rows themselves are written by the one row writer,
:func:`mmpack._src.kernels.packed_rows.fill_rows`, from a flat buffer of the placed pieces' tokens: a
store's ``read_ranges``, or for an in-memory source the buffer :func:`gather_pieces` fills, one
call per token chunk (an incoming batch's sequences one after the other, in any integer dtype):
every placed token copied once into the buffer (the chunks' dtype when they share one, else
int64) and or-ed, as int64, into a check value (negative when a token is, or is a uint64 id
``>= 2**63``).  O(placed tokens).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["gather_pieces", "layout_batch"]


@njit
def layout_batch(
    out: np.ndarray,
    processed: int,
    held: np.ndarray,
    n_held: int,
    n_rows: int,
    placed: np.ndarray,
    row_ptr: np.ndarray,
) -> tuple[int, int, int, int]:
    """Order the placed pieces of the first ``processed`` held pieces row by row, and remove
    them from the held ones.

    Parameters
    ----------
    out : numpy.ndarray, int64, shape (2, >= processed)
        Row and start column of each scanned piece (-1 when deferred), from ``place_batch``.
    held : numpy.ndarray, int64, shape (4, >= n_held)
        The held pieces (rows: length, source index, offset in the source sequence, and the
        piece's global token position); ``processed <= n_held``.  Compacted in place: on
        return its first ``n_left`` columns are the pieces that stay, in order.
    n_rows : int
        Rows of the batch (every ``out[0, i]`` is below it).
    placed : numpy.ndarray, int64, shape (5, n_placed)
        Out: the held columns (length, source index, source offset, position) of every placed
        piece, in row-major order (``n_placed`` is the number of ``out[0, :processed] >= 0``),
        and its start in the placed pieces' tokens one after the other (the lengths before it).
    row_ptr : numpy.ndarray, int64, shape (n_rows + 1,)
        Out: row ``r``'s pieces are ``placed[:, row_ptr[r]:row_ptr[r + 1]]``.

    Returns
    -------
    (n_left, total, empty_rows, most) : (int, int, int, int)
        Held pieces left, real tokens in the batch, rows without a piece, the most pieces of a
        row.
    """
    out_row = out[0]
    row_ptr[:] = 0
    for i in range(processed):
        if out_row[i] >= 0:
            row_ptr[out_row[i] + 1] += 1
    empty_rows = 0
    most = 0
    for r in range(n_rows):
        if row_ptr[r + 1] == 0:
            empty_rows += 1
        most = max(most, row_ptr[r + 1])
        row_ptr[r + 1] += row_ptr[r]
    cursor = row_ptr[:n_rows].copy()
    # Field rows as 1-D views, the four moves written out: 2x faster than held[f, i].
    h0 = held[0]
    h1 = held[1]
    h2 = held[2]
    h3 = held[3]
    n_left = 0
    for i in range(processed):
        r = out_row[i]
        if r >= 0:
            k = cursor[r]
            cursor[r] = k + 1
            placed[0, k] = h0[i]
            placed[1, k] = h1[i]
            placed[2, k] = h2[i]
            placed[3, k] = h3[i]
        else:  # deferred: stays, in order (n_left <= i, so never overwrites an unread column)
            h0[n_left] = h0[i]
            h1[n_left] = h1[i]
            h2[n_left] = h2[i]
            h3[n_left] = h3[i]
            n_left += 1
    total = 0
    for k in range(placed.shape[1]):
        placed[4, k] = total
        total += placed[0, k]
    shift = processed - n_left
    if shift:  # the pieces not scanned move down as one block (forward: never overwritten)
        for i in range(processed, n_held):
            h0[i - shift] = h0[i]
            h1[i - shift] = h1[i]
            h2[i - shift] = h2[i]
            h3[i - shift] = h3[i]
    return n_left + n_held - processed, total, empty_rows, most


@njit
def gather_pieces(
    chunk: np.ndarray,
    base: int,
    positions: np.ndarray,
    lengths: np.ndarray,
    starts: np.ndarray,
    buf: np.ndarray,
) -> int:
    """Copy the pieces whose tokens lie in ``chunk`` into the flat buffer ``buf``.

    Parameters
    ----------
    chunk : numpy.ndarray, integer (any width), shape (m,)
        Tokens (or loss masks) at global positions ``base .. base + m`` (an incoming batch's
        sequences).
    positions, lengths, starts : numpy.ndarray, int64, shape (pieces,)
        Piece ``k`` holds the tokens at global positions ``positions[k] ..
        positions[k] + lengths[k]`` and is written to ``buf[starts[k]:starts[k] + lengths[k]]``
        when they are all in the chunk (another chunk holds the others) and that range is
        inside ``buf`` (never written out of bounds).
    buf : numpy.ndarray, integer, 1-D
        Out: the chunk's dtype, or int64 (tokens), uint8 (masks).

    Returns
    -------
    int
        The bitwise or of the tokens written, as int64 (negative when one of them is negative,
        or is a uint64 id ``>= 2**63``); 0 when none is written.
    """
    bits = np.int64(0)
    m = chunk.shape[0]
    size = buf.shape[0]
    for k in range(positions.shape[0]):
        length = lengths[k]
        s = positions[k] - base
        o = starts[k]
        if s < 0 or length < 0 or s + length > m or o < 0 or o + length > size:
            continue
        for t in range(length):
            v = np.int64(chunk[s + t])
            bits |= v
            buf[o + t] = v
    return int(bits)
