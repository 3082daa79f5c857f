"""Whole byte spans of a remote store's tokens fetched into the node cache in large parts, pinned
while in use and dropped once consumed: the transport under a block-window order.

:class:`SpanFetcher` serves one remote store (its :class:`~mmpack._src.remote.fetcher.PageFetcher`
and node cache) and knows nothing of samplers: ``mmpack._src.torch.block_fetch`` turns a block-window
order's windows into token spans and calls

- :meth:`~SpanFetcher.fetch`: claim every absent page of the spans in the node cache (a
  page another process holds is left to it), cut the claimed runs into parts of at most
  ``part_bytes``, fetch them ``max_concurrency`` at a time through the store's page source
  (:mod:`mmpack._src.remote.sources`: a part of the memmap layout is one range request, its pages
  checked against the XXH64 table in one kernel call; a part of the Zarr layout is its inner
  chunks, one merged range request per run in a shard, each crc32c-checked and decoded; a bad
  part is fetched once more, then :class:`~mmpack.errors.FormatError`) and store it in one
  write (:meth:`PageCache.store_run`, the table's digests kept as the cache's own);
- :meth:`~SpanFetcher.pin` / :meth:`~SpanFetcher.unpin`: the spans' pages pinned
  (:meth:`CacheFile.pin`), so no process drops them meanwhile;
- :meth:`~SpanFetcher.drop`: the spans' pages nobody pins (:meth:`CacheFile.unpinned`) marked
  absent, their holes punched, their charge given back and the drop counted, so other readers
  forget their checks of them.

Cost: a span of ``s`` bytes is ``ceil(s / part_bytes)`` parts (range requests) moving ``s`` bytes plus at
most one page at each end; the checksums run in the fetch threads with per-part Python work; a
pin or a drop is one ``fcntl`` per span (one per page where a whole-span lock conflicts).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mmpack._src.core.process import PerProcess
from mmpack._src.remote.cache import warn_once
from mmpack._src.remote.cachefile import (
    PIN_WAIT_SECONDS,
    CacheFile,
    close_lock_fd,
    open_lock_fd,
)
from mmpack._src.remote.fetcher import PageFetcher

__all__ = ["PART_BYTES", "SpanFetcher"]

PART_BYTES = 4 << 20
"""Bytes of one range request of a span (a span is cut into parts fetched concurrently)."""


class _SpanState:
    """A :class:`SpanFetcher`'s state in one process (:class:`~mmpack._src.core.process.PerProcess`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pins: dict[Any, int] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.stats = {"spans": 0, "parts": 0, "requests": 0, "bytes_fetched": 0,
                      "refetched": 0, "pages_dropped": 0}  # fmt: skip


class SpanFetcher:
    """Whole token spans of the store behind ``fetcher`` into its node cache (see the module
    docstring); ``part_bytes`` bytes per range request at most."""

    def __init__(self, fetcher: PageFetcher, part_bytes: int = PART_BYTES) -> None:
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
            raise ValueError(f"part_bytes must be an integer >= 1, got {part_bytes!r}")
        self.fetcher = fetcher
        self.part_pages = max(1, part_bytes // fetcher.page)
        self._p = PerProcess(_SpanState)  # a forked child: no pins, no pool, counts from zero

    @property
    def stats(self) -> dict[str, int]:
        """This process's counts: spans asked for, parts fetched, range requests (parts plus
        re-fetches), bytes they moved, parts fetched again after a bad checksum, pages
        dropped."""
        return self._p.get().stats

    @property
    def cache(self) -> CacheFile | None:
        """The node cache's file of the tokens (None without a node cache, or while it cannot
        be had: then nothing is fetched ahead and readers fetch what they read)."""
        node = self.fetcher.node
        return None if node is None else node.file()

    def page_range(self, start: int, stop: int) -> tuple[int, int]:
        """The pages ``[b0, b1)`` that tokens ``[start, stop)`` touch."""
        f = self.fetcher
        if stop <= start:
            return 0, 0
        return start * f.itemsize // f.page, -(-(stop * f.itemsize) // f.page)

    def warm(self) -> None:
        """Compile the kernels :meth:`fetch` runs, in the calling thread (call before starting
        a thread that calls :meth:`fetch`: :meth:`PageFetcher.warm`)."""
        self.fetcher.warm()

    # ------------------------------------------------------------------------------ fetch
    def fetch(
        self,
        spans: list[tuple[int, int]],
        claimed: threading.Event | None = None,
        queued: threading.Event | None = None,
    ) -> int:
        """Fetch the absent pages of token spans ``[(start, stop), ...]`` (in the order
        given: the order they are needed) into the node cache, except those another process
        fetches now; ``claimed`` is set once the pages are claimed (before any is fetched),
        ``queued`` once every part is queued (a later call's parts then go out after them);
        neither is set where it returns early or raises (its caller sets them then).  Returns
        the bytes fetched."""
        p = self._p.get()
        cf = self.cache
        if cf is None or not spans:
            return 0
        ranges = [self.page_range(a, b) for a, b in spans]
        ids = np.unique(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges]))
        claim = cf.claim(ids[~cf.present(ids)].tolist())
        if claimed is not None:
            claimed.set()
        try:
            parts = self._parts(ranges, set(claim.mine))
            with p.lock:
                p.stats["spans"] += len(spans)
                if p.pool is None:
                    self.fetcher.warm()
                    workers = self.fetcher.transport.max_concurrency
                    p.pool = ThreadPoolExecutor(workers, thread_name_prefix="mmpack-span")
            pool = p.pool
            done = [pool.submit(self._fetch_part, cf, lo, hi) for lo, hi in parts]
            if queued is not None:
                queued.set()
            return sum(d.result() for d in done)  # FIFO: parts go out in the order needed
        finally:
            claim.close()

    def _parts(self, ranges: list[tuple[int, int]], mine: set[int]) -> list[tuple[int, int]]:
        """Runs of claimed pages ``[lo, hi)`` of each span in turn, at most ``part_pages`` each
        (a page shared by two spans goes with the first)."""
        parts: list[tuple[int, int]] = []
        for b0, b1 in ranges:
            lo = -1
            for b in range(b0, b1 + 1):
                take = b < b1 and b in mine
                if take:
                    mine.discard(b)
                if lo >= 0 and (not take or b - lo == self.part_pages):
                    parts.append((lo, b))
                    lo = -1
                if take and lo < 0:
                    lo = b
        return parts

    def _fetch_part(self, cf: CacheFile, lo: int, hi: int) -> int:
        """Fetch pages ``[lo, hi)`` through the source (one range request of pages, or the
        chunks' merged requests per shard), verified (once more on a bad one), and store them;
        returns the bytes fetched."""
        f, p = self.fetcher, self._p.get()
        moved = 0

        def count(requests: int, nbytes: int, again: bool) -> None:
            nonlocal moved
            moved += nbytes
            with p.lock:
                p.stats["requests"] += requests
                p.stats["bytes_fetched"] += nbytes
                p.stats["refetched"] += again

        data, digests = f.source.fetch_run(lo, hi, count)
        with p.lock:
            p.stats["parts"] += 1
        node = f.node
        assert node is not None  # a span fetcher exists only with a node cache
        same = digests is not None and cf.page == f.page  # the digests are the cache's own
        node.cache.store_run(cf, lo, data, digests if same else None)
        return moved

    # ------------------------------------------------------------------------------ pins
    def pin(self, key: Any, spans: list[tuple[int, int]]) -> None:
        """Pin the pages of token spans under ``key`` (until :meth:`unpin`): no process
        of the node drops them meanwhile."""
        pins = self._p.get().pins
        cf = self.cache
        if cf is None or key in pins:
            return
        fd = open_lock_fd(cf.state_path)
        pins[key] = fd
        ranges = [self.page_range(a, b) for a, b in spans]
        # a span being dropped elsewhere (for ms) and still so after the wait stays unpinned:
        # its pages are then fetched again; every reader pins what it reads itself
        cf.pin(fd, [r[0] for r in ranges], [r[1] for r in ranges], PIN_WAIT_SECONDS)

    def unpin(self, key: Any) -> None:
        """Release the pins taken under ``key`` (nothing if none)."""
        fd = self._p.get().pins.pop(key, -1)
        if fd >= 0:
            close_lock_fd(fd)

    @property
    def pinned(self) -> list[Any]:
        """The keys pinned by this process now."""
        return list(self._p.get().pins)

    def drop(self, spans: list[tuple[int, int]]) -> int:
        """Drop the present pages of token spans that no process of the node pins (see
        the module docstring); returns how many were dropped."""
        p = self._p.get()
        cf = self.cache
        node = self.fetcher.node
        if cf is None or node is None or not spans:
            return 0
        with cf.unpinned([self.page_range(a, b) for a, b in spans]) as ids:
            try:
                dropped = node.cache.drop_pages(cf, ids)
            except OSError as exc:  # the cache's lock is stuck: the pages stay until evicted
                warn_once(node.cache.cache_dir, exc)
                dropped = 0
        with p.lock:
            p.stats["pages_dropped"] += dropped
        return dropped
