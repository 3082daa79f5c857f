"""Fetching one remote object's check blocks: range requests, verification and the node cache's
claims: the verified read of whatever the block order did not fetch.

:class:`BlockFetcher` serves the blocks of one object (a remote store's ``tokens.bin``) that is
checked in blocks of ``block`` bytes against a table of per-block XXH64 digests.
Its public surface is small:

- :meth:`~BlockFetcher.block_ids`: the blocks that token ranges touch;
- :meth:`~BlockFetcher.cached`: the node cache's mapped tokens when it holds every block of the
  ranges, checked (the zero-copy hit path), else None;
- :meth:`~BlockFetcher.blocks`: every block of a list, from the node cache or fetched now;
- :meth:`~BlockFetcher.intact`, :meth:`~BlockFetcher.check_run` and
  :attr:`~BlockFetcher.stats`.

Fetching: blocks are claimed in the node cache first (a block another process or thread holds
is waited for instead, at most the transport's ``read_timeout``), fetched as runs of blocks at
most ``merge_gap_bytes`` apart (one range request per run, all runs concurrently, the
transport's ``max_concurrency`` at a time), checked against the table (a mismatch is fetched
once more, then it is a :class:`~mmpack.errors.FormatError`: a corrupt object never yields
data) and written to the node cache as far as its limit allows; what it cannot keep is served
from the fetched bytes and fetched again when read again.  The node cache is
:class:`~mmpack.remote.cached.CachedObject` (its claim loop
:meth:`~mmpack.remote.cache.BlockCache.fetch_shared`); without one, every read fetches.  There is
no look-ahead here: fetching ahead is the block order's (:class:`~mmpack.remote.spans.SpanFetcher`
driven by the sampler), into the same node cache.

The counts are per process (made anew in a forked child).  Cost: see
:mod:`mmpack.remote.backend`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.remote.blocks import block_ids, runs_of
from mmpack.remote.cached import CachedObject
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.integrity import block_digest, block_digests

__all__ = ["BlockFetcher"]


class _Process:
    """A :class:`BlockFetcher`'s state in one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
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
