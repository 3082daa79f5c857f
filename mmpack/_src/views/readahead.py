"""Cold local stores: a read requests its own pages together instead of one fault at a time.

A view turns the samples it is about to read into their flat token ranges (the window
arithmetic, or the packing plan's pieces) and hands them to
:meth:`mmpack.TokenStore.prefetch`, which requests them without waiting (the memmap
backend issues one ``madvise(MADV_WILLNEED)`` per range; other backends do nothing: a remote
store's blocks are fetched ahead by the block order, :mod:`mmpack._src.torch.block_fetch`).  Two
readers use that seam:

- a batch (``__getitems__``) prefetches its own ranges before the gather kernel runs, so the
  batch's page reads are queued together instead of served one fault at a time;
- single reads (``ds[i]``) use :class:`ColdReads`: the first read and every
  :data:`PROBE_EVERY`-th after it ask the store whether the sample's first page is in memory
  (``mincore``, ~5 us); once a probe finds it missing, every read requests its own range first
  (one ``madvise``, so a window's two or three pages are read in one go rather than one fault
  after another), until four probes in a row find the data resident.  On warm data this costs
  one C-level call per read (``ColdReads.step``, ~10 ns).

The residency probe matters because a ``madvise`` costs 2-3 us on this VM even when every page
is resident: one per range on a warm batch of 256 windows would add ~0.6 ms to a 0.7 ms batch,
while two probes add ~10 us.  Measured by ``benchmarks/bench_cold.py`` on a 2.0 GiB store evicted
before each measurement (2-core VM, load average ~4): a cold window ``ds[i]`` 82 us against 59 us
for an ``os.pread`` of the same bytes (114 us with ``MADV_RANDOM`` alone, 6,276 us with the
default advice); a cold batch of 256 windows 6.4 ms (1,055 ms before; a ``pread`` loop 13.3 ms,
16 threads of ``pread`` 12.8 ms; 0.58 ms warm).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import cycle, repeat
from typing import Any

import numpy as np

__all__ = ["ColdReads", "PROBE_EVERY", "flat_start"]

PROBE_EVERY = 256
"""Warm single reads between two residency probes (a power of two)."""

_WARM_PROBES = 4  # resident probes in a row that end cold mode


class ColdReads:
    """When single reads should request their pages first.  ``cold`` is True while recent probes
    found the store's pages missing.  Not thread-safe by design: races change only whether a read
    prefetches, never what it returns.

    ``step`` is a C-level callable, not a method: an ``itertools`` iterator's ``__next__``
    (``True`` every :data:`PROBE_EVERY`-th read while warm, always ``True`` while cold), so a
    warm read pays one C call (~10 ns) instead of a Python method that counts (~60 ns; ``ds[i]``
    is ~3 us)."""

    __slots__ = ("_cold", "_streak", "step", "tick")

    def __init__(self) -> None:
        self._streak = 0
        self.tick = 0  # reads since the last probe, counted while cold
        self._cold = False
        self.step: Callable[[], bool] = _every_probe(first=True)  # the first read probes

    @property
    def cold(self) -> bool:
        return self._cold

    @cold.setter
    def cold(self, value: bool) -> None:
        self._cold = bool(value)
        self.step = repeat(True).__next__ if self._cold else _every_probe(first=False)

    def before_read(self, store: Any, probe: int, request: Callable[[], int]) -> int:
        """Called (by a view) before a single read when :attr:`step` returned True: on every
        :data:`PROBE_EVERY`-th read and on every read while cold.  ``probe`` is the flat position
        of the sample's first token and ``request()`` asks the store for the sample's ranges --
        only called when they are wanted, so a warm process never loads the kernel behind it.
        Returns the number of requests issued."""
        if self._cold:
            self.tick += 1
            if self.tick % PROBE_EVERY:  # not a probe read: request the pages
                return request()
        self.tick = 0
        if store.resident(np.array([probe], dtype=np.int64)):
            self._streak += 1
            if self._cold and self._streak >= _WARM_PROBES:
                self.cold = False
            if not self._cold:
                return 0
        else:
            self._streak = 0
            if not self._cold:
                self.cold = True
        return request()


def _every_probe(first: bool) -> Callable[[], bool]:
    """``True`` on every :data:`PROBE_EVERY`-th call (on the first one too when ``first``)."""
    pattern = (False,) * (PROBE_EVERY - 1) + (True,)
    if first:
        pattern = pattern[-1:] + pattern[:-1]
    return cycle(pattern).__next__


def flat_start(offsets: np.ndarray, use_eot: int, v: int) -> int:
    """The flat token position of virtual position ``v`` of the stream with an eot after every
    document (``use_eot=1``; ``v`` itself otherwise), by a binary search in Python: ~22 steps
    for 2M documents, a few microseconds, no kernel to load (used for residency probes).
    An eot position maps to the start of the next document."""
    if not use_eot:
        return v
    lo, hi = 0, offsets.shape[0] - 1  # the largest j with offsets[j] + j <= v
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if int(offsets[mid]) + mid <= v:
            lo = mid
        else:
            hi = mid
    return min(v - lo, int(offsets[lo + 1]))
