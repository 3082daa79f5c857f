"""The Zarr v3 backend: the same two arrays in a Zarr group, metadata in the group attributes.

Layout: a Zarr v3 group (``zarr.json``) with arrays ``tokens`` (chunks of 2**18 tokens, Zarr's
default zstd compression) and ``offsets`` (chunks of 2**16), and the mmpack metadata record under
the group attribute ``"mmpack"``; plain ``zarr.open_group(path)`` reads it too.  This is the door to
compressed and remote stores.

Reads are chunk-aware: ``read_ranges`` sorts the requested ranges and coalesces those less than one
chunk apart into spans, reads each span with one Zarr slice (Zarr fetches and decodes the chunks of
a span concurrently), and returns the spans' concatenation with the position of every range in it.
``offsets`` is read into memory once at open (8 bytes per document).

Missing chunks.  Zarr reads a chunk that does not exist as the fill value (zeros) by design; a
store must not.  mmpack writes every chunk (``write_empty_chunks``), so every chunk of both
arrays must exist as a non-empty regular file: opening checks all of them (one ``stat`` each,
~4k per billion tokens), and every token read checks the chunks it touches again (a chunk
deleted after the open), raising :class:`~mmpack.errors.FormatError` instead of returning zeros.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
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
        self._check_chunks("tokens", self._tokens, 0, -(-meta.num_tokens // self.chunk_tokens))

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
        ends = starts + lengths
        order = np.argsort(starts, kind="stable")
        pieces: list[np.ndarray] = []
        base = 0
        i = 0
        while i < k:
            span_lo = int(starts[order[i]])
            span_hi = int(ends[order[i]])
            j = i + 1
            while j < k and int(starts[order[j]]) < span_hi + self.chunk_tokens:
                span_hi = max(span_hi, int(ends[order[j]]))
                j += 1
            pieces.append(self.read_range(span_lo, span_hi))
            for r in order[i:j]:
                src_starts[r] = base + int(starts[r]) - span_lo
            base += span_hi - span_lo
            i = j
        src = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return src, src_starts
