"""Which fixed-size chunks a batch of token ranges touches, and the ranges copied out of them.

Shared by the Zarr backends (:mod:`mmpack._src.store.backends._zarr` and
:mod:`mmpack._src.remote.zarr`).  :func:`touched_chunks` is vectorised (numpy: one ``unique``
over the chunk ids, one segment per (range, chunk)); :func:`assemble` copies the served bytes
once, with one ``np.concatenate`` over the segments (about 1 us a range in Python here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["assemble", "touched_chunks"]


@dataclass(frozen=True)
class _Touched:
    """The chunks a batch of ranges touches: ``uniq`` (sorted unique chunk ids) and, range by
    range in order, one segment per (range, chunk): ``seg_chunk``, and ``seg_lo``/``seg_hi``
    inside that chunk (int64 arrays); ``live`` marks the non-empty ranges."""

    uniq: np.ndarray
    seg_chunk: np.ndarray
    seg_lo: np.ndarray
    seg_hi: np.ndarray
    live: np.ndarray


def touched_chunks(starts: np.ndarray, lengths: np.ndarray, c: int) -> _Touched:
    """The ``c``-item chunks that ranges ``[starts[k], starts[k] + lengths[k])`` touch (int64
    arrays; empty ranges touch none), as :class:`_Touched`."""
    live = lengths > 0
    s, e = starts[live], starts[live] + lengths[live]
    first = s // c
    counts = (e - 1) // c - first + 1
    if counts.size and counts.max() == 1:  # every range inside one chunk (a common batch)
        seg = first
    else:
        # shape (sum(counts),): first[r], first[r] + 1, ..., last[r] for every range r
        total = int(counts.sum())
        run_start = np.cumsum(counts) - counts
        seg = np.repeat(first, counts) + (np.arange(total) - np.repeat(run_start, counts))
        s, e = np.repeat(s, counts), np.repeat(e, counts)
    base = seg * c
    lo = np.maximum(s, base) - base
    hi = np.minimum(e, base + c) - base
    return _Touched(np.unique(seg), seg, lo, hi, live)


def assemble(
    chunks: dict[int, np.ndarray], t: _Touched, lengths: np.ndarray, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, src_starts)``: the non-empty ranges back to back, copied out of their decoded
    chunks with one ``np.concatenate`` (a batch inside one chunk returns that chunk, read-only,
    no copy); empty ranges point at 0."""
    src_starts = np.zeros(lengths.shape[0], dtype=np.int64)
    if t.uniq.size == 0:
        return np.empty(0, dtype=dtype), src_starts
    if t.uniq.size == 1:
        src_starts[t.live] = t.seg_lo[: int(t.live.sum())]
        return chunks[int(t.uniq[0])].astype(dtype, copy=False), src_starts
    at = np.cumsum(lengths) - lengths
    src_starts[t.live] = at[t.live]
    pieces = [
        chunks[k][a:b]
        for k, a, b in zip(t.seg_chunk.tolist(), t.seg_lo.tolist(), t.seg_hi.tolist())
    ]
    return np.concatenate(pieces).astype(dtype, copy=False), src_starts
