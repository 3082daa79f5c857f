"""Fetching a remote store's token pages: the node cache's claims over a page source: the
verified read of whatever the block order did not fetch.

:class:`PageFetcher` serves the pages of a store's tokens from a page source
(:mod:`mmpack._src.remote.sources`: the memmap layout's checked pages or the Zarr layout's inner
chunks), which locates, fetches and verifies them.  Its public surface is small:

- :meth:`~PageFetcher.page_ids`: the pages that token ranges touch;
- :meth:`~PageFetcher.cached`: the node cache's mapped tokens when it holds every page of the
  ranges, checked (the zero-copy hit path), else None;
- :meth:`~PageFetcher.pages`: every page of a list, from the node cache or fetched now;
- :attr:`~PageFetcher.stats`.

Fetching: pages are claimed in the node cache first (a page another process or thread holds
is waited for instead, at most the transport's ``read_timeout``), fetched and verified by the
source and written to the node cache as far as its limit allows; what it cannot keep is served
from the fetched bytes and fetched again when read again.  The node cache is
:class:`~mmpack._src.remote.cached.CachedObject` (its claim loop
:meth:`~mmpack._src.remote.cache.PageCache.fetch_shared`); without one, every read fetches.  There is
no look-ahead here: fetching ahead is the block order's (:class:`~mmpack._src.remote.spans.SpanFetcher`
driven by the sampler, over the same source), into the same node cache.

The counts are per process (made anew in a forked child).  Cost: the source's
(:mod:`mmpack._src.remote.sources`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from mmpack._src.core.process import PerProcess
from mmpack._src.remote.cached import CachedObject
from mmpack._src.remote.cachefile import CacheFile
from mmpack._src.remote.pages import page_ids
from mmpack._src.remote.sources import FetchSource
from mmpack._src.remote.transport import Transport

__all__ = ["PageFetcher"]


class _Process:
    """A :class:`PageFetcher`'s state in one process (:class:`~mmpack._src.core.process.PerProcess`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}


class PageFetcher:
    """The verified pages of ``source`` (see the module docstring); ``node`` is the tokens in
    the node cache (pages of ``source.page`` bytes), or None to fetch every read."""

    def __init__(self, source: FetchSource, node: CachedObject | None) -> None:
        self.source, self.node = source, node
        self.transport: Transport = source.transport
        self.url = source.transport.url
        self.page, self.nbytes, self.itemsize = source.page, source.nbytes, source.itemsize
        self._p = PerProcess(_Process)  # a forked child: counts from zero

    @property
    def stats(self) -> dict[str, int]:
        """This process's counts: range requests, bytes they fetched, pages :meth:`pages`
        found in the node cache."""
        return self._p.get().stats

    def count(self, requests: int, nbytes: int, again: bool = False) -> None:
        """Count range requests made for this fetcher (:data:`mmpack._src.remote.sources.Count`)."""
        p = self._p.get()
        with p.lock:
            p.stats["requests"] += requests
            p.stats["bytes_fetched"] += nbytes

    def warm(self) -> None:
        """Compile the kernels fetch threads run in the calling thread, once per process
        (:meth:`PageSource.warm`)."""
        self.source.warm()

    # ------------------------------------------------------------------------------ lookups
    def page_ids(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """int64, sorted, unique: the pages token ranges ``[starts, starts + lengths)`` touch."""
        return page_ids(starts, lengths, self.itemsize, self.page)

    def cached(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """The node cache's mapped file as items (zero copy: range k is ``[starts[k],
        starts[k] + lengths[k])`` of it) when it holds every page the ranges touch, each
        checked by this reader; else None."""
        if self.node is None:
            return None
        cf = self.node.serves(starts, lengths)
        return None if cf is None else cf.tokens

    # ------------------------------------------------------------------------------ pages
    def pages(self, ids: np.ndarray, use_cache: bool = True) -> dict[int, Any]:
        """Every page of ``ids`` (int64, sorted, unique): id -> its bytes, or a view of them
        in the node cache's mapping (the caller pins them: :meth:`CachedObject.pinned`),
        verified; ``use_cache=False``: never from or into the node cache."""
        p = self._p.get()
        cf = self.node.file() if self.node is not None and use_cache else None
        if cf is None or self.node is None:
            return self._fetch(ids.tolist())
        have = self.node.held(cf, ids)
        p.stats["cache_hits"] += int(have.sum())
        found: dict[int, Any] = {}
        missing = [b for b in ids[~have].tolist() if not cf.state[b]]
        if missing:  # fetched here, or waited for where another process or thread holds them
            fetched, unstored = self.node.fetch_shared(
                cf, missing, self._fetch, self.transport.read_timeout
            )
            found.update((b, fetched[b]) for b in unstored)  # the cache could not keep them
        self._from_cache(cf, [b for b in ids.tolist() if b not in found], found)
        return found

    def _from_cache(self, cf: CacheFile, ids: list[int], found: dict[int, Any]) -> None:
        """Pages ``ids``, present in ``cf`` (stored here or by another process meanwhile),
        into ``found``: checked first, a bad one fetched again."""
        if not ids:
            return
        assert self.node is not None
        arr = np.asarray(ids, np.int64)
        ok = self.node.held(cf, arr)
        for b in arr[ok].tolist():
            found[b] = cf.page_bytes(b)
        if not ok.all():
            found.update(self._fetch(arr[~ok].tolist()))

    def _fetch(self, ids: list[int]) -> dict[int, Any]:
        """Pages ``ids`` (sorted) fetched and verified by the source."""
        return dict(self.source.fetch(ids, self.count))
