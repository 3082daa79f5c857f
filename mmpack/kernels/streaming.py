"""Kernels of the streaming best-fit packer (:mod:`mmpack.streaming.packer`).

Best fit needs, for a sequence of length ``L``, the row with the *smallest* remaining space
``>= L``, ties to the lowest row index (ModernBERT's ``argmin`` over the fitting rows picks the first
smallest).  Each row ``r`` with remaining space ``s`` is one key ``s * stride + r`` (``stride`` =
the largest number of rows) in a successor structure over ``(row_len + 1) * stride`` keys; the
answer is the successor of ``L * stride``: the smallest key at or after it has the smallest
``s >= L`` and, among equal ``s``, the smallest ``r``.

The successor structure is a hierarchical bitmap (a shallow van Emde Boas tree): level 0 has one
bit per key, level ``k + 1`` one bit per 32-bit word of level ``k`` (set when that word is not
zero), up to a single word.  Insert, remove and successor each touch at most one word per level:
``ceil(log32(keys))`` levels, 4 for 16 rows of 32768 tokens, i.e. O(log(rows * row_len)) with a
tiny constant, against the O(rows) scan of ModernBERT's ``find_best_fit`` (which also allocates
three arrays per call).  Words are 32-bit values held in ``int64`` so that every operation is
plain non-negative integer arithmetic, identical with and without ``NUMBA_DISABLE_JIT``.

Memory: ``(row_len + 1) * stride / 8`` bytes, 64 KiB for 16 rows of 32768 tokens.

The other kernels write an output batch from a token source (a store's mapping): the placed
pieces and the padding (O(tokens)); :mod:`mmpack.kernels.streaming_batch` lays the batch out.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = [
    "bitmap_layout",
    "bm_insert",
    "bm_remove",
    "bm_successor",
    "pad_rows",
    "place_batch",
    "place_best_fit",
    "reset_rows",
    "scatter_pieces",
]

_WORD_BITS = 32
_WORD_SHIFT = 5
_WORD_MASK = 31
_FULL = 0xFFFFFFFF


def bitmap_layout(n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and word counts of each level of a bitmap over ``n_keys`` keys (plain Python).

    Returns
    -------
    level_off : numpy.ndarray, int64, shape (levels,)
        Index of each level's first word in the flat ``words`` array.
    level_len : numpy.ndarray, int64, shape (levels,)
        Number of words of each level; the last level has one word.  The ``words`` array needs
        ``level_off[-1] + 1`` zeroed ``int64`` entries.
    """
    if n_keys < 1:
        raise ValueError(f"n_keys must be >= 1, got {n_keys}")
    lens = []
    n = n_keys
    while True:
        words = -(-n // _WORD_BITS)
        lens.append(words)
        if words == 1:
            break
        n = words
    level_len = np.asarray(lens, dtype=np.int64)
    level_off = np.zeros(len(lens), dtype=np.int64)
    level_off[1:] = np.cumsum(level_len)[:-1]
    return level_off, level_len


@njit
def _ctz32(b: int) -> int:
    # b is a power of two below 2**32: a binary search over halves of 16, 8, 4, 2, 1 bits.
    n = 0
    half = 16
    while half:
        if b & ((1 << half) - 1) == 0:
            n += half
            b >>= half
        half >>= 1
    return n


@njit
def _lowest_bit_index(w: int) -> int:
    return _ctz32(w & -w)


@njit
def bm_insert(words: np.ndarray, level_off: np.ndarray, key: int) -> None:
    """Set ``key`` (0 <= key < n_keys) in the bitmap."""
    x = key
    for lvl in range(level_off.shape[0]):
        idx = level_off[lvl] + (x >> _WORD_SHIFT)
        old = words[idx]
        words[idx] = old | (1 << (x & _WORD_MASK))
        if old != 0:
            return
        x = x >> _WORD_SHIFT


@njit
def bm_remove(words: np.ndarray, level_off: np.ndarray, key: int) -> None:
    """Clear ``key`` (0 <= key < n_keys) from the bitmap."""
    x = key
    for lvl in range(level_off.shape[0]):
        idx = level_off[lvl] + (x >> _WORD_SHIFT)
        new = words[idx] & (_FULL ^ (1 << (x & _WORD_MASK)))
        words[idx] = new
        if new != 0:
            return
        x = x >> _WORD_SHIFT


@njit
def bm_successor(words: np.ndarray, level_off: np.ndarray, level_len: np.ndarray, q: int) -> int:
    """Smallest key ``>= q`` in the bitmap, or -1 (``q >= 0``)."""
    x = q
    n_levels = level_off.shape[0]
    lvl = 0
    while lvl < n_levels:
        wi = x >> _WORD_SHIFT
        if wi >= level_len[lvl]:
            return -1
        w = words[level_off[lvl] + wi] & (_FULL ^ ((1 << (x & _WORD_MASK)) - 1))
        if w != 0:
            x = (wi << _WORD_SHIFT) + _lowest_bit_index(w)
            while lvl > 0:
                lvl -= 1
                x = (x << _WORD_SHIFT) + _lowest_bit_index(words[level_off[lvl] + x])
            return x
        x = wi + 1
        lvl += 1
    return -1


@njit
def reset_rows(
    words: np.ndarray,
    level_off: np.ndarray,
    remaining: np.ndarray,
    counts: np.ndarray,
    n_rows: int,
    row_len: int,
) -> None:
    """Start a new batch of ``n_rows`` empty rows of ``row_len`` tokens.

    ``remaining`` (int64, shape (stride,)) holds each row's remaining space, -1 for rows not in
    the batch; the keys of the previous batch are removed, then rows ``0..n_rows-1`` are inserted
    with ``row_len`` free tokens.  ``counts`` (int64, shape (stride,)) is zeroed.
    """
    stride = remaining.shape[0]
    for r in range(stride):
        if remaining[r] >= 0:
            bm_remove(words, level_off, remaining[r] * stride + r)
            remaining[r] = -1
        counts[r] = 0
    for r in range(n_rows):
        remaining[r] = row_len
        bm_insert(words, level_off, row_len * stride + r)


@njit
def place_best_fit(
    lens: np.ndarray,
    budget: int,
    words: np.ndarray,
    level_off: np.ndarray,
    level_len: np.ndarray,
    remaining: np.ndarray,
    counts: np.ndarray,
    row_len: int,
    out_row: np.ndarray,
    out_off: np.ndarray,
) -> tuple[int, int]:
    """Place pieces in order by best fit until ``budget`` of them have been deferred.

    Parameters
    ----------
    lens : numpy.ndarray, int64, shape (n,)
        Piece lengths, each in ``[1, row_len]``.
    budget : int
        Stop *before* the next piece once this many pieces have been deferred in this call.
    remaining, counts : numpy.ndarray, int64, shape (stride,)
        Row state after :func:`reset_rows`; updated in place.
    out_row, out_off : numpy.ndarray, int64, shape (n,)
        For each processed piece: its row and start column, or -1 and -1 when it fits nowhere.

    Returns
    -------
    (processed, deferred) : (int, int)
        Number of pieces looked at (a prefix of ``lens``) and how many of them were deferred.
    """
    stride = remaining.shape[0]
    deferred = 0
    n = lens.shape[0]
    # The largest free space: a piece longer than it is deferred without a lookup (most of
    # the scan once the rows are nearly full); it only shrinks, and is rescanned (O(rows))
    # when its row takes a piece.
    widest = _widest(remaining)
    for i in range(n):
        if deferred >= budget:
            return i, deferred
        length = lens[i]
        if length > widest:
            out_row[i] = -1
            out_off[i] = -1
            deferred += 1
            continue
        key = bm_successor(words, level_off, level_len, length * stride)
        r = key % stride
        space = key // stride
        bm_remove(words, level_off, key)
        space_left = space - length
        bm_insert(words, level_off, space_left * stride + r)
        remaining[r] = space_left
        counts[r] += 1
        out_row[i] = r
        out_off[i] = row_len - space
        if space == widest:
            widest = _widest(remaining)
    return n, deferred


@njit
def place_batch(
    held: np.ndarray,
    start: int,
    stop: int,
    budget: int,
    words: np.ndarray,
    level_off: np.ndarray,
    level_len: np.ndarray,
    remaining: np.ndarray,
    counts: np.ndarray,
    row_len: int,
    n_rows: int,
    out: np.ndarray,
) -> tuple[int, int]:
    """:func:`place_best_fit` over the held pieces ``start:stop`` of a batch, after
    :func:`reset_rows` when ``start == 0`` (one call per batch instead of two).

    ``held`` is int64 of shape (>= 1, >= stop) whose row 0 holds the piece lengths; ``out`` is
    int64 of shape (2, >= stop): the rows and start columns of the placements.  Returns the
    pieces processed so far in the batch (``start`` plus those looked at) and those deferred.
    """
    if start == 0:
        reset_rows(words, level_off, remaining, counts, n_rows, row_len)
    k, d = place_best_fit(
        held[0, start:stop],
        budget,
        words,
        level_off,
        level_len,
        remaining,
        counts,
        row_len,
        out[0, start:],
        out[1, start:],
    )
    return start + k, d


@njit
def _widest(remaining: np.ndarray) -> int:
    widest = -1
    for r in range(remaining.shape[0]):
        widest = max(widest, remaining[r])
    return widest


@njit
def scatter_pieces(
    src: np.ndarray,
    src_starts: np.ndarray,
    lens: np.ndarray,
    rows: np.ndarray,
    offs: np.ndarray,
    out_ids: np.ndarray,
) -> None:
    """``out_ids[rows[k], offs[k]:+lens[k]] = src[src_starts[k]:+lens[k]]`` for every piece k.

    Parameters
    ----------
    src : numpy.ndarray, integer, 1-D
        Token source (e.g. a store's mapped token array); offsets are int64.
    out_ids : numpy.ndarray, int64, shape (n_rows, n_cols)
        Validated by the caller: ``0 <= rows < n_rows``, ``offs + lens <= n_cols``.
    """
    for k in range(lens.shape[0]):
        r = rows[k]
        s = src_starts[k]
        o = offs[k]
        for t in range(lens[k]):
            out_ids[r, o + t] = src[s + t]


@njit
def pad_rows(used: np.ndarray, pad_id: int, out_ids: np.ndarray) -> None:
    """``out_ids[r, used[r]:] = pad_id`` for every row (int64, (n_rows, n_cols))."""
    for r in range(out_ids.shape[0]):
        out_ids[r, used[r] :] = pad_id
