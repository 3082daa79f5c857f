"""Reading a store from object storage: verified pages fetched by concurrent range requests.

Layout of a remote store at ``URL`` (written by :mod:`mmpack._src.remote.upload`)::

    URL/mmpack.json            the metadata record, written LAST (the commit marker), plus
                               "remote": {"data": "data-<id>", "check_block_bytes": 16384,
                                          "check_object": "tokens.xxh", "check_digest": "xxh64",
                                          "check_stripe_bytes": 16777216, "check_crc32s": [...]}
    URL/data-<id>/tokens.bin   the flat little-endian tokens (the memmap layout's file)
    URL/data-<id>/offsets.bin  the int64 offsets
    URL/data-<id>/tokens.xxh   XXH64 (uint64 LE, seed 0) of every 16 KiB page of tokens.bin

A local memmap store copied as is (no ``"remote"`` record) opens too, checked in its 16 MiB
stripes.  At open: the metadata (one GET), ``tokens.bin``'s size (one HEAD) and the first and
last stripes of ``offsets.bin``; no stripe of the check table.  Both are full-length arrays kept
sparse in ``<cache_dir>/stores/<fingerprint>/``
(:class:`~mmpack._src.store.backends._lazy_stripes.LazyStripes`): a stripe is fetched when a read
first uses it (a table stripe: when a page it covers is checked) and checked against the
record's CRC-32 (``check_crc32s``: one per ``check_stripe_bytes`` of the table): an open's bytes
grow with neither documents nor tokens.  Reads: :class:`~mmpack._src.remote.base.RemoteStoreBackend`
over the object's pages (:class:`~mmpack._src.remote.sources.PageSource`).

Cost: one XXH64 per fetched 16 KiB page (``python -m benchmarks.bench_block_fetch``); the table
is 8 bytes a page (0.05% of the tokens: a 16 MiB stripe covers 32 GiB of tokens).
"""

from __future__ import annotations

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
from mmpack._src.store.backends._lazy_stripes import LazyStripes
from mmpack._src.store.format import StoreMeta
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
        self._table: LazyStripes | None = None  # the check table, fetched lazily (remote record)
        if remote is None:
            data = ""
            self.page = meta.block_bytes
            table = np.asarray(meta.tokens_digests, dtype=np.uint64)
            # a copied store: its own page checksums (XXH64, as the check table's)
        else:
            try:
                data = str(remote["data"]).strip("/") + "/"
                self.page = int(remote["check_block_bytes"])
                check_object = str(remote["check_object"])
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
            table = self._lazy_table(data, check_object, remote, -(-nbytes // self.page))
        self.data = data
        self._rechecked: set[int] = set()  # the server's table stripes this verify pass checked
        self._check_size(data + "tokens.bin", nbytes)
        self._lazy = LazyStripes(
            meta.num_docs + 1,
            meta.block_bytes,
            meta.offsets_crc32,
            self._fetch_offsets,
            f"{self.url}: {data}offsets.bin",
            folder / "offsets.bin",
            lambda exc: warn_once(self.cache_dir, exc),
            dtype=np.int64,
            what="offsets",
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
            transport,
            data + "tokens.bin",
            table,
            self.page,
            nbytes,
            meta.dtype.itemsize,
            None if self._table is None else self._table.load_items,
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

    def _lazy_table(self, data: str, name: str, remote: dict[str, Any], pages: int) -> np.ndarray:
        """The check table (``pages`` digests), each stripe fetched and CRC-checked when a page
        it covers is first checked, kept as ``name`` in the local folder."""
        try:
            stripe = int(remote["check_stripe_bytes"])
            crcs = [int(c) for c in remote["check_crc32s"]]
        except KeyError:
            raise FormatError(
                f"{self.url}: the remote record has no check_stripe_bytes and check_crc32s (a "
                "store uploaded by an earlier mmpack): upload the store again"
            ) from None
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{self.url}: malformed remote record {remote!r}") from exc
        if stripe <= 0 or stripe % 8:
            raise FormatError(f"{self.url}: check_stripe_bytes {stripe} is not a multiple of 8")
        self._table = LazyStripes(
            pages,
            stripe,
            crcs,
            lambda lo, hi: self._fetch_index(data + name, lo, hi),
            f"{self.url}: {data}{name}",
            self.path / name,
            lambda exc: warn_once(self.cache_dir, exc),
            dtype="<u8",
            what="check table",
        )
        """The check table, each stripe fetched and checked on first use (O(1) at open)."""
        return self._table.array

    def _fetch_index(self, key: str, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of index object ``key``, from the server (one range GET)."""
        try:
            return self.transport.get_ranges(key, [(lo, hi)])[0]
        except ObjectMissing:
            raise FormatError(
                f"{self.url}: {key} is missing: the store is incomplete or was deleted; rebuild it"
            ) from None

    def _fetch_offsets(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of ``offsets.bin``, from the server (one range GET)."""
        return self._fetch_index(self.data + "offsets.bin", lo, hi)

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
            self._recheck_table(start // self.page, -(-stop // self.page), start == 0)
            bad = self.source.check_run(start // self.page, data)[1]
            if bad.size:
                raise FormatError(
                    f"{self.url}: {key} check page {int(bad[0])} fails its checksum: "
                    "the object is corrupt; rebuild the store"
                )
            if self.node_cache is not None:
                self.node_cache.verify(start, data)
        return data

    def _recheck_table(self, b0: int, b1: int, anew: bool) -> None:
        """Fetch the server's table stripes that pages ``[b0, b1)`` use and check their CRC-32s,
        each once per pass of ``verify`` (``anew``: a pass starts); the kept copy is not what
        is checked."""
        lazy = self._table
        if lazy is None or b1 <= b0:
            return
        if anew:
            self._rechecked.clear()
        per = lazy.stripe_bytes // 8
        for p in range(b0 // per, (b1 - 1) // per + 1):
            if p not in self._rechecked:
                lazy.recheck(p)
                self._rechecked.add(p)
