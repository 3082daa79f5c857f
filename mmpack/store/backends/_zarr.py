"""The Zarr v3 backend: the same two arrays in a Zarr group, metadata in the group attributes.

Layout: a Zarr v3 group (``zarr.json``) with arrays ``tokens`` (chunks of 2**18 tokens, Zarr's
default zstd compression) and ``offsets`` (chunks of 2**16), and the mmpack metadata record under
the group attribute ``"mmpack"``; plain ``zarr.open_group(path)`` reads it too.  This is the door to
compressed and remote stores.

Batched reads (``read_ranges``, what the views call once per batch) go through a per-process LRU
of decoded chunks (:mod:`mmpack.store.backends._chunk_cache`, 256 MiB unless
``MMPACK_ZARR_CACHE_MB`` says otherwise): numpy finds the chunk ids the batch's ranges touch, the
cached ones are taken as they are, the missing ones are read whole with one concurrent call on
Zarr's event loop (``AsyncArray.getitem`` per chunk under ``asyncio.gather``), decoded once and
cached; the ranges are then copied out of the chunks with one ``np.concatenate`` (a batch inside
one chunk returns that read-only chunk, no copy).  Measured (``python -m benchmarks.bench_window
--quick --zarr``: 32 windows of 2049 tokens from ~93M tokens, 2 shared cores): ~0.27 ms per batch
with the chunks cached against ~0.10 ms for memmap (ratio ~0.4; the per-chunk Zarr path took
~26-37 ms).  Of the cached path's time, about half is the one ``stat`` per touched chunk below.
``read_range`` (single documents, ``verify``) still reads through a plain Zarr slice, uncached,
so verification always reads the files.

Missing chunks.  Zarr reads a chunk that does not exist as the fill value (zeros) by design; a
store must not.  mmpack writes every chunk (``write_empty_chunks``), so every chunk of both
arrays must exist as a non-empty regular file: opening checks all of them (one ``stat`` each,
~4k per billion tokens), and every token read checks the chunks it touches again (a chunk
deleted after the open), raising :class:`~mmpack.errors.FormatError` instead of returning zeros.
A cached chunk is used only while its file keeps the (inode, size, mtime) it had when decoded;
otherwise it is read again, so a chunk removed, truncated or rewritten after caching is still an
error (a rewrite that keeps size and mtime, e.g. ``touch -r``, is not noticed: ``verify`` is).
Every read first compares ``zarr.json`` with the one seen at open: a store rebuilt in place is a
:class:`~mmpack.errors.StateMismatchError`, and cache entries are keyed by that content, so the
new store never sees the old one's chunks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
from mmpack.store.backends._chunk_cache import get_cache
from mmpack.store.format import OFFSETS_DTYPE, StoreMeta

TOKEN_CHUNK = 1 << 18
OFFSET_CHUNK = 1 << 16
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
            if len(arr.chunks) != 1 or int(arr.chunks[0]) < 1:
                raise FormatError(f"{path}/{name}: invalid chunk shape {arr.chunks}")
        self._check_chunks(
            "offsets", offsets_arr, 0, -(-(meta.num_docs + 1) // int(offsets_arr.chunks[0]))
        )
        try:
            offsets = np.asarray(offsets_arr[:], dtype=np.int64)
        except (PermissionError, MemoryError):
            raise
        except Exception as exc:
            raise _corrupt(path, "offsets", exc) from exc
        offsets.flags.writeable = False
        self._offsets = offsets
        self.chunk_tokens = int(self._tokens.chunks[0])
        n_chunks = -(-meta.num_tokens // self.chunk_tokens)
        self._check_chunks("tokens", self._tokens, 0, n_chunks)
        encode = self._tokens.metadata.encode_chunk_key
        self._chunk_paths = [str(path / "tokens" / encode((i,))) for i in range(n_chunks)]
        self._cache_key = (str(path), self._stamp)
        self._stamp_path = str(path / "zarr.json")

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
                raise FormatError(
                    f"{self.path}: {name} chunk {c} ({chunk.relative_to(self.path)}) {what}: "
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
        for name, fname, count, dtype, chunk in (
            ("tokens", TOKENS_FILE, meta.num_tokens, meta.dtype, TOKEN_CHUNK),
            ("offsets", OFFSETS_FILE, meta.num_docs + 1, OFFSETS_DTYPE, OFFSET_CHUNK),
        ):
            # Every chunk is written, even all-zero ones: a missing chunk then means damage.
            arr = group.create_array(
                name,
                shape=(count,),
                dtype=dtype,
                chunks=(chunk,),
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

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def read_range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.meta.dtype)
        self._check_unchanged()
        try:
            out = np.asarray(self._tokens[start:stop])
        except (PermissionError, MemoryError):
            raise
        except Exception as exc:  # a chunk that no longer decodes (zstd, truncation)
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
        k = len(starts)
        src_starts = np.zeros(k, dtype=np.int64)
        if k == 0:
            return np.empty(0, dtype=self.meta.dtype), src_starts
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        c = self.chunk_tokens
        live = lengths > 0
        first = starts // c
        last = (starts + lengths - 1) // c
        # shape: (touched,) every chunk id some non-empty range touches, sorted, unique
        counts = np.where(live, last - first + 1, 0)
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, dtype=self.meta.dtype), src_starts
        run_start = np.cumsum(counts) - counts
        ids = np.repeat(first, counts) + (np.arange(total) - np.repeat(run_start, counts))
        uniq = np.unique(ids)
        chunks = self._chunks(uniq)
        if len(uniq) == 1:  # every range lies in one chunk: serve it as is (read-only)
            src_starts[live] = starts[live] - int(uniq[0]) * c
            return chunks[int(uniq[0])], src_starts
        return _assemble(chunks, c, starts, lengths, first, last, live, src_starts, self.meta.dtype)

    def _chunks(self, uniq: np.ndarray) -> dict[int, np.ndarray]:
        """Decoded token chunks ``uniq`` (sorted unique int64 ids), from the process's cache or
        read from the store with one concurrent Zarr call.  As :meth:`read_range` does, the store
        is checked unchanged and every chunk checked to exist now as a non-empty regular file; a
        cached chunk is used only while its file keeps the size and mtime it had when decoded
        (else it is read again, so a truncated chunk is still a :class:`FormatError`)."""
        ids = uniq.tolist()
        cache = get_cache()
        self._check_unchanged_fast()
        entries = cache.get_many(self._cache_key, ids)
        sigs = self._signatures(ids)  # raises FormatError for a missing/empty/odd chunk
        got = {i: e[0] for i, e in entries.items() if e[1] == sigs[i]}
        missing = [i for i in ids if i not in got]
        if not missing:
            return got
        try:
            fetched = self._fetch(missing)
        except (PermissionError, MemoryError):
            raise
        except Exception as exc:  # a chunk that no longer decodes (zstd, truncation)
            self._check_unchanged()
            self._signatures(missing)
            lo, hi = missing[0] * self.chunk_tokens, (missing[-1] + 1) * self.chunk_tokens
            raise _corrupt(
                self.path, f"tokens [{lo}, {min(hi, self.meta.num_tokens)})", exc
            ) from exc
        self._check_unchanged()  # the chunks read were the ones of the store opened
        after = self._signatures(missing)  # and they all existed (a missing one reads as zeros)
        cache.put_many(
            self._cache_key,
            {i: (fetched[i], sigs[i]) for i in missing if after[i] == sigs[i]},
        )
        got.update(fetched)
        return got

    def _check_unchanged_fast(self) -> None:
        """:meth:`_check_unchanged` with one ``os.read`` (~3 us instead of ~13 us); never
        blocks (a FIFO put in place of ``zarr.json`` reads as empty: replaced)."""
        stamp = self._stamp
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

    def _fetch(self, ids: list[int]) -> dict[int, np.ndarray]:
        """Chunks ``ids`` read whole, concurrently, in one call on Zarr's event loop."""
        import asyncio

        from zarr.core.sync import sync

        c, n = self.chunk_tokens, self.meta.num_tokens
        arr = self._tokens.async_array

        async def read_all() -> list[Any]:
            return await asyncio.gather(
                *(arr.getitem(slice(i * c, min((i + 1) * c, n))) for i in ids)
            )

        out: dict[int, np.ndarray] = {}
        for i, data in zip(ids, sync(read_all()), strict=True):
            chunk = np.ascontiguousarray(np.asarray(data), dtype=self.meta.dtype)
            chunk.flags.writeable = False
            out[i] = chunk
        return out

    def _signatures(self, ids: list[int]) -> dict[int, tuple[int, int, int]]:
        """``(inode, size, mtime_ns)`` of token chunk files ``ids``, one ``stat`` of a
        precomputed path each; :class:`FormatError` (as :meth:`_check_chunks`) for one that is
        missing, empty or not a regular file."""
        paths = self._chunk_paths
        out: dict[int, tuple[int, int, int]] = {}
        for i in ids:
            try:
                st = os.stat(paths[i])
            except FileNotFoundError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                self._check_chunks("tokens", self._tokens, i, i + 1)
                raise AssertionError("unreachable: _check_chunks raised")  # pragma: no cover
            out[i] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return out


def _assemble(
    chunks: dict[int, np.ndarray],
    c: int,
    starts: np.ndarray,
    lengths: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    live: np.ndarray,
    src_starts: np.ndarray,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """One buffer holding the non-empty ranges one after another, copied out of their decoded
    chunks with one ``np.concatenate``; fills ``src_starts`` (empty ranges point at 0)."""
    at = np.cumsum(lengths) - lengths
    src_starts[live] = at[live]
    pieces: list[np.ndarray] = []
    for s, n, f, la in zip(
        starts[live].tolist(), lengths[live].tolist(), first[live].tolist(), last[live].tolist()
    ):
        if f == la:
            lo = s - f * c
            pieces.append(chunks[f][lo : lo + n])
            continue
        pos, end = s, s + n
        for ch in range(f, la + 1):
            hi = min(end, (ch + 1) * c)
            pieces.append(chunks[ch][pos - ch * c : hi - ch * c])
            pos = hi
    return np.concatenate(pieces).astype(dtype, copy=False), src_starts
