"""Page arithmetic of a remote store: which pages token ranges touch, how adjacent pages
are grouped into range requests, and the served bytes copied out of them.

A remote store's ``tokens.bin`` is checked in pages of ``page`` bytes (a power of 2; the last
page may be short).  Pure functions, no I/O: :class:`~mmpack._src.remote.backend.RemoteBackend`
does the fetching, caching and verification with them.

Cost: :func:`page_ids` is vectorized, O(pages touched) plus a sort (``np.unique``);
:func:`runs_of` is one pass over the sorted ids; :func:`gather` copies each served byte once
(a range spans one page or a few, so its Python loop runs about once per range).
"""

from __future__ import annotations

import numpy as np

__all__ = ["gather", "page_ids", "runs_of"]

_MAX_RUN_BYTES = 8 << 20
"""A longer run of adjacent pages is split, so big reads go out in parallel."""


def page_ids(starts: np.ndarray, lengths: np.ndarray, itemsize: int, page: int) -> np.ndarray:
    """The sorted, unique ids of the pages that token ranges ``[start, start + length)`` touch
    (empty ranges touch none)."""
    keep = lengths > 0
    lo = starts[keep] * itemsize
    hi = (starts[keep] + lengths[keep]) * itemsize
    first = lo // page
    count = (hi - 1) // page - first + 1
    if first.size == 0:
        return np.empty(0, np.int64)
    # shape (sum(count),): first[r], first[r] + 1, ..., last[r] for every range r
    rep = np.repeat(first - np.cumsum(count) + count, count)
    return np.unique(rep + np.arange(int(count.sum()), dtype=np.int64))


def runs_of(ids: list[int], page: int, gap: int = 0) -> list[list[int]]:
    """Sorted page ids grouped into runs of at most _MAX_RUN_BYTES each; ids at most ``gap``
    pages apart join one run, the pages between them filled in (fetched too)."""
    runs: list[list[int]] = []
    per_run = max(1, _MAX_RUN_BYTES // page)
    for b in ids:
        if runs and b - runs[-1][-1] - 1 <= gap and b - runs[-1][0] < per_run:
            runs[-1].extend(range(runs[-1][-1] + 1, b + 1))
        else:
            runs.append([b])
    return runs


def gather(
    pages: dict[int, bytes], starts: np.ndarray, lengths: np.ndarray, itemsize: int, page: int
) -> np.ndarray:
    """The bytes of token ranges back to back, copied out of ``pages`` (id -> page bytes,
    holding every page the ranges touch)."""
    out = np.empty(int(lengths.sum()) * itemsize, dtype=np.uint8)
    pos = 0
    for lo, n in zip((starts * itemsize).tolist(), (lengths * itemsize).tolist()):
        while n > 0:  # a range spans one page or a few
            b, off = divmod(lo, page)
            take = min(n, page - off)
            out[pos : pos + take] = np.frombuffer(pages[b], np.uint8, take, off)
            pos += take
            lo += take
            n -= take
    return out
