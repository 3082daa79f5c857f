"""Fetching a remote store's check blocks: the node cache's claims, range requests, verification,
the per-process memory LRU and the look-ahead threads.

:class:`BlockFetcher` is the half of :class:`~mmpack.remote.backend.RemoteBackend` that
moves blocks (the other half opens the store and serves reads).  Blocks are claimed in the node
cache before they are fetched (a block another process or thread holds is waited for instead),
fetched as runs of blocks at most ``merge_gap_bytes`` apart (one range request per run, all runs
concurrently, the transport's ``max_concurrency`` at a time), CRC-checked (a mismatch is fetched
once more, then it is a :class:`~mmpack.errors.FormatError`), written to the cache as far as its
limit allows, the rest kept in a per-process memory LRU of :data:`MEMORY_BLOCKS_BYTES`.  The
claim-fetch-store loop is :meth:`~mmpack.remote.cache.BlockCache.fetch_shared`, which the
remote Zarr backend uses too.

Look-ahead: :meth:`BlockFetcher.prefetch` queues hinted blocks; up to :data:`_AHEAD_THREADS`
threads per process drain the queue, each taking everything queued at once, so the blocks of
several hinted batches share range requests (measured by ``python -m benchmarks.bench_remote``:
with look-ahead 8 at 20 ms, merging and sharing cut the requests of 48 window batches from ~1,000
to ~500 and raised throughput ~1.5x on a 16 MB store; on a store much larger than an epoch's
reads merges are rarer).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.remote.blocks import runs_of
from mmpack.remote.cache import BlockCache
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.integrity import block_digest

__all__ = ["BlockFetcher", "MEMORY_BLOCKS_BYTES"]

_AHEAD_THREADS = 4  # look-ahead threads per process (each with concurrent range requests)
_AHEAD_MAX_BLOCKS = 4096  # blocks one look-ahead thread takes from the queue at a time
MEMORY_BLOCKS_BYTES = 128 << 20
"""Verified blocks kept in memory per process (LRU): look-ahead results the cache could not keep,
and blocks fetched without a cache, which later batches of a shuffled epoch touch again."""


class BlockFetcher:
    """Fetching, verifying and caching blocks (a mixin of ``RemoteBackend``, which sets the
    attributes below and ``_init_process_state`` the per-process ones)."""

    transport: Transport
    cache: BlockCache | None
    url: str
    data: str
    block: int
    itemsize: int
    nbytes: int
    table: np.ndarray
    _digest_kind: str  # the check table's kind: "crc32" or "xxh64"
    stats: dict[str, int]
    _lock: threading.Lock
    _ready: OrderedDict[int, bytes]
    _ready_bytes: int
    _queue: dict[int, None]
    _pending: dict[int, threading.Event]
    _drains: int
    _prefetcher: Any

    def _cache_file(self) -> CacheFile | None:
        raise NotImplementedError

    def _block_ids(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _block_span(self, b: int) -> tuple[int, int]:
        lo = b * self.block
        return lo, min(lo + self.block, self.nbytes)

    def _intact(self, b: int, data: bytes) -> bool:
        lo, hi = self._block_span(b)
        return len(data) == hi - lo and block_digest(self._digest_kind, data) == int(self.table[b])

    def _get_blocks(self, ids: np.ndarray, cf: CacheFile | None) -> dict[int, Any]:
        """Every block of ``ids``: from memory, the node cache, a look-ahead in flight, or
        fetched now (id -> its bytes, or a view of them in the cache's mapping)."""
        if cf is not None:
            self.stats["cache_hits"] += int(cf.present(ids).sum())
        found: dict[int, Any] = {}
        waits: list[threading.Event] = []
        with self._lock:
            for b in ids.tolist():
                if cf is not None and cf.state[b]:
                    continue
                data = self._ready.get(b)
                if data is not None:
                    self._ready.move_to_end(b)
                    found[b] = data
                elif b in self._pending:
                    waits.append(self._pending[b])
                else:
                    self._queue.pop(b, None)  # hinted but not taken yet: fetched here, now
        for ev in set(waits):
            ev.wait(self.transport.read_timeout * (self.transport.retries + 1))
        if waits:
            with self._lock:
                for b in ids.tolist():
                    data = self._ready.get(b)
                    if data is not None and b not in found:
                        found[b] = data
        missing = [b for b in ids.tolist() if b not in found and (cf is None or not cf.state[b])]
        if missing:
            fresh = self._fetch_shared(missing, cf)
            self._remember(fresh)
            found.update(fresh)
        if cf is not None:
            for b in ids.tolist():
                if b not in found:
                    found[b] = cf.block_bytes(b)  # present: _fetch_shared stored it
        return found

    def _remember(self, blocks: dict[int, bytes]) -> None:
        with self._lock:
            for b, data in blocks.items():
                if b not in self._ready:
                    self._ready[b] = data
                    self._ready_bytes += len(data)
            while self._ready_bytes > MEMORY_BLOCKS_BYTES:  # least recently used first
                self._ready_bytes -= len(self._ready.popitem(last=False)[1])

    def _fetch_shared(self, missing: list[int], cf: CacheFile | None) -> dict[int, bytes]:
        """Fetch blocks into the node cache (:meth:`BlockCache.fetch_shared`: not those another
        process or thread is fetching now).  Returns the blocks fetched that the cache could not
        keep (no room), which the caller keeps in memory."""
        if cf is None:
            return self._fetch(missing)
        assert self.cache is not None
        fetched, unstored = self.cache.fetch_shared(
            cf, missing, self._fetch, self.transport.read_timeout
        )
        return {b: fetched[b] for b in unstored}

    def _fetch(self, ids: list[int]) -> dict[int, bytes]:
        """Fetch blocks ``ids`` (sorted): one range request per run of adjacent blocks, all at
        once; verify every block (one re-fetch of a bad block, then FormatError)."""
        runs = runs_of(ids, self.block, self.transport.merge_gap_bytes // self.block)
        key = self.data + "tokens.bin"
        ranges = [(self._block_span(r[0])[0], self._block_span(r[-1])[1]) for r in runs]
        try:
            return self._fetch_runs(key, runs, ranges)
        except ObjectMissing:
            raise StateMismatchError(
                f"{self.url}: {key} is gone: the store was rebuilt or deleted after it was "
                "opened; open it again"
            ) from None

    def _fetch_runs(
        self, key: str, runs: list[list[int]], ranges: list[tuple[int, int]]
    ) -> dict[int, bytes]:
        pieces = self.transport.get_ranges(key, ranges)
        with self._lock:
            self.stats["requests"] += len(ranges)
            self.stats["bytes_fetched"] += sum(hi - lo for lo, hi in ranges)
        out: dict[int, bytes] = {}
        for run, piece in zip(runs, pieces):
            mv = memoryview(piece)
            for k, b in enumerate(run):
                lo, hi = self._block_span(b)
                data = bytes(mv[k * self.block : k * self.block + hi - lo])
                if not self._intact(b, data):
                    data = self.transport.get_ranges(key, [(lo, hi)])[0]
                    if not self._intact(b, data):
                        raise FormatError(
                            f"{self.url}: {key} bytes {lo}..{hi} (check block {b}) fail their "
                            f"checksum (stored {int(self.table[b]):#010x}, got "
                            f"{block_digest(self._digest_kind, data):#010x}): the object is corrupt; rebuild the store"
                        )
                out[b] = data
        return out

    # ------------------------------------------------------------------------------ look-ahead
    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """Queue the blocks of these ranges that are neither in the node cache nor in memory
        for the look-ahead threads (up to :data:`_AHEAD_THREADS` per process), which take
        everything queued at once, so blocks hinted by several batches share range requests;
        a later ``read_ranges`` finds them in the cache or memory (or waits for them, or takes
        those still queued itself).  Errors surface there.  Returns the number of blocks
        queued."""
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        cf = self._cache_file()
        if cf is not None and cf.covers(starts, lengths, self.itemsize):
            return 0  # all cached: the common case of a second epoch, ~1 us
        ids = self._block_ids(starts, lengths)
        if cf is not None:
            ids = ids[~cf.present(ids)]
        with self._lock:
            todo = [
                b
                for b in ids.tolist()
                if b not in self._ready and b not in self._pending and b not in self._queue
            ]
            if not todo:
                return 0
            self._queue.update(dict.fromkeys(todo))
            if self._drains < _AHEAD_THREADS:
                if self._prefetcher is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._prefetcher = ThreadPoolExecutor(
                        _AHEAD_THREADS, thread_name_prefix="mmpack-ahead"
                    )
                self._drains += 1
                self._prefetcher.submit(self._drain)
        return len(todo)

    def _drain(self) -> None:
        """A look-ahead thread: fetch everything queued (into the node cache, or memory for
        what it cannot keep), again until the queue is empty."""
        while True:
            with self._lock:
                take = sorted(self._queue)[:_AHEAD_MAX_BLOCKS]
                if not take:
                    self._drains -= 1
                    return
                for b in take:
                    del self._queue[b]
                ev = threading.Event()
                for b in take:
                    self._pending[b] = ev
            try:
                cf = self._cache_file()
                need = [b for b in take if cf is None or not cf.state[b]]
                self._remember(self._fetch_shared(need, cf) if need else {})
            except Exception:  # the reader that needs these blocks fetches them and reports
                pass
            finally:
                with self._lock:
                    for b in take:
                        self._pending.pop(b, None)
                ev.set()
