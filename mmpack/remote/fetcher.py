"""Fetching one remote object's check blocks: range requests, verification, the node cache's
claims, a per-process memory LRU and look-ahead threads.

:class:`BlockFetcher` serves the blocks of one object (a remote store's ``tokens.bin``) that is
checked in blocks of ``block`` bytes against a table of per-block XXH64 digests.
Its public surface is small:

- :meth:`~BlockFetcher.block_ids`: the blocks that token ranges touch;
- :meth:`~BlockFetcher.cached`: the node cache's mapped tokens when it holds every block of the
  ranges, checked (the zero-copy hit path), else None;
- :meth:`~BlockFetcher.blocks`: every block of a list, from the node cache, this process's
  memory, a look-ahead in flight, or fetched now;
- :meth:`~BlockFetcher.prefetch`: queue the blocks of ranges for the look-ahead threads;
- :meth:`~BlockFetcher.intact` and :attr:`~BlockFetcher.stats`.

Fetching: blocks are claimed in the node cache first (a block another process or thread holds
is waited for instead, at most the transport's ``read_timeout``), fetched as runs of blocks at
most ``merge_gap_bytes`` apart (one range request per run, all runs concurrently, the
transport's ``max_concurrency`` at a time), checked against the table (a mismatch is fetched
once more, then it is a :class:`~mmpack.errors.FormatError`: a corrupt object never yields
data), written to the node cache as far as its limit allows, the rest kept in a per-process
memory LRU of :data:`MEMORY_BLOCKS_BYTES`.  The node cache is
:class:`~mmpack.remote.cached.CachedObject` (its claim loop
:meth:`~mmpack.remote.cache.BlockCache.fetch_shared`); without one, blocks live in memory only.

Look-ahead: :meth:`BlockFetcher.prefetch` queues hinted blocks; up to :data:`AHEAD_THREADS`
threads per process drain the queue, each taking everything queued at once, so the blocks of
several hinted batches share range requests (measured by ``python -m benchmarks.bench_remote``:
with look-ahead 8 at 20 ms, merging and sharing cut the requests of 48 window batches from ~1,000
to ~500 and raised throughput ~1.5x on a 16 MB store; on a store much larger than an epoch's
reads merges are rarer).  A read takes blocks still queued itself and waits for those in flight
(at most ``read_timeout * (retries + 1)``, then it fetches them itself).

Per-process state (the threads, the LRU, the queue, the counts) is made anew in a forked child
on its first call.  Cost: see :mod:`mmpack.remote.backend`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.remote.blocks import block_ids, runs_of
from mmpack.remote.cached import CachedObject
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.integrity import block_digest, block_digests

__all__ = ["AHEAD_THREADS", "BlockFetcher", "MEMORY_BLOCKS_BYTES"]

AHEAD_THREADS = 4
"""Look-ahead threads per process (each with concurrent range requests)."""
_AHEAD_MAX_BLOCKS = 4096  # blocks one look-ahead thread takes from the queue at a time
MEMORY_BLOCKS_BYTES = 128 << 20
"""Verified blocks kept in memory per process (LRU): look-ahead results the cache could not keep,
and blocks fetched without a cache, which later batches of a shuffled epoch touch again."""


class _Process:
    """A :class:`BlockFetcher`'s state in one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.ready: OrderedDict[int, bytes] = OrderedDict()  # verified blocks in memory, LRU
        self.ready_bytes = 0
        self.queue: dict[int, None] = {}  # blocks hinted by prefetch(), not yet taken
        self.pending: dict[int, threading.Event] = {}  # blocks a look-ahead thread fetches
        self.drains = 0  # look-ahead threads running
        self.pool: ThreadPoolExecutor | None = None
        self.warm = False  # the fetch threads' kernels compiled in this process
        self.stats = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}


class BlockFetcher:
    """The verified blocks of object ``key`` of ``transport``.

    Parameters
    ----------
    transport : Transport
        Where the object is (its ``read_timeout``, ``retries`` and ``merge_gap_bytes`` apply).
    key : str
        The object's key (``"data-<id>/tokens.bin"``).
    table : numpy.ndarray
        uint64, (nblocks,): each block's XXH64.
    block : int
        Bytes per block (a power of 2; the last block may be short).
    nbytes, itemsize : int
        The object's size and its items' size (token ranges are in items).
    node : CachedObject or None
        The object in the node cache, or None to keep blocks in memory only.
    """

    def __init__(
        self,
        transport: Transport,
        key: str,
        table: np.ndarray,
        block: int,
        nbytes: int,
        itemsize: int,
        node: CachedObject | None,
    ) -> None:
        self.transport, self.key, self.url = transport, key, transport.url
        self.table = table
        self.block, self.nbytes, self.itemsize = block, nbytes, itemsize
        self.node = node
        self._p = _Process()

    def _here(self) -> _Process:
        p = self._p
        if p.pid != os.getpid():  # a forked child: the parent's threads are not here
            p = self._p = _Process()
        return p

    @property
    def stats(self) -> dict[str, int]:
        """This process's counts: range requests, bytes they fetched, blocks :meth:`blocks`
        found in the node cache."""
        return self._here().stats

    def warm(self) -> None:
        """Compile the kernels fetch threads run (the check of fetched bytes) in the calling
        thread, once per process: call before starting a thread that fetches, so that no
        thread compiles (numba's lock across ``fork``: :mod:`mmpack.kernels._jit`)."""
        p = self._here()
        if not p.warm:
            self.check_run(0, bytes(min(self.block, self.nbytes)))
            p.warm = True

    # ------------------------------------------------------------------------------ lookups
    def block_ids(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """int64, sorted, unique: the blocks token ranges ``[starts, starts + lengths)`` touch."""
        return block_ids(starts, lengths, self.itemsize, self.block)

    def cached(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """The node cache's mapped file as items (zero copy: range k is ``[starts[k],
        starts[k] + lengths[k])`` of it) when it holds every block the ranges touch, each
        checked by this reader; else None."""
        if self.node is None:
            return None
        cf = self.node.serves(starts, lengths)
        return None if cf is None else cf.tokens

    def intact(self, b: int, data: bytes | memoryview) -> bool:
        """Whether ``data`` is block ``b`` as the table records it."""
        lo, hi = self._span(b)
        return len(data) == hi - lo and block_digest(data) == int(self.table[b])

    def check_run(self, b0: int, data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
        """Check the blocks ``b0, b0 + 1, ...`` that ``data`` holds (whole blocks from ``b0``;
        the object's last block may end it) against the table in one pass.

        Returns
        -------
        digests : numpy.ndarray, uint64, shape (nblocks,)
            Each block's XXH64.
        bad : numpy.ndarray, int64
            The ids of the blocks that differ from the table (sorted).
        """
        digests = block_digests(data, self.block)
        b1 = b0 + digests.size
        whole = min(b1 * self.block, self.nbytes) - b0 * self.block
        if b1 > self.table.size or len(data) != whole:  # short or long: every block is bad
            return digests, np.arange(b0, b1, dtype=np.int64)
        bad = np.flatnonzero(digests != self.table[b0:b1].astype(np.uint64)) + b0
        return digests, bad.astype(np.int64)

    def _span(self, b: int) -> tuple[int, int]:
        lo = b * self.block
        return lo, min(lo + self.block, self.nbytes)

    # ------------------------------------------------------------------------------ blocks
    def blocks(self, ids: np.ndarray, use_cache: bool = True) -> dict[int, Any]:
        """Every block of ``ids`` (int64, sorted, unique): id -> its bytes, or a view of them
        in the node cache's mapping (the caller pins them: :meth:`CachedObject.pinned`),
        verified; ``use_cache=False``: never from or into the node cache."""
        p = self._here()
        cf = self.node.file() if self.node is not None and use_cache else None
        have = self.node.held(cf, ids) if cf is not None and self.node is not None else None
        if have is not None:
            p.stats["cache_hits"] += int(have.sum())
        wanted = ids.tolist() if have is None else ids[~have].tolist()
        found: dict[int, Any] = {}
        waits: list[threading.Event] = []
        with p.lock:
            for b in wanted:
                data = p.ready.get(b)
                if data is not None:
                    p.ready.move_to_end(b)
                    found[b] = data
                elif b in p.pending:
                    waits.append(p.pending[b])
                else:
                    p.queue.pop(b, None)  # hinted but not taken yet: fetched here, now
        for ev in set(waits):
            ev.wait(self.transport.read_timeout * (self.transport.retries + 1))
        if waits:
            with p.lock:
                for b in wanted:
                    data = p.ready.get(b)
                    if data is not None and b not in found:
                        found[b] = data
        missing = [b for b in wanted if b not in found and (cf is None or not cf.state[b])]
        if missing:
            fresh = self._fetch_shared(missing, cf)
            self._remember(p, fresh)
            found.update(fresh)
        if cf is not None:
            self._from_cache(cf, [b for b in ids.tolist() if b not in found], found)
        return found

    def _from_cache(self, cf: CacheFile, ids: list[int], found: dict[int, Any]) -> None:
        """Blocks ``ids``, present in ``cf`` (stored here or by another process meanwhile),
        into ``found``: checked first, a bad one fetched again."""
        if not ids:
            return
        assert self.node is not None
        arr = np.asarray(ids, np.int64)
        ok = self.node.held(cf, arr)
        for b in arr[ok].tolist():
            found[b] = cf.block_bytes(b)
        if not ok.all():
            found.update(self._fetch(arr[~ok].tolist()))

    def _remember(self, p: _Process, blocks: dict[int, bytes]) -> None:
        with p.lock:
            for b, data in blocks.items():
                if b not in p.ready:
                    p.ready[b] = data
                    p.ready_bytes += len(data)
            while p.ready_bytes > MEMORY_BLOCKS_BYTES:  # least recently used first
                p.ready_bytes -= len(p.ready.popitem(last=False)[1])

    def _fetch_shared(self, missing: list[int], cf: CacheFile | None) -> dict[int, bytes]:
        """Fetch blocks into the node cache (not those another process or thread is fetching
        now).  Returns the blocks fetched that the cache could not keep, which the caller keeps
        in memory (all of them without a cache)."""
        if cf is None or self.node is None:
            return self._fetch(missing)
        fetched, unstored = self.node.fetch_shared(
            cf, missing, self._fetch, self.transport.read_timeout
        )
        return {b: fetched[b] for b in unstored}

    def _fetch(self, ids: list[int]) -> dict[int, bytes]:
        """Fetch blocks ``ids`` (sorted): one range request per run of adjacent blocks, all at
        once; verify every block (one re-fetch of a bad block, then FormatError)."""
        runs = runs_of(ids, self.block, self.transport.merge_gap_bytes // self.block)
        ranges = [(self._span(r[0])[0], self._span(r[-1])[1]) for r in runs]
        try:
            pieces = self.transport.get_ranges(self.key, ranges)
        except ObjectMissing:
            raise StateMismatchError(
                f"{self.url}: {self.key} is gone: the store was rebuilt or deleted after it was "
                "opened; open it again"
            ) from None
        p = self._here()
        with p.lock:
            p.stats["requests"] += len(ranges)
            p.stats["bytes_fetched"] += sum(hi - lo for lo, hi in ranges)
        out: dict[int, bytes] = {}
        for run, piece in zip(runs, pieces):
            mv = memoryview(piece)
            bad = set(self.check_run(run[0], mv)[1].tolist())  # one pass over the run
            for k, b in enumerate(run):
                lo, hi = self._span(b)
                data = bytes(mv[k * self.block : k * self.block + hi - lo])
                if b in bad:
                    data = self.transport.get_ranges(self.key, [(lo, hi)])[0]
                    if not self.intact(b, data):
                        raise FormatError(
                            f"{self.url}: {self.key} bytes {lo}..{hi} (check block {b}) fail "
                            f"their checksum (stored {int(self.table[b]):#018x}, got "
                            f"{block_digest(data):#018x}): the object is corrupt; "
                            "rebuild the store"
                        )
                out[b] = data
        return out

    # ------------------------------------------------------------------------------ look-ahead
    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """Queue the blocks of these token ranges that are neither in the node cache nor in
        memory for the look-ahead threads, which take everything queued at once, so blocks
        hinted by several batches share range requests; a later :meth:`blocks` finds them in
        the cache or memory (or waits for them, or takes those still queued itself).  Errors
        surface there.  Returns the number of blocks queued (0 at once, ~1 us, when the cache
        holds them all)."""
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        cf = self.node.file() if self.node is not None else None
        if cf is not None and cf.covers(starts, lengths, self.itemsize):
            return 0  # all cached: the common case of a second epoch
        ids = self.block_ids(starts, lengths)
        if cf is not None:
            ids = ids[~cf.present(ids)]
        p = self._here()
        with p.lock:
            todo = [
                b
                for b in ids.tolist()
                if b not in p.ready and b not in p.pending and b not in p.queue
            ]
            if not todo:
                return 0
            p.queue.update(dict.fromkeys(todo))
            if p.drains < AHEAD_THREADS:
                if p.pool is None:
                    self.warm()
                    p.pool = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="mmpack-ahead")
                p.drains += 1
                p.pool.submit(self._drain, p)
        return len(todo)

    def _drain(self, p: _Process) -> None:
        """A look-ahead thread: fetch everything queued (into the node cache, or memory for
        what it cannot keep), again until the queue is empty."""
        while True:
            with p.lock:
                take = sorted(p.queue)[:_AHEAD_MAX_BLOCKS]
                if not take:
                    p.drains -= 1
                    return
                for b in take:
                    del p.queue[b]
                ev = threading.Event()
                for b in take:
                    p.pending[b] = ev
            try:
                cf = self.node.file() if self.node is not None else None
                need = [b for b in take if cf is None or not cf.state[b]]
                self._remember(p, self._fetch_shared(need, cf) if need else {})
            except Exception:  # the reader that needs these blocks fetches them and reports
                pass
            finally:
                with p.lock:
                    for b in take:
                        p.pending.pop(b, None)
                ev.set()
