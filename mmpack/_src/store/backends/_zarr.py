"""The Zarr v3 backend: the same two arrays in a Zarr group, metadata in the group attributes.

Layout: a Zarr v3 group (``zarr.json``) with 1-D arrays ``tokens`` and ``offsets`` and the mmpack
metadata record under the group attribute ``"mmpack"``; plain ``zarr.open_group(path)`` reads
it.  Both arrays are sharded (:mod:`mmpack._src.store.backends._zarr_shards`: 8 KiB inner chunks, each
with a crc32c, in shards of up to 32 MiB; zstd per inner chunk if :data:`ZSTD_LEVEL` > 0, off by
default), so every read is verified; another layout is refused at open.

Batched reads (``read_ranges``): numpy finds the inner chunks the ranges touch in the
memory-mapped shards (each shard's index read and checked once); without zstd a chunk's crc32c
is checked the first time this reader touches it (a bitmap) and the chunk served as a view of
the mapping; with zstd, decoded chunks go through the per-process LRU
(:mod:`mmpack._src.store.backends._chunk_cache`, ``MMPACK_ZARR_CACHE_MB``, 256 MiB); then one
``np.concatenate``.  ``verify`` reads through a plain Zarr slice, uncached.  Cost: ``python -m
benchmarks.bench_window --quick --zarr`` (docs/benchmarks.md, against memmap in the same run).
Offsets: each stripe read (a Zarr slice) when a read first uses it (``_lazy_stripes``).

Missing data: Zarr reads an absent chunk as zeros; mmpack writes every chunk, so every shard
must exist as a non-empty regular file (one ``stat`` each at open), and an absent inner chunk,
an index failing its checksum or pointing past the data is a
:class:`~mmpack.errors.FormatError`.  Truncating a mapped shard kills the reader with ``SIGBUS``,
as for the memmap layout.  Every read first checks ``zarr.json`` against the one seen at open: a
store rebuilt in place is a :class:`~mmpack.errors.StateMismatchError`, and cache entries are
keyed by that content.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
from mmpack._src.store.backends._chunk_cache import get_cache
from mmpack._src.store.backends._chunk_ranges import assemble, touched_chunks
from mmpack._src.store.backends._lazy_stripes import LazyStripes
from mmpack._src.store.backends._zarr_shards import (
    ShardReader,
    codecs_for,
    read_layout,
    shard_items,
)
from mmpack._src.store.format import OFFSETS_DTYPE, StoreMeta
from mmpack.errors import FormatError, StateMismatchError

ZSTD_LEVEL = 0
"""zstd level of each inner chunk of a sharded store (0: none, checksum only)."""
_COPY_ITEMS = 1 << 22


def _zarr():
    import zarr  # imported here only: zarr is needed only by stores that use this backend

    return zarr


def _stamp(path: Path) -> bytes | None:
    """The group's ``zarr.json`` (it holds the mmpack record and its fingerprint): differs once
    the store was rebuilt with other content.  (Inode numbers are no stamp: the deleted old
    store's are reused.)"""
    try:
        return (path / "zarr.json").read_bytes()
    except OSError:
        return None


def _corrupt(path: Path, what: str, exc: BaseException) -> FormatError:
    """The error for a Zarr read that failed inside zarr/numcodecs (bad JSON, a chunk that does
    not decode): corruption, reported as such instead of as a codec's internal error."""
    return FormatError(
        f"{path}: cannot read {what} ({type(exc).__name__}: {exc}): the Zarr store is corrupt; "
        "rebuild it"
    )


class ZarrBackend(Backend):
    name = "zarr"

    def __init__(self, path: Path, meta: StoreMeta) -> None:
        super().__init__(path, meta)
        self._stamp = _stamp(path)
        for meta_file in (path / "tokens" / "zarr.json", path / "offsets" / "zarr.json"):
            if os.path.lexists(meta_file) and not meta_file.is_file():  # a FIFO would block
                raise FormatError(f"{meta_file} is not a regular file: the store is damaged")
        try:
            group = _zarr().open_group(str(path), mode="r")
            self._tokens = group["tokens"]
            offsets_arr = group["offsets"]
        except KeyError as exc:
            raise FormatError(f"{path}: Zarr group lacks array {exc}") from None
        except PermissionError:
            raise
        except Exception as exc:  # zarr raises many types for malformed array metadata
            raise _corrupt(path, "the Zarr arrays", exc) from exc
        for name, arr, count, dtype in (
            ("tokens", self._tokens, meta.num_tokens, meta.dtype),
            ("offsets", offsets_arr, meta.num_docs + 1, OFFSETS_DTYPE),
        ):
            if arr.shape != (count,) or np.dtype(arr.dtype) != dtype.newbyteorder("="):
                raise FormatError(
                    f"{path}/{name}: shape {arr.shape} dtype {arr.dtype} does not match the "
                    f"metadata ({count} items of {dtype})"
                )
        for name, arr in (("tokens", self._tokens), ("offsets", offsets_arr)):
            if len(arr.chunks) != 1 or int(arr.chunks[0]) < 1 or _grid(arr) < 1:
                raise FormatError(f"{path}/{name}: invalid chunk shape {arr.chunks}")
        self._check_chunks("offsets", offsets_arr, 0, -(-(meta.num_docs + 1) // _grid(offsets_arr)))
        self._offsets_arr = offsets_arr
        self._lazy = LazyStripes(
            meta.num_docs + 1,
            meta.block_bytes,
            None,
            self._fetch_offsets,
            str(path),
            dtype=np.int64,
            what="offsets",
        )  # each chunk's crc32c checked by the read; the metadata's CRC-32s by verify()
        layout = read_layout(_read_small(path / "tokens" / "zarr.json"))
        if layout is None:
            raise FormatError(
                f"{path}/tokens: not mmpack's sharded Zarr layout (8 KiB inner chunks with a "
                "crc32c each, in shards); rebuild the store"
            )
        self._layout = layout
        self.chunk_tokens = _grid(self._tokens)  # items per shard
        n_chunks = -(-meta.num_tokens // self.chunk_tokens)
        self._check_chunks("tokens", self._tokens, 0, n_chunks)
        encode = self._tokens.metadata.encode_chunk_key
        self._chunk_paths = [str(path / "tokens" / encode((i,))) for i in range(n_chunks)]
        self._stamp_path = str(path / "zarr.json")
        self._stamp_sig: tuple[int, ...] | None = None
        self._cache_key: tuple[Any, ...] = (str(path), self._stamp)
        self._maps: dict[int, memoryview] = {}
        self._cache_key += ("sharded", layout.inner)
        self._verified = np.zeros(-(-meta.num_tokens // layout.inner), dtype=bool)
        self._reader = ShardReader(
            layout, self._read_mapped, self._index_range, str(path / "tokens")
        )

    def _check_chunks(self, name: str, arr: Any, first: int, stop: int) -> None:
        """Raise :class:`FormatError` unless chunks ``[first, stop)`` of ``arr`` exist as
        non-empty regular files (Zarr would read a missing one as zeros)."""
        for c in range(first, stop):
            chunk = self.path / name / arr.metadata.encode_chunk_key((c,))
            try:
                st = os.stat(chunk)
            except FileNotFoundError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                what = (
                    "is missing"
                    if st is None
                    else ("is empty" if stat.S_ISREG(st.st_mode) else "is not a regular file")
                )
                kind = "shard" if getattr(arr, "shards", None) else "chunk"
                raise FormatError(
                    f"{self.path}: {name} {kind} {c} ({chunk.relative_to(self.path)}) {what}: "
                    "Zarr would read it as zeros; the store is incomplete or damaged, rebuild it"
                )

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        if not (path / "zarr.json").is_file():
            if os.path.lexists(path / "zarr.json"):  # a FIFO would block the read
                raise FormatError(
                    f"{path / 'zarr.json'} is not a regular file: the store is damaged"
                )
            return None
        try:
            group = _zarr().open_group(str(path), mode="r")
            return dict(group.attrs).get("mmpack")
        except PermissionError:
            raise
        except Exception as exc:  # zarr raises several types for a malformed group
            raise FormatError(f"{path}: not a readable Zarr group: {exc}") from None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        zarr = _zarr()
        group = zarr.open_group(str(tmpdir), mode="a")
        for name, fname, count, dtype in (
            ("tokens", TOKENS_FILE, meta.num_tokens, meta.dtype),
            ("offsets", OFFSETS_FILE, meta.num_docs + 1, OFFSETS_DTYPE),
        ):
            inner, chunk = shard_items(count, np.dtype(dtype).itemsize)
            # Every chunk is written, even all-zero ones: a missing chunk then means damage.
            arr = group.create_array(
                name,
                shape=(count,),
                dtype=dtype,
                chunks=(inner,),
                shards=(chunk,),
                compressors=codecs_for(ZSTD_LEVEL),
                config={"write_empty_chunks": True},
            )
            if count:  # an empty file cannot be memory-mapped
                raw = np.memmap(tmpdir / fname, dtype=dtype, mode="r")
                step = max(chunk, _COPY_ITEMS // chunk * chunk)
                for lo in range(0, count, step):
                    arr[lo : lo + step] = raw[lo : lo + step]
                del raw
            (tmpdir / fname).unlink()
        # The metadata goes last: a group without it is not a store.
        group.attrs["mmpack"] = meta.to_json()

    def _fetch_offsets(self, lo: int, hi: int) -> np.ndarray:
        """Bytes ``[lo, hi)`` of the offsets (whole entries), through a Zarr slice (every inner
        chunk's crc32c checked)."""
        self._check_unchanged()
        try:
            out = np.asarray(self._offsets_arr[lo // 8 : hi // 8], dtype=OFFSETS_DTYPE)
        except (PermissionError, MemoryError):
            raise
        except Exception as exc:
            raise _corrupt(self.path, "offsets", exc) from exc
        self._check_unchanged()
        return np.ascontiguousarray(out)

    @property
    def offsets(self) -> np.ndarray:
        return self._lazy.array

    def load_offsets(self, first: int, stop: int) -> None:
        self._lazy.load(first, stop)

    def raw_bytes(self, name: str, start: int, stop: int) -> bytes:
        # verify() reads the files now, never the decoded-chunk cache
        if name == "offsets":
            return super().raw_bytes(name, start, stop)
        item = self.meta.dtype.itemsize
        first, last = start // item, -(-stop // item)
        chunk = np.ascontiguousarray(self._read_range_uncached(first, last))
        skip = start - first * item
        return chunk.view(np.uint8)[skip : skip + (stop - start)].tobytes()

    def _read_range_uncached(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` through a plain Zarr slice (which checks every crc32c of a
        sharded store), then every file read checked to exist."""
        if stop <= start:
            return np.empty(0, dtype=self.meta.dtype)
        self._check_unchanged()
        try:
            out = np.asarray(self._tokens[start:stop])
        except (PermissionError, MemoryError):
            raise
        except Exception as exc:  # a chunk that no longer decodes (zstd, truncation, crc)
            self._check_unchanged()
            raise _corrupt(self.path, f"tokens [{start}, {stop})", exc) from exc
        self._check_unchanged()  # the chunks read were the ones of the store opened
        c = self.chunk_tokens  # and they all existed (a missing one reads as zeros)
        self._check_chunks("tokens", self._tokens, start // c, -(-stop // c))
        return out

    def _check_unchanged(self) -> None:
        # Chunks are read by path: after a rebuild with overwrite=True they are the new store's
        # (unlike a memory mapping, which keeps the old files), so refuse rather than mix them.
        if _stamp(self.path) != self._stamp:
            raise StateMismatchError(
                f"{self.path}: the Zarr store was replaced (rebuilt) after it was opened; "
                "open it again"
            )

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        t = touched_chunks(starts, lengths, self._layout.inner)
        if t.uniq.size == 0:
            return np.empty(0, dtype=self.meta.dtype), np.zeros(starts.shape[0], np.int64)
        return assemble(self._inner_chunks(t.uniq), t, lengths, self.meta.dtype)

    def _inner_chunks(self, uniq: np.ndarray) -> dict[int, np.ndarray]:
        """Decoded inner chunks ``uniq`` of a sharded store, read from the memory-mapped
        shards, every chunk's crc32c checked.  Without zstd a decoded chunk is a view of the
        mapping: checked the first time this backend reads it (a bitmap remembers it), then
        served as is, cache or not.  With zstd, decoded chunks go through the process's LRU."""
        self._check_unchanged_fast()
        opened = len(self._maps)
        try:
            got = self._decode_inner(uniq)
        except (FormatError, FileNotFoundError):
            # A shard mapped after a rebuild swapped the folder is the new store's: its index
            # fails against the old layout.  That is a replaced store, not a damaged one.
            self._check_unchanged()
            raise
        if len(self._maps) != opened:  # files mapped now: they must be the store's opened
            self._check_unchanged()
        return got

    def _decode_inner(self, uniq: np.ndarray) -> dict[int, np.ndarray]:
        if not self._layout.zstd:
            trusted = self._verified[uniq]
            got = self._reader.chunks(uniq, trusted)
            self._verified[uniq] = True
        else:
            cache = get_cache()
            got = {i: e[0] for i, e in cache.get_many(self._cache_key, uniq.tolist()).items()}
            if len(got) != uniq.size:
                missing = uniq[~np.isin(uniq, np.fromiter(got, np.int64, len(got)))]
                fetched = self._reader.chunks(missing)
                cache.put_many(self._cache_key, {i: (a, None) for i, a in fetched.items()})
                got.update(fetched)
        return got

    def _shard_map(self, s: int) -> memoryview:
        """Token shard ``s`` memory-mapped (once; read-only, like the memmap backend's
        ``tokens.bin``): reads are slices, no copy, and forked children share the mapping."""
        known = self._maps.get(s)
        if known is not None:
            return known
        path = self._chunk_paths[s]
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            self._check_unchanged()
            self._check_chunks("tokens", self._tokens, s, s + 1)
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                self._check_chunks("tokens", self._tokens, s, s + 1)
            view = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        finally:
            os.close(fd)
        return self._maps.setdefault(s, view)

    def _index_range(self, s: int) -> tuple[int, int]:
        size = len(self._shard_map(s))
        return max(0, size - self._layout.index_nbytes), size

    def _read_mapped(self, requests: Any) -> list[list[memoryview]]:
        return [[self._shard_map(s)[lo:hi] for lo, hi in ranges] for s, ranges in requests]

    def _check_unchanged_fast(self) -> None:
        """:meth:`_check_unchanged` with one ``os.read`` (~3 us instead of ~13 us); never
        blocks (a FIFO put in place of ``zarr.json`` reads as empty: replaced)."""
        stamp = self._stamp
        try:  # unchanged inode, size and change time: the bytes compared last time
            st = os.stat(self._stamp_path)
            sig: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            sig = None
        if sig is not None and sig == self._stamp_sig:
            return
        now: bytes | None = None
        try:
            fd = os.open(self._stamp_path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                now = os.read(fd, (len(stamp) if stamp is not None else 0) + 1)
            except OSError:
                now = None
            finally:
                os.close(fd)
        if now != stamp:
            raise StateMismatchError(
                f"{self.path}: the Zarr store was replaced (rebuilt) after it was opened; "
                "open it again"
            )
        self._stamp_sig = sig


def _grid(arr: Any) -> int:
    """Items per file of a 1-D Zarr array: its shard (or its chunk, for an unsharded array)."""
    shards = getattr(arr, "shards", None)
    return int(shards[0] if shards else arr.chunks[0])


def _read_small(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
