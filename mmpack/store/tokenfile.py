"""The token file of a build in progress: one pass that converts, range-checks and hashes.

Tokens arrive as flat integer arrays of any dtype.  :meth:`TokenFile.append` converts them into a
reused buffer of one checksum block (``block_bytes``, 16 MiB) in the store's dtype with one numba
pass that also checks every token against the accepted range
(:func:`mmpack.kernels.store.convert_tokens`); each full block is hashed
(:func:`mmpack.store.integrity.block_digest`: XXH64 by default, ~12 GB/s here, or zlib's CRC-32,
~1-2.5 GB/s) and written with one ``write`` of the whole buffer, on a second thread while the
next block is converted into a second buffer (the kernels and the write release the GIL).  An append is all or nothing: a
token out of range (negative, >= 2**63 or beyond a fixed dtype) rolls the file back to where the
append began (the partial block is read back from the file when the append had completed a block)
and returns the index of that token; the caller names the document.  Without a fixed dtype the
file starts as uint8 and is widened in place (one sequential rewrite through the same pass, at
most three times a build) when a valid token needs more bits; the rest of the array is checked
first, so a rejected append never widens the store.

Documents given as a list of arrays in the file's dtype skip the conversion pass:
:meth:`TokenFile.append_arrays` copies them with one ``np.concatenate(..., out=, casting="no")``
per block straight into the buffer (one copy; ``casting="no"`` and the 1-D ``out`` check every
document's dtype and shape, and a refusal rolls back like a bad token).

Measured (``python -m benchmarks.bench_store``, 200M uint16 tokens, a loaded 2-core VM):
``add_batch`` at 0.44-0.76 of ``ndarray.tofile`` of the same bytes in the same run (0.19-0.23
with the previous writer: ``np.concatenate`` then CRC-32 on a second thread).  A build from a
list of 430k arrays costs (``--profile``, CPU ms): taking and copying the documents 138 (~150 ns
a document for numpy to take each array, plus the copy), XXH64 34, the write itself ~72 (as
much as all of ``tofile``): 0.23-0.32 of ``tofile`` in wall time at load average 3.5-4.4.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import numpy as np

from mmpack.store.format import smallest_token_dtype
from mmpack.store.integrity import block_digest
from mmpack.store.tokens import MAX_TOKEN

__all__ = ["TokenFile"]

_WIDEN_STEP = 1 << 22


class TokenFile:
    """Append-only token file with per-block digests.

    Parameters
    ----------
    path : Path
        The file (created empty by ``opener``).
    opener : callable
        ``opener(path, mode)`` returning a binary file object (the writer's ``open``).
    fixed : numpy.dtype or None
        The store's token dtype when the caller fixed it; None picks the narrowest as tokens come.
    checksum : {"xxh64", "crc32"}
    block_bytes : int
        Checksum block size (a multiple of 8).
    """

    def __init__(
        self,
        path: Path,
        opener: Callable[[Path, str], IO[bytes]],
        fixed: np.dtype | None,
        checksum: str,
        block_bytes: int,
    ) -> None:
        self.path = path
        self._open = opener
        self.fixed = fixed
        self.checksum = checksum
        self.block_bytes = block_bytes
        self.valid_max = MAX_TOKEN if fixed is None else min(MAX_TOKEN, int(np.iinfo(fixed).max))
        self.dtype: np.dtype = fixed if fixed is not None else np.dtype("<u1")
        self.file: IO[bytes] = opener(path, "wb")
        self._buf = np.empty(block_bytes, dtype=np.uint8)
        self._spare: np.ndarray | None = None  # the block being hashed and written
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._allocated = 0  # bytes of disk reserved (-1: the file system cannot)
        self._fill = 0  # bytes held in the buffer (the tail of the file, not yet written)
        self.digests: list[int] = []  # one per written block
        self.num_tokens = 0
        self.widen_hook: Callable[[np.dtype], None] | None = None
        """Called instead of :meth:`widen` when set (the writer routes it through its own
        method; :meth:`close` clears it, so no reference cycle outlives the build)."""

    # ------------------------------------------------------------------------------- appending
    def append(self, src: np.ndarray) -> int:
        """Append the tokens ``src`` (1-D integer array); return -1, or the index of the first
        token out of range, in which case nothing of ``src`` stays appended."""
        if not src.dtype.isnative:
            src = src.astype(src.dtype.newbyteorder("="))
        if (
            src.dtype == self.dtype
            and src.dtype.kind == "u"
            and int(np.iinfo(src.dtype).max) <= self.valid_max
            and src.flags.c_contiguous
        ):
            self._append_same(src)  # every value fits: nothing to convert or check
            return -1
        mark = self.num_tokens
        if src.size:
            p = self._convert(src)
            if p < 0:
                return -1
            value = int(src[p])
            if 0 <= value <= self.valid_max:  # a valid token needing more bits
                rest = self._first_invalid(src[p:])
                if rest < 0:  # never widen for an append that is then refused
                    (self.widen_hook or self.widen)(smallest_token_dtype(value))
                    return self.append(src[p:])  # all valid now: cannot fail
                p += rest
            self._rollback(mark)
            return p
        return -1

    def append_arrays(self, docs: list[np.ndarray], lengths: np.ndarray) -> bool:
        """Append the tokens of ``docs`` back to back when every one is a 1-D array of the
        file's dtype whose every value is valid (an unsigned dtype no wider than the token
        rule allows): one ``np.concatenate`` per checksum block copies them straight into the
        block.  ``lengths`` (int64, shape (len(docs),)) are their lengths.  Return whether
        they were appended; on False nothing of them is (the caller converts and checks)."""
        dt = self.dtype
        if dt.kind != "u" or int(np.iinfo(dt).max) > self.valid_max:
            return False
        if not docs or docs[0].dtype != dt:
            return False
        ends = np.cumsum(lengths)
        starts = ends - lengths
        total, n, itemsize = int(ends[-1]), len(docs), dt.itemsize
        if not total:
            return False  # nothing would check the documents
        mark, pos, i, cut = self.num_tokens, 0, 0, 0  # docs[i][:cut] are in already
        try:
            while pos < total:
                stop = min(total, pos + (self.block_bytes - self._fill) // itemsize)
                k = int(np.searchsorted(ends, stop, "right"))  # docs[i:k] end by ``stop``
                parts = docs[i:k]
                if cut and k > i:
                    parts[0] = parts[0][cut:]
                if k < n and starts[k] < stop:  # docs[k] continues in the next block
                    parts.append(docs[k][(cut if k == i else 0) : stop - starts[k]])
                    i, cut = k, int(stop - starts[k])
                else:
                    i, cut = k, 0
                out = self._buf[self._fill : self._fill + (stop - pos) * itemsize].view(dt)
                np.concatenate(parts, out=out, casting="no")  # checks dtypes and ndim
                self._fill += (stop - pos) * itemsize
                self.num_tokens += stop - pos
                pos = stop
                if self._fill == self.block_bytes:
                    self._emit()
        except (TypeError, ValueError):
            self._rollback(mark)
            return False
        return True

    def _convert(self, src: np.ndarray) -> int:
        """Convert ``src`` into the buffer block by block; -1, or the index of the first token
        beyond the current dtype (everything before it is appended)."""
        from mmpack.kernels.store import convert_tokens

        itemsize = self.dtype.itemsize
        hi = min(self.valid_max, int(np.iinfo(self.dtype).max))
        info = np.iinfo(src.dtype)
        lo_v, hi_v = src.dtype.type(0), src.dtype.type(min(hi, int(info.max)))
        done = 0
        while done < src.size:
            room = (self.block_bytes - self._fill) // itemsize
            part = src[done : done + room]
            out = self._buf[self._fill : self._fill + part.size * itemsize].view(self.dtype)
            got = int(convert_tokens(part, out, lo_v, hi_v))
            self._fill += got * itemsize
            self.num_tokens += got
            if self._fill == self.block_bytes:
                self._emit()
            if got < part.size:
                return done + got
            done += got
        return -1

    def _append_same(self, src: np.ndarray) -> None:
        """Append tokens already in the file's dtype: whole blocks are hashed and written
        straight from ``src`` (no copy), the ends go through the buffer."""
        raw = src.view(np.uint8)
        if self._fill:
            take = min(raw.size, self.block_bytes - self._fill)
            self._buf[self._fill : self._fill + take] = raw[:take]
            self._fill += take
            raw = raw[take:]
            if self._fill == self.block_bytes:
                self._emit()
        borrowed = raw.size >= self.block_bytes
        while raw.size >= self.block_bytes:
            self._submit(raw[: self.block_bytes])
            raw = raw[self.block_bytes :]
        if borrowed:
            self._sync()  # the caller may change ``src`` once this returns
        self._buf[: raw.size] = raw
        self._fill += raw.size
        self.num_tokens += src.size

    def _first_invalid(self, src: np.ndarray) -> int:
        """Index of the first token of ``src`` outside ``[0, valid_max]``, or -1."""
        top = int(np.iinfo(src.dtype).max)
        bad = src < 0 if src.dtype.kind == "i" else np.zeros(src.shape, dtype=bool)
        if self.valid_max < top:
            bad |= src > src.dtype.type(self.valid_max)
        return int(np.argmax(bad)) if bad.any() else -1

    def _emit(self) -> None:
        """Hand the full buffer (one block) to the writer thread, which hashes and writes it
        while the next block is converted into the other buffer."""
        full = self._buf
        self._submit(full)
        self._buf = self._spare if self._spare is not None else np.empty_like(full)
        self._spare = full
        self._fill = 0

    def _submit(self, block: np.ndarray) -> None:
        self._sync()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmpack-write")
        self._pending = self._pool.submit(self._hash_and_write, block)

    def _hash_and_write(self, block: np.ndarray) -> None:
        self.digests.append(block_digest(self.checksum, block))
        end = len(self.digests) * self.block_bytes
        if end > self._allocated and self._allocated >= 0:
            # Reserve the disk blocks ahead, as ndarray.tofile does: ext4 then writes a stream
            # of 16 MiB blocks as fast as one large write (~2x faster than without).
            step = min(max(64 << 20, self._allocated), 1 << 30)
            ok = _reserve(self.file.fileno(), self._allocated, step)
            self._allocated = self._allocated + step if ok else -1
        self.file.write(memoryview(block))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__

    def _sync(self) -> None:
        """Wait for the block in flight (its error, e.g. a full disk, is raised here)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _rollback(self, num_tokens: int) -> None:
        """Drop every token from ``num_tokens`` on (it is at most :attr:`num_tokens`)."""
        self._sync()
        pos = num_tokens * self.dtype.itemsize
        written = len(self.digests) * self.block_bytes
        if pos < written:  # blocks were completed since: read the partial block back
            k = pos // self.block_bytes
            self.file.flush()
            with open(self.path, "rb") as f:
                f.seek(k * self.block_bytes)
                f.readinto(memoryview(self._buf)[: pos - k * self.block_bytes])  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
            self.file.seek(k * self.block_bytes)
            self.file.truncate()
            self._allocated = min(self._allocated, k * self.block_bytes)
            del self.digests[k:]
            self._fill = pos - k * self.block_bytes
        else:
            self._fill = pos - written
        self.num_tokens = num_tokens

    def widen(self, dtype: np.dtype) -> None:
        """Rewrite the tokens so far as ``dtype`` into a new file through the same pass, then
        replace the file with one rename (the old file stays whole until then)."""
        self._sync()
        self.file.write(memoryview(self._buf[: self._fill]))  # type: ignore[arg-type]
        self.file.close()
        self._allocated = 0
        old_dtype, count = self.dtype, self.num_tokens
        new_path = self.path.with_name(self.path.name + ".widen")
        self.file = self._open(new_path, "wb")
        self.dtype, self._fill, self.num_tokens = dtype, 0, 0
        self.digests = []
        if count:  # an empty file cannot be memory-mapped
            old = np.memmap(self.path, dtype=old_dtype, mode="r", shape=(count,))
            for lo in range(0, count, _WIDEN_STEP):
                assert self._convert(np.asarray(old[lo : lo + _WIDEN_STEP])) < 0  # all fit
            del old
        self._sync()
        os.replace(new_path, self.path)

    # ------------------------------------------------------------------------------- finishing
    def finish(self) -> list[int]:
        """Write the last (partial) block; the digests of every block."""
        self._sync()
        if self._fill:
            tail = self._buf[: self._fill]
            self.digests.append(block_digest(self.checksum, tail))
            self.file.write(memoryview(tail))  # type: ignore[arg-type]
            self._fill = 0
        self._trim()
        return self.digests

    def _trim(self) -> None:
        """Release the disk blocks reserved past the end of the file."""
        if self._allocated > 0:
            self.file.flush()
            os.ftruncate(self.file.fileno(), self.num_tokens * self.dtype.itemsize)

    def close(self) -> None:
        """Wait for the writer thread and close the file (an error of the block in flight is
        dropped: the build is being abandoned or :meth:`finish` already raised it)."""
        self.widen_hook = None
        try:
            if self._pending is not None:
                self._pending.exception()
                self._pending = None
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self.file.close()


_libc: object = None


def _reserve(fd: int, offset: int, length: int) -> bool:
    """``fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length)``; False where unsupported."""
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util

        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fallocate = lib.fallocate
            fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _libc = fallocate
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    return _libc(fd, 1, offset, length) == 0  # type: ignore[operator]
