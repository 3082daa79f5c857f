"""Sharded Zarr stores on object storage: verified reads (uploads: :mod:`mmpack.remote.upload`).

Layout of a remote Zarr store at ``URL``::

    URL/mmpack.json                 the metadata record, written LAST (the commit marker), plus
                                    "remote": {"data": "data-<id>", "layout": "zarr-sharded",
                                               "arrays": {"tokens": <its zarr.json>, ...},
                                               "objects": {"tokens/c/0": <bytes>, ...}}
    URL/data-<id>/zarr.json         a plain Zarr v3 group (``zarr.open_group`` reads it), with
    URL/data-<id>/tokens/c/<s>      the sharded arrays of :mod:`mmpack.store.backends._zarr_shards`
    URL/data-<id>/offsets/c/<s>     (32 MiB shards of 8 KiB inner chunks, each with a crc32c)

The commit rule is the memmap layout's: objects first, ``mmpack.json`` last (the commit marker).

Reading (:class:`RemoteZarrBackend`): the open costs one GET (``mmpack.json``: it carries the
arrays' metadata and every object's size), one LIST of the data prefix (every shard must exist
with its recorded size: a missing shard is a :class:`~mmpack.errors.FormatError` at open, as
locally) and the ``offsets`` shards (fetched whole, every chunk's crc32c checked, then the
format's offsets CRCs).  Batched reads run the local backend's path
(:class:`~mmpack.store.backends._zarr_shards.ShardReader` and the process's decoded-chunk LRU):
each shard's index is fetched once (one range GET of its last ``16 * chunks + 4`` bytes), then
the inner chunks a batch touches go out as concurrent range GETs (adjacent chunks merged) through
the transport of :mod:`mmpack.remote.transport` (the fork-safe S3 client by default: no
obstore runtime, so forked DataLoader workers work), each chunk checked against its crc32c; a
mismatch is fetched once more, then it is a ``FormatError``, never data.  ``prefetch`` (the
views' look-ahead) reads the next batches' chunks on a background thread.  With ``cache_limit``
the decoded chunks go to the node cache (:mod:`.cache`: the token array as one sparse mapped
file, one block per inner chunk; claims, an exact limit, blocks trusted once stored and checked
by ``verify``); a batch whose chunks are all there is served from that mapping, zero copy.  The offsets and shard indexes are kept
in the store's local folder, so a new reader on the node (a worker, the next epoch) fetches
nothing it has: one GET of ``mmpack.json`` and one LIST.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import (
    FormatError,
    StateMismatchError,
)
from mmpack.remote.base import RemoteBase
from mmpack.remote.blocks import crc_blocks
from mmpack.remote.cache import BlockCache
from mmpack.remote.cachefile import CacheFile
from mmpack.remote.transport import ObjectMissing, Transport
from mmpack.store.backends import Backend
from mmpack.store.backends._chunk_cache import get_cache
from mmpack.store.backends._chunk_ranges import assemble, touched_chunks
from mmpack.store.backends._zarr_shards import (
    ShardLayout,
    ShardReader,
    parse_layout,
)
from mmpack.store.format import OFFSETS_DTYPE, StoreMeta, write_bytes_atomic

__all__ = ["LAYOUT", "RemoteZarrBackend"]

LAYOUT = "zarr-sharded"
"""The ``remote.layout`` value of a remote Zarr store's ``mmpack.json``."""


class RemoteZarrBackend(RemoteBase, Backend):
    """The tokens of one remote sharded Zarr store, read in verified inner chunks."""

    name = "zarr"

    def __init__(
        self,
        transport: Transport,
        meta: StoreMeta,
        raw: dict[str, Any],
        folder: Path,
        cache: BlockCache | None = None,
    ) -> None:
        super().__init__(folder, meta)
        self.cache = cache
        self.transport = transport
        self.url = transport.url
        remote = raw.get("remote")
        try:
            assert isinstance(remote, dict) and remote.get("layout") == LAYOUT
            self.data = str(remote["data"]).strip("/") + "/"
            objects = {str(k): int(v) for k, v in remote["objects"].items()}
            arrays = {n: parse_layout(remote["arrays"][n]) for n in ("tokens", "offsets")}
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{self.url}: malformed remote Zarr record ({exc!r})") from None
        self.objects = objects
        layouts: dict[str, ShardLayout] = {}
        for name, count, dtype in (
            ("tokens", meta.num_tokens, meta.dtype),
            ("offsets", meta.num_docs + 1, OFFSETS_DTYPE),
        ):
            lay = arrays[name]
            if lay is None or lay.count != count or lay.dtype != np.dtype(dtype):
                raise FormatError(
                    f"{self.url}: {name} is not a sharded array of {count} items of {dtype}"
                )
            layouts[name] = lay
        self._check_objects(layouts)
        self._pid = -1
        self._init_process_state()
        self._layout = layouts["tokens"]
        self._reader = self._make_reader("tokens", layouts["tokens"])
        offsets = self._read_offsets(layouts["offsets"])
        offsets.flags.writeable = False
        self._offsets = offsets
        self._cache_key = ("remote", self.url, self.data, meta.fingerprint)
        self._disk_key = f"{meta.fingerprint}-{self.data.strip('/')}"

    # ------------------------------------------------------------------------------ open
    def _check_objects(self, layouts: dict[str, ShardLayout]) -> None:
        """Every shard is named in the record and (one LIST) exists with its recorded size."""
        want = {f"{n}/{lay.key(s)}" for n, lay in layouts.items() for s in range(lay.num_shards)}
        unnamed = sorted(want - set(self.objects))
        if unnamed:
            raise FormatError(f"{self.url}: the metadata names no object for {unnamed[0]}")
        if self.transport.read_only:  # plain https: no listing; a missing shard fails its read
            return
        listed = {k: size for k, size, _ in self.transport.list_prefix(self.data)}
        for key in sorted(want):
            size = listed.get(self.data + key)
            if size != self.objects[key]:
                what = (
                    "is missing" if size is None else f"holds {size} bytes, not {self.objects[key]}"
                )
                raise FormatError(
                    f"{self.url}: shard {self.data}{key} {what}: the store is incomplete or "
                    "was replaced; rebuild it"
                )

    def _make_reader(self, name: str, layout: ShardLayout) -> ShardReader:
        def index_range(s: int) -> tuple[int, int]:
            size = self.objects[f"{name}/{layout.key(s)}"]
            return max(0, size - layout.index_nbytes), size

        def fetch(requests: Any) -> list[list[bytes]]:
            return self._fetch([(f"{name}/{layout.key(s)}", r) for s, r in requests])

        kept = self.path / f"zarr-{self.data.strip('/')}-{name}"  # verified when read back
        return ShardReader(layout, fetch, index_range, f"{self.url}/{self.data}{name}", kept)

    def _read_offsets(self, layout: ShardLayout) -> np.ndarray:
        block, crcs = self.meta.block_bytes, list(self.meta.offsets_crc32)
        kept = self.path / "offsets.bin"  # the remote memmap reader keeps the same bytes there
        try:
            data = kept.read_bytes()
            if len(data) == layout.count * 8 and crc_blocks(data, block) == crcs:
                return np.frombuffer(data, dtype=OFFSETS_DTYPE).copy()
        except OSError:
            pass
        reader = self._make_reader("offsets", layout)
        ids = np.arange(-(-layout.count // layout.inner), dtype=np.int64)
        chunks = self._verified(reader, ids)
        flat = np.concatenate([chunks[i] for i in ids.tolist()])[: layout.count]
        offsets = np.ascontiguousarray(flat, dtype=OFFSETS_DTYPE)
        if crc_blocks(offsets.tobytes(), block) != crcs:
            raise FormatError(
                f"{self.url}: offsets fail the metadata's checksums: the store is corrupt or "
                "was replaced; rebuild it"
            )
        write_bytes_atomic(kept, offsets.tobytes())
        return offsets

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future] = {}
        self._cf: CacheFile | None = None  # this process's mapping of the node cache's file
        self._cf_retry = 0.0
        self.stats = {"requests": 0, "bytes_fetched": 0}

    def _cache_file_spec(self) -> tuple[str, str, int, int, np.dtype] | None:
        """One cache block per inner chunk; None for inner chunks that are not a power of two
        bytes."""
        block = self._layout.inner * self.meta.dtype.itemsize
        if block & (block - 1):
            return None
        nbytes = self.meta.num_tokens * self.meta.dtype.itemsize
        return self.meta.fingerprint, "zarr-tokens", nbytes, block, self.meta.dtype

    # ------------------------------------------------------------------------------ fetching
    def _fetch(self, tasks: list[tuple[str, list[tuple[int, int]]]]) -> list[list[bytes]]:
        """Byte ranges of several objects, all requests at once (one per range)."""
        self._here()
        flat = [(self.data + key, r) for key, ranges in tasks for r in ranges]
        with self._lock:
            self.stats["requests"] += len(flat)
            self.stats["bytes_fetched"] += sum(hi - lo for _, (lo, hi) in flat)
            if self._pool is None and len(flat) > 1:
                self._pool = ThreadPoolExecutor(
                    self.transport.max_concurrency, thread_name_prefix="mmpack-zarr"
                )
        try:
            if len(flat) == 1:
                got = [self.transport.get_ranges(flat[0][0], [flat[0][1]])[0]]
            else:
                assert self._pool is not None
                futures = [self._pool.submit(self.transport.get_ranges, k, [r]) for k, r in flat]
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

    def _verified(self, reader: ShardReader, ids: np.ndarray) -> dict[int, np.ndarray]:
        """``reader.chunks(ids)``; a chunk or index failing its checksum is fetched once more
        (a bad transfer), then the FormatError stands."""
        try:
            return reader.chunks(ids)
        except FormatError:
            reader._indexes.clear()
            return reader.chunks(ids)

    # ------------------------------------------------------------------------------ reading
    def read_range(self, start: int, stop: int) -> np.ndarray:
        one = np.array([start, max(0, stop - start)], dtype=np.int64)
        src, at = self.read_ranges(one[:1], one[1:])
        return src[int(at[0]) : int(at[0]) + max(0, stop - start)]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        cf = self._cache_file()
        item = self.meta.dtype.itemsize
        if cf is not None and cf.covers(starts, lengths, item):  # the hit path: zero copy
            cf.touch()
            return cf.tokens, starts
        t = touched_chunks(starts, lengths, self._layout.inner)
        if t.uniq.size == 0:
            return np.empty(0, dtype=self.meta.dtype), np.zeros(starts.shape[0], np.int64)
        return assemble(self._chunks(t.uniq), t, lengths, self.meta.dtype)

    def _chunks(self, uniq: np.ndarray) -> dict[int, np.ndarray]:
        self._here()
        cache = get_cache()
        ids = uniq.tolist()
        got = {i: e[0] for i, e in cache.get_many(self._cache_key, ids).items()}
        waits: list[tuple[int, Future]] = []
        with self._lock:
            for i in ids:
                if i not in got and i in self._pending:
                    waits.append((i, self._pending[i]))
        for i, fut in waits:
            try:
                arr = fut.result().get(i)
            except Exception:  # the look-ahead failed: read it here, where errors surface
                arr = None
            if arr is not None:
                got[i] = arr
        if len(got) == len(ids):
            return got
        missing = uniq[~np.isin(uniq, np.fromiter(got, np.int64, len(got)))]
        got.update(self._load(missing))
        return got

    def _load(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        """Chunks ``ids`` from the node cache or fetched (verified), then kept in the process's
        LRU and, as far as its limit allows, in the node cache (only the chunks this process
        claims: a chunk another process is fetching is waited for, then read from the cache)."""
        got: dict[int, np.ndarray] = {}
        cf = self._cache_file()
        if cf is not None:
            have = cf.present(ids)
            for i in ids[have].tolist():
                got[i] = cf.block_bytes(i).view(self.meta.dtype)
            ids = ids[~have]
        if ids.size and cf is not None:
            got.update(self._fetch_shared(ids, cf))
        elif ids.size:
            got.update(self._verified(self._reader, ids))
        get_cache().put_many(self._cache_key, {i: (a, None) for i, a in got.items()})
        return got

    def _fetch_shared(self, ids: np.ndarray, cf: CacheFile) -> dict[int, np.ndarray]:
        """Fetch the chunks this process claims (verified) into the node cache; wait for those
        another process holds (:meth:`BlockCache.fetch_shared`), then read them from there."""
        assert self.cache is not None
        fetched, _ = self.cache.fetch_shared(
            cf,
            sorted(ids.tolist()),
            lambda todo: self._verified(self._reader, np.asarray(todo, np.int64)),
            self.transport.read_timeout,
        )
        for b in ids.tolist():
            if b not in fetched:  # another process stored it
                fetched[b] = cf.block_bytes(b).view(self.meta.dtype)
        return fetched

    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """Start reading the inner chunks of these ranges on a background thread (a later
        ``read_ranges`` takes them from there); returns the number of chunks asked for."""
        self._here()
        uniq = touched_chunks(
            np.asarray(starts, np.int64), np.asarray(lengths, np.int64), self._layout.inner
        ).uniq
        cf = self._cache_file()
        if cf is not None:
            uniq = uniq[~cf.present(uniq)]
        cached = get_cache().get_many(self._cache_key, uniq.tolist())
        with self._lock:
            todo = [i for i in uniq.tolist() if i not in cached and i not in self._pending]
            if not todo:
                return 0
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(2, thread_name_prefix="mmpack-zarr-ahead")
            fut = self._ahead.submit(self._prefetch_job, np.asarray(todo, np.int64))
            for i in todo:
                self._pending[i] = fut
        return len(todo)

    def _prefetch_job(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        try:
            return self._load(ids)
        finally:
            with self._lock:
                for i in ids.tolist():
                    self._pending.pop(i, None)

    def raw_bytes(self, name: str, start: int, stop: int) -> bytes:
        """For ``verify``: the bytes read from the server now (never the cache)."""
        if name == "offsets":
            return self._offsets.view(np.uint8)[start:stop].tobytes()
        item = self.meta.dtype.itemsize
        first, last = start // item, -(-stop // item)
        st, ln = np.array([first], np.int64), np.array([last - first], np.int64)
        t = touched_chunks(st, ln, self._layout.inner)
        src, _ = assemble(self._verified(self._reader, t.uniq), t, ln, self.meta.dtype)
        skip = start - first * item
        data = np.ascontiguousarray(src).view(np.uint8)[skip : skip + (stop - start)].tobytes()
        cf = self._cache_file()
        if cf is not None and self.cache is not None:
            self.cache.verify_cached(cf, start, data, self.url)
        return data
