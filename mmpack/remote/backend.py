"""Reading a store from object storage: verified blocks fetched by concurrent range requests.

Layout of a remote store at ``URL`` (written by :mod:`mmpack.remote.writer`)::

    URL/mmpack.json            the metadata record, written LAST (the commit marker), plus
                               "remote": {"data": "data-<id>", "check_block_bytes": 16384,
                                          "check_object": "tokens.crc", "check_crc32": ...}
    URL/data-<id>/tokens.bin   the flat little-endian tokens (the memmap layout's file)
    URL/data-<id>/offsets.bin  the int64 offsets
    URL/data-<id>/tokens.crc   CRC-32 (uint32 LE) of every 16 KiB block of tokens.bin

A plain local memmap store copied as is (no ``"remote"`` record) opens too: its data sit beside
``mmpack.json`` and the check blocks are the format's 16 MiB blocks (correct, but every random
read then moves 16 MiB: upload with ``mmpack.build(url, ...)`` instead).

At open: the metadata is read (one GET), ``tokens.bin``'s size checked (one HEAD), and
``offsets.bin`` and the check table are fetched whole, verified against the metadata's CRCs and
kept in ``<cache_dir>/stores/<fingerprint>/`` (reopening in a DataLoader worker reads them from
there).

``read_ranges`` with a node cache (``cache_limit``): one kernel pass asks the cache's state array
whether every block the ranges touch is present; if so the answer is the cache's mapped file and
the ranges' own starts, exactly as the memmap backend answers (zero copy, no per-block Python).
Otherwise the ranges' blocks are gathered: those present from the mapping, those in this
process's memory LRU or in flight in a look-ahead thread from there, and the rest fetched --
claimed in the cache first (another process's claim is waited for instead), grouped into runs
of blocks at most ``merge_gap_bytes`` apart (the blocks between fetched too), one range request
per run, all runs concurrently; each block's CRC-32 is checked (a mismatch is re-fetched once,
then it is a :class:`~mmpack.errors.FormatError`: a corrupt object never yields data), and the
verified blocks are written to the cache (or kept in memory when it has no room).  The result
then holds only the bytes served, the ranges back to back.

Look-ahead (:meth:`RemoteBackend.prefetch`): hinted blocks join a queue that up to four threads
per process drain, each taking everything queued at once, so the blocks of several hinted
batches share range requests.  A read takes blocks still queued itself and waits for those in
flight.  The block arithmetic (blocks touched, runs, CRCs, copying out) is
:mod:`mmpack.remote.blocks`, the cache :mod:`mmpack.remote.cache`; this module owns
the I/O, verification and the read path.

Cost (measured here, a loaded 2-core VM): CRC-32 runs at 1.2-1.5 GB/s, ~12 us per 16 KiB block;
a 2048-token uint16 window (4 KiB) touches one or two blocks, so verification adds well under
0.1 ms to a request that takes ~2 ms on loopback.  Blocks are 16 KiB by default: a shuffled
window moves 4-8x the bytes it serves on a first touch (64 KiB blocks moved 16-32x, and read
40% slower from the node cache: a cached packed epoch took 2.6 s with 64 KiB blocks against
1.8 s with 16 KiB); the check table costs 4 bytes per block (0.025% of the tokens), fetched at
open like ``offsets`` (8 bytes per document, usually larger).  ``check_block_bytes`` at build
changes it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError
from mmpack.remote.base import RemoteBase
from mmpack.remote.blocks import block_ids, crc_blocks, gather
from mmpack.remote.cache import BlockCache
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.fetcher import BlockFetcher
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.backends import Backend
from mmpack.store.format import OFFSETS_DTYPE, StoreMeta, write_bytes_atomic

__all__ = ["RemoteBackend"]


class RemoteBackend(RemoteBase, BlockFetcher, Backend):
    """The tokens of one remote store, read in verified check blocks."""

    name = "memmap"  # the remote layout is the memmap layout's files, as objects

    def __init__(
        self,
        transport: Transport,
        meta: StoreMeta,
        raw: dict[str, Any],
        folder: Path,
        cache: BlockCache | None,
    ) -> None:
        super().__init__(folder, meta)
        self.transport = transport
        self.url = transport.url
        self.fingerprint = meta.fingerprint
        self.cache = cache
        self._digest_kind = "crc32"  # the check table of an upload (tokens.crc) is CRC-32
        remote = raw.get("remote")
        itemsize = meta.dtype.itemsize
        self.itemsize = itemsize
        self.nbytes = meta.num_tokens * itemsize
        if remote is None:
            self.data = ""
            self.block = meta.block_bytes
            table = np.asarray(meta.tokens_digests, dtype=np.uint64)
            self._digest_kind = meta.tokens_checksum  # a copied store: its own block checksums
        else:
            try:
                self.data = str(remote["data"]).strip("/") + "/"
                self.block = int(remote["check_block_bytes"])
                check_object, check_crc = str(remote["check_object"]), int(remote["check_crc32"])
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"{self.url}: malformed remote record {remote!r}") from exc
            if self.block < 8 or self.block & (self.block - 1):
                raise FormatError(f"{self.url}: check_block_bytes {self.block} is not a power of 2")
            raw_table = self._verified_object(
                check_object, (-(-self.nbytes // self.block)) * 4, [check_crc], None
            )
            table = np.frombuffer(raw_table, dtype="<u4")
        self.table = table
        try:
            size = transport.size(self.data + "tokens.bin")
        except ObjectMissing:
            raise FormatError(
                f"{self.url}: {self.data}tokens.bin is missing: the store is "
                "incomplete or was deleted; rebuild it"
            ) from None
        if size != self.nbytes:
            raise FormatError(
                f"{self.url}: {self.data}tokens.bin holds {size} bytes but the "
                f"metadata says {self.nbytes}: it is truncated or was replaced"
            )
        raw_offsets = self._verified_object(
            "offsets.bin", (meta.num_docs + 1) * 8, list(meta.offsets_crc32), meta.block_bytes
        )
        offsets = np.frombuffer(raw_offsets, dtype=OFFSETS_DTYPE)
        self._offsets = offsets  # frombuffer of bytes: read-only
        self._pid = -1
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._ready: OrderedDict[int, bytes] = OrderedDict()  # verified blocks in memory, LRU
        self._ready_bytes = 0
        self._queue: dict[int, None] = {}  # blocks hinted by prefetch(), not yet taken
        self._pending: dict[int, threading.Event] = {}  # blocks a look-ahead thread fetches
        self._drains = 0  # look-ahead threads running
        self._prefetcher: Any = None
        self._cf: CacheFile | None = None  # this process's mapping of the node cache's file
        self._cf_retry = 0.0
        self.stats = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}
        """This process's counts: range requests, bytes they fetched, blocks the slow path
        found in the node cache."""

    def _cache_file_spec(self) -> tuple[str, str, int, int, np.dtype]:
        return self.fingerprint, "tokens", self.nbytes, self.block, self.meta.dtype

    # ------------------------------------------------------------------------------ open
    def _verified_object(self, name: str, nbytes: int, crcs: list[int], block: int | None) -> bytes:
        """Object ``data/name`` (``nbytes``), from the local folder if present and intact,
        else fetched, checked against ``crcs`` (per ``block`` bytes, or whole) and saved."""
        local = self.path / name
        if local.is_file() and local.stat().st_size == nbytes:
            data = local.read_bytes()
            if crc_blocks(data, block or max(nbytes, 1)) == crcs or (nbytes == 0 and not crcs):
                return data
        try:
            data = self.transport.get(self.data + name)
        except ObjectMissing:
            raise FormatError(
                f"{self.url}: {self.data}{name} is missing: the store is "
                "incomplete or was deleted; rebuild it"
            ) from None
        got = crc_blocks(data, block or max(nbytes, 1)) if data else []
        if len(data) != nbytes or (got != crcs and not (nbytes == 0 and not crcs)):
            raise FormatError(
                f"{self.url}: {self.data}{name} ({len(data)} bytes) fails its "
                "checksum: the object is corrupt or was replaced; rebuild the store"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(local, data)
        return data

    # ------------------------------------------------------------------------------ reading
    def read_range(self, start: int, stop: int) -> np.ndarray:
        src, at = self.read_ranges(np.array([start], np.int64), np.array([stop - start], np.int64))
        return np.array(src[int(at[0]) : int(at[0]) + stop - start])  # never a view of the cache

    def _block_ids(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return block_ids(starts, lengths, self.meta.dtype.itemsize, self.block)

    def resident(self, positions: np.ndarray) -> bool:
        """False: a view then always calls :meth:`prefetch`, which answers 0 at once (one
        kernel pass) when the node cache holds every block of the ranges, and otherwise queues
        exactly the missing ones (a probe of a few positions could not tell a partly cached
        batch from a cached one)."""
        return False

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ranges' tokens: ``src[src_starts[k]:src_starts[k] + lengths[k]]`` is range k.
        When the node cache holds every block they touch, ``src`` is the cache's mapped file
        and ``src_starts`` is ``starts`` (zero copy, as the memmap backend); otherwise the
        missing blocks are fetched and the ranges copied back to back into a new buffer."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        item = self.meta.dtype.itemsize
        cf = self._cache_file()
        if cf is not None and cf.covers(starts, lengths, item):  # the hit path: no Python loop
            cf.touch()
            return cf.tokens, starts
        if cf is not None:
            cf.touch()
        ids = self._block_ids(starts, lengths)
        blocks = self._get_blocks(ids, cf)
        if cf is not None and cf.covers(starts, lengths, item):
            return cf.tokens, starts
        src_starts = np.zeros(starts.shape[0], dtype=np.int64)
        if starts.shape[0]:
            np.cumsum(lengths[:-1], out=src_starts[1:])
        out = gather(blocks, starts, lengths, item, self.block)
        return out.view(self.meta.dtype), src_starts

    # ------------------------------------------------------------------------------ verify
    def raw_bytes(self, name: str, start: int, stop: int) -> bytes:
        if name == "offsets":
            return self._offsets.view(np.uint8)[start:stop].tobytes()
        key = self.data + "tokens.bin"
        data = self.transport.get_ranges(key, [(start, stop)])[0] if stop > start else b""
        if start % self.block == 0:  # verify() reads whole coarse blocks: check the fine table too
            for k in range(0, len(data), self.block):
                b = (start + k) // self.block
                if not self._intact(b, data[k : k + self.block]):
                    raise FormatError(
                        f"{self.url}: {key} check block {b} fails its checksum: "
                        "the object is corrupt; rebuild the store"
                    )
            self._verify_cached(start, data)
        return data

    def _verify_cached(self, start: int, data: bytes) -> None:
        """Check the node cache's blocks of ``[start, start + len(data))`` against ``data``."""
        cf = self._cache_file()
        if cf is not None and self.cache is not None:
            self.cache.verify_cached(cf, start, data, self.url)
