"""Sharded Zarr arrays read in batches: shard indexes, inner-chunk runs, checksums, decoding.

The layout mmpack writes (:mod:`mmpack._src.store.backends._zarr`), a plain Zarr v3 array: 1-D,
``sharding_indexed`` with inner chunks of :data:`INNER_CHUNK_BYTES` (8 KiB: 4096 uint16 tokens)
inside shards of up to :data:`SHARD_BYTES` (32 MiB), each inner chunk encoded
``bytes(little) [+ zstd] + crc32c`` and the shard index (``(offset, nbytes)`` uint64 pairs, one
per inner chunk, at the end of the shard) ``bytes(little) + crc32c``: a few large objects, and
every byte read is verified.  A shuffled 2049-token window touches 1.5 inner chunks on average;
smaller chunks check fewer bytes but pay more per-chunk Python work, and remote range requests
merge adjacent chunks anyway.  32 MiB shards keep the index at 64 KiB (read once per shard), go
up in one PUT (below the multipart threshold) and are written from one buffer.

Algorithm of :meth:`ShardReader.chunks` (one call per batch): numpy turns the wanted inner chunk
ids into (shard, slot) pairs and looks their ``(offset, nbytes)`` up in the cached shard indexes
(vectorised); adjacent chunks of one shard merge into one byte range of at most
:data:`MAX_RUN_CHUNKS`; the ranges are read by the caller's ``fetch`` (slices of a mapped shard
locally, concurrent range GETs remotely); each chunk's CRC-32C is checked (``google_crc32c``),
zstd decoded if used, and returned read-only (without zstd, a view of the bytes read).  An
absent chunk, a short read, an index or chunk failing its checksum is a
:class:`~mmpack.errors.FormatError`, never data.  Cost: ``python -m benchmarks.bench_window
--quick --zarr`` (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.store.format import write_bytes_atomic
from mmpack.errors import FormatError

__all__ = [
    "INNER_CHUNK_BYTES",
    "SHARD_BYTES",
    "ShardLayout",
    "ShardReader",
    "codecs_for",
    "crc32c",
    "parse_layout",
    "read_layout",
    "shard_items",
]

INNER_CHUNK_BYTES = 8 << 10
"""Bytes of one inner chunk (decoded): the unit read, verified and cached (4096 uint16 tokens)."""
SHARD_BYTES = 32 << 20
"""Most bytes of one shard (one file or object)."""
MAX_RUN_CHUNKS = 8
"""Adjacent chunks merged into one read at most (each decoded chunk is a view of its run's
bytes, which stay alive while any of its chunks is cached: this bounds that overhead)."""

_EMPTY = np.uint64(2**64 - 1)
_local = threading.local()  # Zarr's index entry of an absent inner chunk
Fetch = Callable[[Sequence[tuple[int, Sequence[tuple[int, int]]]]], Sequence[Sequence[Any]]]
"""``fetch([(shard, [(start, stop), ...]), ...])`` -> the bytes of every range, same nesting."""


def codecs_for(zstd_level: int) -> list[Any]:
    """The inner-chunk codecs (after ``bytes``) mmpack writes: crc32c, with zstd before it when
    ``zstd_level`` > 0."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return ([ZstdCodec(level=zstd_level)] if zstd_level > 0 else []) + [Crc32cCodec()]


def shard_items(count: int, itemsize: int) -> tuple[int, int]:
    """``(inner, shard)`` items for an array of ``count`` items of ``itemsize`` bytes: inner
    chunks of :data:`INNER_CHUNK_BYTES`, shards of :data:`SHARD_BYTES` (smaller for a small
    array: just enough whole inner chunks)."""
    inner = max(1, INNER_CHUNK_BYTES // itemsize)
    per = max(1, SHARD_BYTES // (inner * itemsize))
    need = max(1, -(-count // inner))
    return inner, inner * min(per, need)


@dataclass(frozen=True)
class ShardLayout:
    """What a reader needs of one sharded 1-D array's metadata."""

    count: int  # items in the array
    dtype: np.dtype
    inner: int  # items per inner chunk
    shard: int  # items per shard
    zstd: bool
    prefix: str  # chunk key prefix: "c/" (default encoding, "/") or "c." / ""
    separator: str

    @property
    def per_shard(self) -> int:
        return self.shard // self.inner

    @property
    def index_nbytes(self) -> int:
        return self.per_shard * 16 + 4

    @property
    def num_shards(self) -> int:
        return -(-self.count // self.shard)

    def key(self, s: int) -> str:
        """The shard's key relative to the array's folder (``c/3``)."""
        return f"{self.prefix}{s}"


def _named(codec: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(codec, str):
        return codec, {}
    if not isinstance(codec, dict):
        return "", {}
    return str(codec.get("name")), dict(codec.get("configuration") or {})


def parse_layout(meta: dict[str, Any]) -> ShardLayout | None:
    """The layout of a Zarr v3 array from its ``zarr.json`` (a dict), if it is the sharded 1-D
    layout this module reads (little-endian bytes, optional zstd, crc32c; index at the end with
    crc32c); None otherwise (an older unsharded store: read through Zarr itself)."""
    try:
        codecs = meta["codecs"]
        if len(codecs) != 1 or _named(codecs[0])[0] != "sharding_indexed":
            return None
        conf = _named(codecs[0])[1]
        (shard,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
        (inner,) = conf["chunk_shape"]
        (count,) = meta["shape"]
        names = [_named(c) for c in conf["codecs"]]
        index = [_named(c) for c in conf.get("index_codecs", [])]
        enc_name, enc = _named(meta.get("chunk_key_encoding", {"name": "default"}))
        dtype = np.dtype(meta["data_type"]).newbyteorder("<")
    except (KeyError, TypeError, ValueError):
        return None
    little = ("bytes", {"endian": "little"})
    if dtype.itemsize == 1 and names[:1] == [("bytes", {})]:  # no byte order for one byte
        names[0] = little
    if names[:1] != [little] or names[-1:] != [("crc32c", {})]:
        return None
    middle = [n for n, _ in names[1:-1]]
    if middle not in ([], ["zstd"]) or index != [little, ("crc32c", {})]:
        return None
    if conf.get("index_location", "end") != "end" or inner < 1 or shard < 1 or shard % inner:
        return None
    sep = str(enc.get("separator", "/" if enc_name == "default" else "."))
    prefix = "c" + sep if enc_name == "default" else ""
    return ShardLayout(int(count), dtype, int(inner), int(shard), bool(middle), prefix, sep)


def read_layout(text: bytes | str) -> ShardLayout | None:
    """:func:`parse_layout` of an array's ``zarr.json`` text (None if it is not JSON)."""
    try:
        return parse_layout(json.loads(text))
    except (ValueError, UnicodeDecodeError):
        return None


def crc32c(data: Any) -> int:
    """CRC-32C of a bytes-like object (Zarr's crc32c codec: ``google_crc32c``)."""
    import google_crc32c  # zarr's crc32c codec uses it: a dependency of zarr

    # it takes numpy arrays, not memoryview slices; frombuffer is a view (no copy)
    return int(google_crc32c.value(np.frombuffer(data, dtype=np.uint8)))


def parse_index(raw: bytes, layout: ShardLayout, where: str) -> np.ndarray:
    """The ``(per_shard, 2)`` uint64 ``(offset, nbytes)`` table of a shard index (its crc32c
    checked); :class:`FormatError` naming ``where`` if it does not verify."""
    mv = memoryview(raw)
    if len(mv) != layout.index_nbytes or crc32c(mv[:-4]) != int.from_bytes(mv[-4:], "little"):
        raise FormatError(
            f"{where}: the shard index fails its checksum ({len(mv)} bytes): the shard is "
            "corrupt or truncated; rebuild the store"
        )
    table = np.frombuffer(mv[:-4], dtype="<u8").reshape(-1, 2)
    return table


def decode_chunk(piece: memoryview, layout: ShardLayout, where: str) -> np.ndarray:
    """One inner chunk's decoded items (read-only): crc32c checked, zstd undone."""
    if len(piece) < 4 or crc32c(piece[:-4]) != int.from_bytes(piece[-4:], "little"):
        raise FormatError(
            f"{where} fails its checksum: the store is corrupt; rebuild it (nothing was returned)"
        )
    body: Any = piece[:-4]
    if layout.zstd:
        import zstandard

        dctx = getattr(_local, "dctx", None)
        if dctx is None:  # one context per thread: creating one costs ~100 us
            dctx = _local.dctx = zstandard.ZstdDecompressor()
        try:
            body = dctx.decompress(body)
        except zstandard.ZstdError as exc:
            raise FormatError(f"{where} does not decode ({exc}): the store is corrupt") from None
    want = layout.inner * layout.dtype.itemsize
    if len(body) != want:
        raise FormatError(f"{where} holds {len(body)} bytes, expected {want}: the store is corrupt")
    out = np.frombuffer(body, dtype=layout.dtype)
    if out.dtype.byteorder not in ("=", "|") and not out.dtype.isnative:
        out = out.astype(layout.dtype.newbyteorder("="))
    out.flags.writeable = False
    return out


class ShardReader:
    """Inner chunks of one sharded array, read through ``fetch`` with cached shard indexes.

    Parameters
    ----------
    layout : ShardLayout
    fetch : callable
        See :data:`Fetch`.
    index_range : callable
        ``index_range(shard) -> (start, stop)``: where the shard's index lies in its object.
    where : str
        The array's location for messages (a path or URL of its folder).
    """

    def __init__(
        self,
        layout: ShardLayout,
        fetch: Fetch,
        index_range: Callable[[int], tuple[int, int]],
        where: str,
        index_files: Path | None = None,
    ) -> None:
        self.layout = layout
        self.fetch = fetch
        self.index_range = index_range
        self.where = where.rstrip("/")
        self.index_files = index_files
        self._indexes: dict[int, np.ndarray] = {}

    def _name(self, s: int) -> str:
        return f"{self.where}/{self.layout.key(s)}"

    def indexes(self, shards: Sequence[int]) -> dict[int, np.ndarray]:
        """The index tables of ``shards``, fetched (all at once) the first time each is asked."""
        need = [s for s in shards if s not in self._indexes]
        kept = {s: self._kept_index(s) for s in need} if self.index_files is not None else {}
        fetch = [s for s in need if kept.get(s) is None]
        pieces = self.fetch([(s, [self.index_range(s)]) for s in fetch]) if fetch else []
        got = {s: raw for s, (raw,) in zip(fetch, pieces, strict=True)}
        for s in need:
            raw = kept.get(s) or got[s]
            table = parse_index(raw, self.layout, self._name(s))
            present = table[:, 0] != _EMPTY
            if (table[present, 0] + table[present, 1] > self.index_range(s)[0]).any():
                raise FormatError(
                    f"{self._name(s)}: the shard index points past the shard's data: the "
                    "shard is truncated or corrupt; rebuild the store"
                )
            self._indexes[s] = table
            if s in got and self.index_files is not None:
                with contextlib.suppress(OSError):  # a copy for later readers, where it fits
                    write_bytes_atomic(self.index_files / f"index-{s}.bin", bytes(raw))
        return {s: self._indexes[s] for s in shards}

    def _kept_index(self, s: int) -> bytes | None:
        """Shard ``s``'s index as saved in ``index_files`` (remote readers keep them there, so
        a worker's reader does not fetch them again), if it is there and verifies."""
        assert self.index_files is not None
        try:
            raw = (self.index_files / f"index-{s}.bin").read_bytes()
            parse_index(raw, self.layout, self._name(s))
        except (OSError, FormatError):
            return None
        return raw

    def chunks(self, ids: np.ndarray, trusted: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Decoded inner chunks ``ids`` (sorted unique int64 global chunk ids), read now;
        ``trusted`` (bool, like ``ids``) marks chunks whose bytes were verified before and
        cannot have changed since (a mapped file of a local store): their crc is not
        computed again."""
        if ids.size == 0:
            return {}
        per = self.layout.per_shard
        shard_of, slot = np.divmod(ids, per)
        # shape (k,): the shards touched, and where each one's ids start in ``ids``
        shards, first = np.unique(shard_of, return_index=True)
        tables = self.indexes(shards.tolist())
        entries = np.empty((ids.size, 2), dtype=np.uint64)
        bounds = np.append(first, ids.size)
        for k, s in enumerate(shards.tolist()):
            entries[bounds[k] : bounds[k + 1]] = tables[s][slot[bounds[k] : bounds[k + 1]]]
        absent = entries[:, 0] == _EMPTY
        if absent.any():  # mmpack writes every chunk: an absent one is damage, never zeros
            c = int(ids[np.argmax(absent)])
            raise FormatError(
                f"{self._name(c // per)}: inner chunk {c % per} is absent from the shard index "
                "(Zarr would read it as zeros): the store is incomplete; rebuild it"
            )
        off = entries[:, 0].astype(np.int64)
        end = off + entries[:, 1].astype(np.int64)
        # a new run where the shard changes or the next chunk does not start where this ends
        brk = np.ones(ids.size, dtype=bool)
        brk[1:] = (shard_of[1:] != shard_of[:-1]) | (off[1:] != end[:-1])
        run_at = np.flatnonzero(brk)
        if run_at.size * MAX_RUN_CHUNKS < ids.size or (np.diff(run_at) > MAX_RUN_CHUNKS).any():
            # and every MAX_RUN_CHUNKS chunks (a cached chunk keeps its run's bytes alive)
            brk |= (np.arange(ids.size) - run_at[np.cumsum(brk) - 1]) % MAX_RUN_CHUNKS == 0
            run_at = np.flatnonzero(brk)
        run_end = np.append(run_at[1:], ids.size)
        requests: list[tuple[int, list[tuple[int, int]]]] = []
        run_shard = shard_of[run_at].tolist()
        for s, lo, hi in zip(run_shard, off[run_at].tolist(), end[run_end - 1].tolist()):
            if requests and requests[-1][0] == s:
                requests[-1][1].append((lo, hi))
            else:
                requests.append((s, [(lo, hi)]))
        pieces = [p for got in self.fetch(requests) for p in got]
        return self._decode(
            ids, off, end, run_at.tolist(), run_end.tolist(), run_shard, pieces, trusted
        )

    def _decode(
        self,
        ids: np.ndarray,
        off: np.ndarray,
        end: np.ndarray,
        run_at: list[int],
        run_end: list[int],
        run_shard: list[int],
        pieces: list[Any],
        trusted: np.ndarray | None,
    ) -> dict[int, np.ndarray]:
        """Check and decode the chunks of the fetched runs (the hot loop: ~1.5 us a chunk
        without zstd, where every chunk of a run has one size)."""
        import google_crc32c

        value = google_crc32c.value
        lay, per = self.layout, self.layout.per_shard
        size = lay.inner * lay.dtype.itemsize + 4
        if not lay.zstd and not (end - off == size).all():
            j = int(np.argmax(end - off != size))
            c = int(ids[j])
            raise FormatError(
                f"{self._name(c // per)} inner chunk {c % per}: the index says "
                f"{int(end[j] - off[j])} bytes, expected {size}: the store is corrupt"
            )
        out: dict[int, np.ndarray] = {}
        idl = ids.tolist()
        dtype = lay.dtype
        check = [True] * len(idl) if trusted is None else (~trusted).tolist()
        for r, (a, b) in enumerate(zip(run_at, run_end)):
            data, base, stop = pieces[r], int(off[a]), int(end[b - 1])
            if len(data) != stop - base:
                raise FormatError(
                    f"{self._name(run_shard[r])}: bytes {base}..{stop} read short "
                    f"({len(data)}): the shard is truncated; rebuild the store"
                )
            if lay.zstd:
                mv = memoryview(data)
                for j in range(a, b):
                    c = idl[j]
                    where = f"{self._name(c // per)} inner chunk {c % per}"
                    out[c] = decode_chunk(mv[off[j] - base : end[j] - base], lay, where)
                continue
            u8 = np.frombuffer(data, dtype=np.uint8)  # read-only: a view of bytes
            for j in range(a, b):  # chunk j spans [lo, lo + size) of the run, crc last
                lo = (j - a) * size
                body = u8[lo : lo + size - 4]
                if check[j] and value(body) != int.from_bytes(
                    data[lo + size - 4 : lo + size], "little"
                ):
                    c = idl[j]
                    raise FormatError(
                        f"{self._name(c // per)} inner chunk {c % per} fails its checksum: the "
                        "store is corrupt; rebuild it (nothing was returned)"
                    )
                out[idl[j]] = body.view(dtype)
        return out
