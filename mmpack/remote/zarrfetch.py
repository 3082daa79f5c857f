"""Fetching the inner chunks of a remote sharded Zarr store: concurrent range requests, verified
decoded chunks, the node cache or the process's decoded-chunk LRU.

:class:`ChunkFetcher` serves decoded inner chunks of the token array of one remote Zarr store
(:mod:`mmpack.remote.zarr` opens the store).  Its public surface:

- :meth:`~ChunkFetcher.request`: byte ranges of several objects, all requests at once (what a
  :class:`~mmpack.store.backends._zarr_shards.ShardReader` fetches through);
- :meth:`~ChunkFetcher.reader`: a ``ShardReader`` of one array over those requests;
- :meth:`~ChunkFetcher.verified`: chunks read and checked (crc32c each; a failing chunk or
  index is fetched once more, then the :class:`~mmpack.errors.FormatError` stands);
- :meth:`~ChunkFetcher.chunks`: decoded chunks from the node cache (each chunk checked once
  per reader; the caller pins them) or, without one, the process's LRU, or fetched now;
- :attr:`~ChunkFetcher.stats`.

With a node cache the decoded chunks are stored there (one block per inner chunk; only those
this process claims: a chunk another process fetches is waited for, at most ``read_timeout``,
then read from the cache) and served from there only, under the reader's pins: the process's
LRU, whose entries nobody pins, keeps only chunks read without the node cache.  Per-process state (the request pool, the counts) is made anew in a
forked child on its first call.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.remote.cached import CachedObject
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.backends._chunk_cache import get_cache
from mmpack.store.backends._zarr_shards import ShardLayout, ShardReader

__all__ = ["ChunkFetcher"]


class _Process:
    """A :class:`ChunkFetcher`'s state in one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None  # concurrent range requests
        self.stats = {"requests": 0, "bytes_fetched": 0}


class ChunkFetcher:
    """The decoded inner chunks of the token array ``layout`` of the remote Zarr store whose
    objects are ``transport``'s keys under ``data`` (sizes in ``objects``); ``node`` is the
    array in the node cache (or None), ``cache_key`` its key in the process's chunk LRU and
    ``kept`` the local folder of its shard indexes."""

    def __init__(
        self,
        transport: Transport,
        data: str,
        objects: dict[str, int],
        layout: ShardLayout,
        node: CachedObject | None,
        cache_key: tuple,
        kept: Path,
    ) -> None:
        self.transport, self.url, self.data, self.objects = transport, transport.url, data, objects
        self.node, self.cache_key, self.dtype = node, cache_key, layout.dtype
        self._p = _Process()
        self.reader = self.make_reader("tokens", layout, kept)
        """The token array's :class:`ShardReader` (its shard indexes fetched once)."""

    def _here(self) -> _Process:
        p = self._p
        if p.pid != os.getpid():  # a forked child: the parent's threads are not here
            p = self._p = _Process()
        return p

    @property
    def stats(self) -> dict[str, int]:
        """This process's counts: range requests and the bytes they fetched."""
        return self._here().stats

    # ------------------------------------------------------------------------------ requests
    def make_reader(self, name: str, layout: ShardLayout, kept: Path) -> ShardReader:
        """A :class:`ShardReader` of array ``name`` (its shard indexes kept in ``kept``)."""

        def index_range(s: int) -> tuple[int, int]:
            size = self.objects[f"{name}/{layout.key(s)}"]
            return max(0, size - layout.index_nbytes), size

        def fetch(requests: Any) -> list[list[bytes]]:
            return self.request([(f"{name}/{layout.key(s)}", r) for s, r in requests])

        return ShardReader(layout, fetch, index_range, f"{self.url}/{self.data}{name}", kept)

    def request(self, tasks: list[tuple[str, list[tuple[int, int]]]]) -> list[list[bytes]]:
        """Byte ranges of several objects (keys under the data prefix), all requests at once
        (one per range, ``max_concurrency`` at a time)."""
        p = self._here()
        flat = [(self.data + key, r) for key, ranges in tasks for r in ranges]
        with p.lock:
            p.stats["requests"] += len(flat)
            p.stats["bytes_fetched"] += sum(hi - lo for _, (lo, hi) in flat)
            if p.pool is None and len(flat) > 1:
                p.pool = ThreadPoolExecutor(
                    self.transport.max_concurrency, thread_name_prefix="mmpack-zarr"
                )
        try:
            if len(flat) == 1:
                got = [self.transport.get_ranges(flat[0][0], [flat[0][1]])[0]]
            else:
                assert p.pool is not None
                futures = [p.pool.submit(self.transport.get_ranges, k, [r]) for k, r in flat]
                got = [f.result()[0] for f in futures]
        except ObjectMissing:
            raise StateMismatchError(
                f"{self.url}: a shard of {self.data} is gone: the store was rebuilt or deleted "
                "after it was opened; open it again"
            ) from None
        out: list[list[bytes]] = []
        at = 0
        for _, ranges in tasks:
            out.append(got[at : at + len(ranges)])
            at += len(ranges)
        return out

    @staticmethod
    def verified(reader: ShardReader, ids: np.ndarray) -> dict[int, np.ndarray]:
        """``reader.chunks(ids)``; a chunk or index failing its checksum is fetched once more
        (a bad transfer), then the FormatError stands."""
        try:
            return reader.chunks(ids)
        except FormatError:
            reader._indexes.clear()
            return reader.chunks(ids)

    # ------------------------------------------------------------------------------ chunks
    def chunks(self, uniq: np.ndarray, cf: CacheFile | None = None) -> dict[int, np.ndarray]:
        """Decoded chunks ``uniq`` (int64, sorted, unique): id -> its tokens.  With ``cf``
        (the node cache's file, whose blocks ``uniq`` the caller pins): from its mapping (views:
        the caller copies them out under its pins) or fetched into it, the process's LRU
        unused; without: from the process's LRU or fetched (and kept there)."""
        if cf is not None and self.node is not None:
            have = self.node.held(cf, uniq)
            got = {i: cf.block_bytes(i).view(self.dtype) for i in uniq[have].tolist()}
            if not have.all():
                got.update(self._fetch_shared(uniq[~have], cf))
            return got
        cache = get_cache()
        got = {i: e[0] for i, e in cache.get_many(self.cache_key, uniq.tolist()).items()}
        if len(got) < uniq.size:
            missing = uniq[~np.isin(uniq, np.fromiter(got, np.int64, len(got)))]
            fresh = self.verified(self.reader, missing)
            cache.put_many(self.cache_key, {i: (a, None) for i, a in fresh.items()})
            got.update(fresh)
        return got

    def _fetch_shared(self, ids: np.ndarray, cf: CacheFile) -> dict[int, np.ndarray]:
        """Fetch the chunks this process claims (verified) into the node cache; wait for those
        another process holds (:meth:`BlockCache.fetch_shared`), then read them from there
        (checked; a bad one is fetched here)."""
        assert self.node is not None
        fetched, _ = self.node.fetch_shared(
            cf,
            sorted(ids.tolist()),
            lambda todo: self.verified(self.reader, np.asarray(todo, np.int64)),
            self.transport.read_timeout,
        )
        rest = np.asarray([b for b in ids.tolist() if b not in fetched], np.int64)
        if rest.size:  # another process stored them
            ok = self.node.held(cf, rest)
            for b in rest[ok].tolist():
                fetched[b] = cf.block_bytes(b).view(self.dtype)
            if not ok.all():
                fetched.update(self.verified(self.reader, rest[~ok]))
        return fetched
