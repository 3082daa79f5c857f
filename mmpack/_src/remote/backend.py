"""Reading a store from object storage: verified pages fetched by concurrent range requests.

Layout of a remote store at ``URL`` (written by :mod:`mmpack._src.remote.upload`)::

    URL/mmpack.json            the metadata record, written LAST (the commit marker), plus
                               "remote": {"data": "data-<id>", "check_block_bytes": 16384,
                                          "check_object": "tokens.xxh", "check_digest": "xxh64",
                                          "check_crc32": ...}
    URL/data-<id>/tokens.bin   the flat little-endian tokens (the memmap layout's file)
    URL/data-<id>/offsets.bin  the int64 offsets
    URL/data-<id>/tokens.xxh   XXH64 (uint64 LE, seed 0) of every 16 KiB page of tokens.bin

A local memmap store copied as is (no ``"remote"`` record) opens too, checked in its 16 MiB
stripes.  At open: the metadata (one GET), ``tokens.bin``'s size (one HEAD), the check table
(whole, CRC-32-checked) and the first and last 16 MiB stripes of ``offsets.bin``, kept in
``<cache_dir>/stores/<fingerprint>/``; every other offsets stripe is fetched when a read first
uses it and checked against the metadata's CRC-32
(:class:`~mmpack._src.store.backends._lazy_offsets.LazyOffsets`): an open's offsets bytes do
not grow with the documents.  Reads: :class:`~mmpack._src.remote.base.RemoteStoreBackend`
over the object's pages (:class:`~mmpack._src.remote.sources.PageSource`).

Cost: one XXH64 per fetched 16 KiB page, small next to a request (``python -m
benchmarks.bench_block_fetch``, docs/benchmarks.md "Checksums"); the check table is 8 bytes per
page (0.05% of the tokens); ``check_block_bytes`` at build changes the page size.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.remote.base import RemoteStoreBackend
from mmpack._src.remote.cache import PageCache, warn_once
from mmpack._src.remote.cached import CachedObject
from mmpack._src.remote.fetcher import PageFetcher
from mmpack._src.remote.sources import PageSource
from mmpack._src.remote.spans import SpanFetcher
from mmpack._src.remote.transport import ObjectMissing, Transport
from mmpack._src.store.backends._lazy_offsets import LazyOffsets
from mmpack._src.store.format import StoreMeta, crc32_blocks, write_bytes_atomic
from mmpack.errors import FormatError

__all__ = [
    "CHECK_DIGEST",
    "RemoteBackend",
]

CHECK_DIGEST = "xxh64"
"""The digest of a remote store's check table (XXH64, seed 0: one kernel pass over a fetched
part, which also gives the node cache its own digests); a table of any other is refused."""


class RemoteBackend(RemoteStoreBackend):
    """The tokens of one remote store, read in verified pages.

    ``folder`` is ``<cache_dir>/stores/<fingerprint>`` (the index objects are kept there);
    ``cache`` the node cache under ``cache_dir``, or None."""

    name = "memmap"  # the remote layout is the memmap layout's files, as objects

    def __init__(
        self,
        transport: Transport,
        meta: StoreMeta,
        raw: dict[str, Any],
        folder: Path,
        cache: PageCache | None,
    ) -> None:
        super().__init__(folder, meta)
        self.transport = transport
        self.url = transport.url
        self.cache = cache
        self.cache_dir = folder.parent.parent
        remote = raw.get("remote")
        nbytes = meta.num_tokens * meta.dtype.itemsize
        if remote is None:
            data = ""
            self.page = meta.block_bytes
            table = np.asarray(meta.tokens_digests, dtype=np.uint64)
            # a copied store: its own page checksums (XXH64, as the check table's)
        else:
            try:
                data = str(remote["data"]).strip("/") + "/"
                self.page = int(remote["check_block_bytes"])
                check_object, check_crc = str(remote["check_object"]), int(remote["check_crc32"])
                digest = str(remote["check_digest"])
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"{self.url}: malformed remote record {remote!r}") from exc
            if digest != CHECK_DIGEST:
                raise FormatError(
                    f"{self.url}: check_digest {digest!r} is not {CHECK_DIGEST!r} (a store "
                    "uploaded by an earlier mmpack): build it again"
                )
            if self.page < 8 or self.page & (self.page - 1):
                raise FormatError(f"{self.url}: check_block_bytes {self.page} is not a power of 2")
            raw_table = self._index(
                data, check_object, (-(-nbytes // self.page)) * 8, [check_crc], None
            )
            table = np.frombuffer(raw_table, dtype="<u8")
        self.data = data
        self._check_size(data + "tokens.bin", nbytes)
        self._lazy = LazyOffsets(
            meta.num_docs + 1,
            meta.block_bytes,
            meta.offsets_crc32,
            self._fetch_offsets,
            f"{self.url}: {data}offsets.bin",
            folder / "offsets.bin",
            lambda exc: warn_once(self.cache_dir, exc),
        )
        """The offsets, each stripe fetched and checked on first use (O(1) at open)."""
        self.node_cache = (
            None
            if cache is None
            else CachedObject(
                cache, meta.fingerprint, "tokens", nbytes, self.page, meta.dtype, self.url
            )
        )
        """This reader's view of the tokens in the node cache (None without a cache)."""
        self.source = PageSource(
            transport, data + "tokens.bin", table, self.page, nbytes, meta.dtype.itemsize
        )
        """The tokens object's checked pages (:mod:`mmpack._src.remote.sources`)."""
        self.fetcher = PageFetcher(self.source, self.node_cache)
        self.span_fetcher = None if self.node_cache is None else SpanFetcher(self.fetcher)
        """Whole spans into the node cache, pinned and dropped (None without a node cache)."""

    # ------------------------------------------------------------------------------ open
    def _check_size(self, key: str, nbytes: int) -> None:
        try:
            size = self.transport.size(key)
        except ObjectMissing:
            raise FormatError(
                f"{self.url}: {key} is missing: the store is incomplete or was deleted; rebuild it"
            ) from None
        if size != nbytes:
            raise FormatError(
                f"{self.url}: {key} holds {size} bytes but the metadata says {nbytes}: it is "
                "truncated or was replaced"
            )

    def _index(
        self, data: str, name: str, nbytes: int, crcs: list[int], stripe: int | None
    ) -> bytes:
        """Index object ``data + name``, kept locally as ``name`` (:func:`_verified_object`)."""
        local = self.path / name
        return _verified_object(
            self.transport, data + name, local, nbytes, crcs, stripe, self.cache_dir
        )

    def _fetch_offsets(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of ``offsets.bin``, from the server (one range GET)."""
        try:
            return self.transport.get_ranges(self.data + "offsets.bin", [(lo, hi)])[0]
        except ObjectMissing:
            raise FormatError(
                f"{self.url}: {self.data}offsets.bin is missing: the store is incomplete or was "
                "deleted; rebuild it"
            ) from None

    @property
    def offsets(self) -> np.ndarray:
        return self._lazy.array

    def load_offsets(self, first: int, stop: int) -> None:
        self._lazy.load(first, stop)

    @property
    def stats(self) -> dict[str, int]:
        """This process's counts (:attr:`PageFetcher.stats`)."""
        return self.fetcher.stats

    # ------------------------------------------------------------------------------ verify
    def raw_bytes(self, name: str, start: int, stop: int) -> bytes:
        """For ``verify``: the bytes read from the server now (never the cache); whole pages
        are checked against the table, and the node cache's copies against them."""
        if name == "offsets":  # the server's bytes, never the kept copy
            return self._fetch_offsets(start, stop) if stop > start else b""
        key = self.source.key
        data = self.transport.get_ranges(key, [(start, stop)])[0] if stop > start else b""
        if start % self.page == 0:  # verify() reads whole stripes: check their pages too
            bad = self.source.check_run(start // self.page, data)[1]
            if bad.size:
                raise FormatError(
                    f"{self.url}: {key} check page {int(bad[0])} fails its checksum: "
                    "the object is corrupt; rebuild the store"
                )
            if self.node_cache is not None:
                self.node_cache.verify(start, data)
        return data


def _verified_object(
    transport: Transport,
    key: str,
    local: Path,
    nbytes: int,
    crcs: list[int],
    stripe: int | None,
    cache_dir: Path,
) -> bytes:
    """Object ``key`` (``nbytes``) from its local copy ``local`` if present and intact, else
    fetched, checked against ``crcs`` (CRC-32 per ``stripe`` bytes, or of the whole) and kept at
    ``local``, or in memory only where that cannot be written (one warning)."""

    def checksums(data: bytes) -> list[int]:  # the whole object's: also that of no bytes
        return crc32_blocks(data, stripe) if stripe else [zlib.crc32(data)]

    if local.is_file() and local.stat().st_size == nbytes:
        data = local.read_bytes()
        if checksums(data) == crcs:
            return data
    try:
        data = transport.get(key)
    except ObjectMissing:
        raise FormatError(
            f"{transport.url}: {key} is missing: the store is incomplete or was deleted; rebuild it"
        ) from None
    if len(data) != nbytes or checksums(data) != crcs:
        raise FormatError(
            f"{transport.url}: {key} ({len(data)} bytes) fails its checksum: the object is "
            "corrupt or was replaced; rebuild the store"
        )
    try:
        write_bytes_atomic(local, data)
    except OSError as exc:  # a full disk, a read-only cache_dir: kept in memory
        warn_once(cache_dir, exc)
    return data
