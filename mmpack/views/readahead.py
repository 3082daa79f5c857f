"""Read-ahead for cold stores: the views' seam between "which samples come next" and the store.

Every view answers ``prefetch(indices)``: it turns the samples' indices into their flat token
ranges (the window arithmetic, or the packing plan's pieces) and hands them to
:meth:`mmpack.store.reader.TokenStore.prefetch`, which requests them without waiting (the memmap
backend issues one ``madvise(MADV_WILLNEED)`` per range; a remote backend may start its range
fetches there).  Three callers use that seam:

- a batch (``__getitems__``) prefetches its own ranges before the gather kernel runs, so the
  batch's page reads are queued together instead of served one fault at a time;
- :class:`Lookahead` wraps an iterable of index batches (a ``BatchSampler``) and prefetches the
  next ``depth`` batches while the current one is read and trained on;
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
16 threads of ``pread`` 12.8 ms), 2.0 ms when :class:`Lookahead` requested it during a 50 ms step
(0.58 ms warm: the rest is minor page faults mapping the prefetched pages).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import cycle, repeat
from typing import Any, Protocol

import numpy as np

__all__ = ["ColdReads", "HintedBatch", "Lookahead", "PROBE_EVERY", "flat_start", "prefetch_ranges"]

PROBE_EVERY = 256
"""Warm single reads between two residency probes (a power of two)."""

_WARM_PROBES = 4  # resident probes in a row that end cold mode


class _Prefetching(Protocol):
    def prefetch(self, indices: Any) -> int: ...


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


def prefetch_ranges(store: Any, starts: np.ndarray, lengths: np.ndarray) -> int:
    """Request ``starts, lengths`` unless a probe of a few of them finds them resident."""
    if starts.size == 0 or store.resident(starts):
        return 0
    return store.prefetch(starts, lengths)


class HintedBatch(list):
    """A batch of sample indices with ``ahead``: the indices the same DataLoader worker will
    read next (the views' ``__getitems__`` prefetch them before reading this batch)."""

    ahead: list[int]


class Lookahead:
    """Index batches, with the tokens of the next ``depth`` batches requested ahead.

    Parameters
    ----------
    batches : iterable of sequences of int
        What a ``torch.utils.data.BatchSampler`` yields (or any iterable of index batches).
    dataset : object with ``prefetch(indices)``
        A :class:`~mmpack.views.window.WindowDataset`, :class:`~mmpack.views.packed.PackedDataset`
        or :class:`~mmpack.sampling.mixture.Mixture`.
    depth : int
        Batches requested ahead of the one being yielded (>= 1).
    num_workers : int
        ``0`` (default): the requests are made here, in the process that iterates the batches.
        That serves local stores under any DataLoader (the page cache is shared by the workers)
        and remote stores read in this process or through a shared node cache.  ``W > 0``: the
        requests must be made by the worker that reads the batches (a remote store's in-memory
        blocks are per process), so each batch is yielded as a :class:`HintedBatch` carrying
        ``.ahead``, the next ``depth`` batches of the same worker (a DataLoader deals batches to
        its workers round robin: ``b + W, b + 2W, ...``).  A wrong guess costs bandwidth, never
        correctness.

    Notes
    -----
    Use it as ``DataLoader(ds, batch_sampler=Lookahead(BatchSampler(sampler, B, False), ds),
    collate_fn=collate)``.  The wrapped iterable is drawn ahead of what is yielded; a resumable
    sampler's position therefore runs ahead by as many batches (as it already does under a
    DataLoader's own prefetching: save with ``state_dict(consumed=...)``).
    """

    def __init__(
        self, batches: Iterable[Any], dataset: _Prefetching, depth: int = 2, *, num_workers: int = 0
    ) -> None:
        if not callable(getattr(dataset, "prefetch", None)):
            raise TypeError(
                f"dataset must have a prefetch(indices) method, got {type(dataset).__name__}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        self.batches = batches
        self.dataset = dataset
        self.depth = depth
        self.num_workers = num_workers

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers:
            yield from self._hinted()
            return
        pending: deque[Any] = deque()
        for batch in self.batches:
            self.dataset.prefetch(batch)
            pending.append(batch)
            if len(pending) > self.depth:
                yield pending.popleft()
        while pending:
            yield pending.popleft()

    def _hinted(self) -> Iterator[HintedBatch]:
        w = self.num_workers
        window: deque[Any] = deque()
        it = iter(self.batches)
        exhausted = False
        while True:
            while not exhausted and len(window) <= w * self.depth:
                try:
                    window.append(next(it))
                except StopIteration:
                    exhausted = True
            if not window:
                return
            batch = HintedBatch(np.asarray(window.popleft()).tolist())
            same_worker = [window[k] for k in range(w - 1, len(window), w)][: self.depth]
            batch.ahead = [int(i) for b in same_worker for i in np.asarray(b).tolist()]
            yield batch
