"""A batch's token fields in the context-parallel layout, written segment by segment.

The layout (:mod:`mmpack._src.views.cp_layout`): segment ``i`` of ``s`` tokens (``cu[i]:cu[i + 1]``
of the flat batch) is padded to ``p = ceil(s / 2C) * 2C`` tokens and cut into ``2C`` chunks of
``c = p / 2C``; the padded batch is the segments end to end, rank ``r``'s share chunk ``r`` then
chunk ``2C - 1 - r`` of every segment.

* :func:`pad_boundaries`: the padded boundaries and the longest padded segment;
* :func:`lay_out_fields`: those boundaries and every field of the batch (and a loss mask) in
  the padded layout or one rank's share, in one call (its options in one array), one pass
  per field by the loop nest of its kind (copied; copied with the labels' mask; written from
  its first token): per chunk one contiguous copy of the real tokens it covers, then its
  padding (a constant, or for positions the segment's first position plus the offset).  A
  field its caller knows to follow from each segment's first token (a view's positions ``0, 1,
  ...``, its attention mask of 1s) is written from that token alone, not read (half the
  reading for a view's four fields);
* :func:`zigzag_into`: ranks' positions in the padded batch (TransformerEngine's partition).

Cost: ``O(segments)`` for the boundaries; ``O(fields * (segments + tokens written))`` for the
fields, memory-bound (two contiguous runs per chunk); ``O(ranks * (segments + T / C))`` for the
positions.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["lay_out_fields", "pad_boundaries", "zigzag_into"]


@njit
def pad_boundaries(cu: np.ndarray, unit: int, out: np.ndarray) -> int:
    """Write into ``out`` (int64 or int32, (n + 1,)) the boundaries of ``cu``'s (int64,
    (n + 1,), rising from 0) segments each padded to a multiple of ``unit``; return the longest
    (0 for none)."""
    longest = 0
    out[0] = 0
    for i in range(cu.shape[0] - 1):
        padded = (cu[i + 1] - cu[i] + unit - 1) // unit * unit
        out[i + 1] = out[i] + padded
        longest = max(longest, padded)
    return longest


@njit
def lay_out_fields(
    srcs: tuple[np.ndarray, ...],
    cu: np.ndarray,
    params: np.ndarray,
    block: np.ndarray,
    mask: np.ndarray,
    padded: np.ndarray,
) -> int:
    """Write the padded boundaries and the padded batch, or one rank's share of it, of every
    token field; return the longest padded segment (0 for none).

    Parameters
    ----------
    srcs : tuple of F numpy.ndarray, one integer dtype, shape (N,)
        The fields over the flat batch.
    cu : numpy.ndarray, int64, shape (n + 1,)
        The batch's segments, ``0 = cu[0] <= ... <= cu[n] <= N``.
    params : numpy.ndarray, int64, shape (4 + 2 F,)
        ``C >= 1``; the rank, ``0 <= r < C`` for that rank's share, ``-1`` for the whole padded
        batch; the field (``-1``: none) whose padding continues the segment's positions,
        ``src[cu[i]] + offset``, instead of its fill; the field (``-1``: none) whose mask is
        written; then each field's padding value; then per field ``1`` where its real tokens
        are not read but follow from each segment's first (its caller knows they do):
        ``src[cu[i]] + offset`` for the positions field, ``src[cu[i]]`` for any other, else 0.
    block : numpy.ndarray, an integer dtype, shape (F', S), ``F' >= F``
        Row ``f < F`` written with field ``f`` (cast to the block's dtype as ``astype`` casts)
        from ``S >= T`` or ``S >= T / C`` on: ``T = sum(p_i)``; rows from ``F`` on, and every
        row's tail, untouched.
    mask : numpy.ndarray, float32, shape (0,) or (S',), ``S'`` at least a row's length
        With a masked field: ``1.0`` where its value differs from its fill, else ``0.0`` (the
        value before the cast to the block's dtype).
    padded : numpy.ndarray, int64 or int32, shape (n + 1,)
        Written: the padded boundaries (:func:`pad_boundaries`), ``T = padded[n]``.
    """
    cp_size, cp_rank, positions, masked = params[0], params[1], params[2], params[3]
    count = len(srcs)
    unit = 2 * cp_size
    longest = pad_boundaries(cu, unit, padded)
    # One small loop nest per kind of field, not one with every kind's branches: LLVM
    # vectorises the small ones' runs better (an eighth less time for a view's four fields).
    for f in range(count):
        ramp, fill = f == positions, params[4 + f]
        if params[4 + count + f] != 0:
            written = _first_field(srcs[f], block[f], cu, unit, cp_rank, fill, ramp)
        elif f == masked and not ramp:  # the mask in the loops that copy the values
            _copy_masked_field(srcs[f], block[f], mask, cu, unit, cp_rank, fill)
            continue
        else:
            written = _copy_field(srcs[f], block[f], cu, unit, cp_rank, fill, ramp)
        if f == masked:
            run = block[f]
            for j in range(written):
                mask[j] = 1.0 if run[j] != fill else 0.0
    return longest


@njit
def _copy_field(
    src: np.ndarray, out: np.ndarray, cu: np.ndarray, unit: int, cp_rank: int, fill: int, ramp: bool
) -> int:
    """:func:`lay_out_fields` of a field it reads: each chunk's real tokens copied, then its
    padding (``fill``, or with ``ramp`` the segment's positions continued); the tokens
    written."""
    at = 0
    for i in range(cu.shape[0] - 1):
        start = cu[i]
        real = cu[i + 1] - start
        span = (real + unit - 1) // unit * unit
        c = span // unit
        for h in range(1 if cp_rank < 0 else 2):
            lo = 0 if cp_rank < 0 else (cp_rank if h == 0 else unit - 1 - cp_rank) * c
            hi = span if cp_rank < 0 else lo + c
            stop = min(hi, real)
            n = stop - lo
            if n > 0:
                dst, run = out[at : at + n], src[start + lo : start + stop]
                for j in range(n):
                    dst[j] = run[j]
                at += n
            first_pad = max(lo, stop)
            n = hi - first_pad
            if n > 0:
                dst = out[at : at + n]
                if ramp:
                    base = src[start] + first_pad
                    for j in range(n):
                        dst[j] = base + j
                else:
                    for j in range(n):
                        dst[j] = fill
                at += n
    return at


@njit
def _copy_masked_field(
    src: np.ndarray,
    out: np.ndarray,
    mask: np.ndarray,
    cu: np.ndarray,
    unit: int,
    cp_rank: int,
    fill: int,
) -> None:
    """:func:`_copy_field` padded with ``fill``, and ``mask`` 1.0 where a value copied (before
    its cast) differs from ``fill``, else 0.0."""
    at = 0
    for i in range(cu.shape[0] - 1):
        start = cu[i]
        real = cu[i + 1] - start
        span = (real + unit - 1) // unit * unit
        c = span // unit
        for h in range(1 if cp_rank < 0 else 2):
            lo = 0 if cp_rank < 0 else (cp_rank if h == 0 else unit - 1 - cp_rank) * c
            hi = span if cp_rank < 0 else lo + c
            stop = min(hi, real)
            n = stop - lo
            if n > 0:
                dst, mine = out[at : at + n], mask[at : at + n]
                run = src[start + lo : start + stop]
                for j in range(n):
                    value = run[j]
                    dst[j] = value
                    mine[j] = np.float32(value != fill)
                at += n
            n = hi - max(lo, stop)
            if n > 0:
                dst, mine = out[at : at + n], mask[at : at + n]
                for j in range(n):
                    dst[j] = fill
                    mine[j] = 0.0
                at += n


@njit
def _first_field(
    src: np.ndarray, out: np.ndarray, cu: np.ndarray, unit: int, cp_rank: int, fill: int, ramp: bool
) -> int:
    """:func:`_copy_field` of a field each of whose segments follows from its first token
    (read alone): that token (with ``ramp`` plus the offset, over the padding too); the tokens
    written."""
    at = 0
    for i in range(cu.shape[0] - 1):
        start = cu[i]
        real = cu[i + 1] - start
        span = (real + unit - 1) // unit * unit
        c = span // unit
        for h in range(1 if cp_rank < 0 else 2):
            lo = 0 if cp_rank < 0 else (cp_rank if h == 0 else unit - 1 - cp_rank) * c
            hi = span if cp_rank < 0 else lo + c
            if ramp:  # the positions run on (an empty segment's src unread)
                dst, base = out[at : at + hi - lo], (src[start] + lo if hi > lo else 0)
                for j in range(hi - lo):
                    dst[j] = base + j
                at += hi - lo
                continue
            stop = min(hi, real)
            n = stop - lo
            if n > 0:
                dst, first = out[at : at + n], src[start]
                for j in range(n):
                    dst[j] = first
                at += n
            n = hi - max(lo, stop)
            if n > 0:
                dst = out[at : at + n]
                for j in range(n):
                    dst[j] = fill
                at += n
    return at


@njit
def zigzag_into(cu_padded: np.ndarray, cp_size: int, first_rank: int, out: np.ndarray) -> None:
    """Write ranks ``first_rank, first_rank + 1, ...``'s positions in the padded batch into the
    rows of ``out`` (int64, (R, T / C)): for every segment of ``cu_padded`` (int64, (n + 1,),
    each a multiple of ``2 C``) at ``o`` with chunks of ``c``, ``[o + r c, o + (r + 1) c)`` then
    ``[o + (2C - 1 - r) c, o + (2C - r) c)``."""
    unit = 2 * cp_size
    for k in range(out.shape[0]):
        r = first_rank + k
        row = out[k]
        at = 0
        for i in range(cu_padded.shape[0] - 1):
            c = (cu_padded[i + 1] - cu_padded[i]) // unit
            for lo in (cu_padded[i] + r * c, cu_padded[i] + (unit - 1 - r) * c):
                dst = row[at : at + c]
                for j in range(c):
                    dst[j] = lo + j
                at += c
