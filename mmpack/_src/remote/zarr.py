"""Sharded Zarr stores on object storage: verified reads (uploads: :mod:`mmpack._src.remote.upload`).

Layout of a remote Zarr store at ``URL``::

    URL/mmpack.json                 the metadata record, written LAST (the commit marker), plus
                                    "remote": {"data": "data-<id>", "layout": "zarr-sharded",
                                               "arrays": {"tokens": <its zarr.json>, ...},
                                               "objects": {"tokens/c/0": <bytes>, ...}}
    URL/data-<id>/zarr.json         a plain Zarr v3 group (``zarr.open_group`` reads it), with
    URL/data-<id>/tokens/c/<s>      the sharded arrays of :mod:`mmpack._src.store.backends._zarr_shards`
    URL/data-<id>/offsets/c/<s>     (32 MiB shards of 8 KiB inner chunks, each with a crc32c)

Open (:class:`RemoteZarrBackend`): one GET of ``mmpack.json`` (the arrays' metadata and every
object's size), one LIST of the data prefix (a missing shard is a
:class:`~mmpack.errors.FormatError`) and the ``offsets`` chunks of the first and last 16 MiB
stripes (each chunk's crc32c, then the stripe's CRC-32); any other stripe is fetched so when a
read first uses it, kept locally (:class:`~mmpack._src.store.backends._lazy_stripes.LazyStripes`).  Reads take the memmap layout's
path (:class:`~mmpack._src.remote.base.RemoteStoreBackend`; the block order's
:class:`~mmpack._src.remote.spans.SpanFetcher`) over :class:`~mmpack._src.remote.sources.ChunkSource`: one
page per inner chunk, located through its shard's index (one range GET per shard, kept), a
request's chunks fetched as merged range GETs per shard, each crc32c-checked (a mismatch
fetched once more, then ``FormatError``) and decoded.  With ``cache_limit`` the decoded chunks
go to the node cache, copied out only under the reader's pins (a dropped chunk is fetched again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.remote.base import RemoteStoreBackend
from mmpack._src.remote.cache import PageCache, warn_once
from mmpack._src.remote.cached import CachedObject
from mmpack._src.remote.fetcher import PageFetcher
from mmpack._src.remote.sources import ChunkSource
from mmpack._src.remote.spans import SpanFetcher
from mmpack._src.remote.transport import Transport
from mmpack._src.store.backends._chunk_ranges import assemble, touched_chunks
from mmpack._src.store.backends._lazy_stripes import LazyStripes
from mmpack._src.store.backends._zarr_shards import ShardLayout, parse_layout
from mmpack._src.store.format import OFFSETS_DTYPE, StoreMeta
from mmpack.errors import FormatError

__all__ = ["LAYOUT", "RemoteZarrBackend"]

LAYOUT = "zarr-sharded"
"""The ``remote.layout`` value of a remote Zarr store's ``mmpack.json``."""


class RemoteZarrBackend(RemoteStoreBackend):
    """The tokens of one remote sharded Zarr store, read in verified inner chunks.

    ``folder`` is ``<cache_dir>/stores/<fingerprint>`` (offsets and shard indexes are kept
    there); ``cache`` the node cache under ``cache_dir``, or None."""

    name = "zarr"

    def __init__(
        self,
        transport: Transport,
        meta: StoreMeta,
        raw: dict[str, Any],
        folder: Path,
        cache: PageCache | None = None,
    ) -> None:
        super().__init__(folder, meta)
        self.cache = cache
        self.transport = transport
        self.url = transport.url
        self.cache_dir = folder.parent.parent
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
        self._layout = layouts["tokens"]
        self.node_cache = self._node_cache(cache)
        """This reader's view of the decoded token chunks in the node cache (None without)."""
        self.source = ChunkSource(transport, self.data, objects, self._layout, self._kept("tokens"))
        """The token array's inner chunks (:mod:`mmpack._src.remote.sources`)."""
        self.fetcher = PageFetcher(self.source, self.node_cache)
        self.span_fetcher = None if self.node_cache is None else SpanFetcher(self.fetcher)
        """Whole spans into the node cache, pinned and dropped (None without a node cache)."""
        self._offsets_layout = layouts["offsets"]
        self._offsets_reader: Any = None  # made on the first stripe fetched
        self._lazy = LazyStripes(
            meta.num_docs + 1,
            meta.block_bytes,
            meta.offsets_crc32,
            self._fetch_offsets,
            f"{self.url}: {self.data}offsets",
            folder / "offsets.bin",  # the remote memmap reader keeps the same bytes there
            lambda exc: warn_once(self.cache_dir, exc),
            dtype=np.int64,
            what="offsets",
        )
        """The offsets, each stripe fetched and checked on first use (O(1) at open)."""

    # ------------------------------------------------------------------------------ open
    def _kept(self, name: str) -> Path:
        return self.path / f"zarr-{self.data.strip('/')}-{name}"  # verified when read back

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

    def _node_cache(self, cache: PageCache | None) -> CachedObject | None:
        """One cache page per inner chunk; None without a cache, or for inner chunks that are
        not a power of two bytes."""
        page = self._layout.inner * self.meta.dtype.itemsize
        if cache is None or page & (page - 1):
            return None
        nbytes = self.meta.num_tokens * self.meta.dtype.itemsize
        fp = self.meta.fingerprint
        return CachedObject(cache, fp, "zarr-tokens", nbytes, page, self.meta.dtype, self.url)

    def _fetch_offsets(self, lo: int, hi: int) -> np.ndarray:
        """Bytes ``[lo, hi)`` of the offsets (whole entries): the inner chunks holding them,
        each crc32c-checked (:meth:`ChunkSource.verified`), their shard indexes kept locally."""
        layout = self._offsets_layout
        if self._offsets_reader is None:
            kept = self._kept("offsets")
            self._offsets_reader = self.source.make_reader("offsets", layout, kept)
        first, stop = lo // 8, hi // 8
        ids = np.arange(first // layout.inner, -(-stop // layout.inner), dtype=np.int64)
        chunks = self.source.verified(self._offsets_reader, ids)
        flat = np.concatenate([chunks[i] for i in ids.tolist()])
        skip = first - int(ids[0]) * layout.inner
        return np.ascontiguousarray(flat[skip : skip + stop - first], dtype=OFFSETS_DTYPE)

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
        """For ``verify``: the bytes read from the server now (never the cache); the node
        cache's copies are compared with them."""
        if name == "offsets":  # the server's chunks, never the kept copy
            if stop <= start:
                return b""
            lo, hi = start // 8 * 8, -(-stop // 8) * 8
            raw = self._fetch_offsets(lo, hi).view(np.uint8)
            return raw[start - lo : stop - lo].tobytes()
        item = self.meta.dtype.itemsize
        first, last = start // item, -(-stop // item)
        st, ln = np.array([first], np.int64), np.array([last - first], np.int64)
        t = touched_chunks(st, ln, self._layout.inner)
        chunks = self.source.verified(self.source.reader, t.uniq)
        src, _ = assemble(chunks, t, ln, self.meta.dtype)
        skip = start - first * item
        data = np.ascontiguousarray(src).view(np.uint8)[skip : skip + (stop - start)].tobytes()
        if self.node_cache is not None:
            self.node_cache.verify(start, data)
        return data
