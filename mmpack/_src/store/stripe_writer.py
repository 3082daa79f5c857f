"""Writing a token file on background threads: buffers straight to the file, blocks hashed from it.

:class:`StripeWriter` takes lists of buffers (the documents of a list of arrays, a chunk taken
from an iterator, a full staging block) and writes each list with ``os.pwritev`` at the file's
end on a writer thread (at most ``IOV_MAX`` buffers a call, each taken through the buffer
protocol; the kernel copies them into the page cache, so nothing is copied in Python; a strided
array is made contiguous on the writer thread).  Whenever the written bytes complete a checksum
block, a second thread hashes that block from the file itself (a read-only ``mmap`` of the
range, pages already in the page cache; ``pread`` where a file cannot be mapped): the digest is
of the bytes the file holds, whatever the pieces were.  The caller's thread only hands buffers
over; at most one list is in flight (:meth:`StripeWriter.submit` waits for the previous one), and
the writer holds its own references to the buffers until they are written, so a caller reusing
or changing its buffers waits with :meth:`StripeWriter.sync` first.  Disk space is reserved
ahead (``fallocate(FALLOC_FL_KEEP_SIZE)`` through ``ctypes``, as ``ndarray.tofile`` does: ext4
then writes a stream of pieces as fast as one large write).  :meth:`StripeWriter.truncate` drops
bytes from the end (a rolled back append): it waits for both threads first, so no hash ever maps
a range being cut.  A failed write (a full disk, EIO) is raised by :meth:`StripeWriter.sync` and
again by every later call: the file then lacks bytes counted in :attr:`StripeWriter.end`, so
nothing built on it may be published.

Cost: see :mod:`mmpack._src.store.tokenfile`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.store.integrity import stripe_digest

__all__ = ["StripeWriter"]

_IOV_MAX = 1024  # buffers per pwritev (Linux's IOV_MAX)
_PIECE = 16 << 20  # a single large buffer is written in slices of this size (hashes overlap)


class StripeWriter:
    """Background writer and hasher of one file.

    Parameters
    ----------
    fd : int
        The file, open for writing (its position is not used).  The writer writes through its
        own duplicate of the descriptor, closed by :meth:`close`: a write still in flight when
        the caller closes its file (an exception between :meth:`submit` and :meth:`close`) lands
        in this file, never in another file that reuses the descriptor's number.
    path : Path
        The same file, opened again read-only for hashing.
    block_bytes : int
        Checksum block size (each block's XXH64, :func:`~mmpack._src.store.integrity.stripe_digest`).
    """

    def __init__(self, fd: int, path: Path, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.end = 0  # bytes handed over: the file's length once the writer is done
        self.fd = self._rfd = -1
        self._rfd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.fd = os.dup(fd)  # the writer's own (non-inheritable) descriptor of the file
        except BaseException:
            self._close_fds()
            raise
        self._pool: ThreadPoolExecutor | None = None
        self._hasher: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._hashes: list[Future[int]] = []  # one per complete block (the writer appends)
        self._allocated = 0  # bytes of disk reserved (-1: the file system cannot)
        self._failed: BaseException | None = None  # a write that failed: the file has a gap

    # ------------------------------------------------------------------------------ writing
    def submit(self, pieces: list[Any], ends: np.ndarray) -> None:
        """Write the buffers ``pieces`` (contiguous where possible: a strided array is copied
        on the writer thread) back to back at :attr:`end`; ``ends`` (int64, shape
        (len(pieces),)) are their cumulative sizes in bytes.  The list is cleared once written;
        the buffers must not change until :meth:`sync` returns."""
        self.sync()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmpack-write")
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmpack-hash")
        offset, self.end = self.end, self.end + int(ends[-1])
        self._pending = self._pool.submit(self._write, pieces, ends, offset)

    def sync(self) -> None:
        """Wait for the list in flight (its error, e.g. a full disk, is raised here, and again
        by every later call: the file then lacks bytes counted in :attr:`end`).  The job stays
        in flight until it is done, so an interrupted wait (``KeyboardInterrupt``) leaves it for
        :meth:`close` to wait for before the file is closed."""
        if self._failed is not None:
            raise self._failed
        pending = self._pending
        if pending is None:
            return
        try:
            pending.result()
        finally:
            if pending.done():
                self._pending = None
                self._failed = pending.exception()

    def _write(self, pieces: list[Any], ends: np.ndarray, offset: int) -> None:
        try:
            self._reserve(offset + int(ends[-1]))
            if len(pieces) == 1 and ends[0] > _PIECE:  # one large buffer: hash while writing
                raw = np.ascontiguousarray(pieces[0]).reshape(-1).view(np.uint8)
                for a in range(0, raw.size, _PIECE):
                    self._pwrite([raw[a : a + _PIECE]], min(_PIECE, raw.size - a), offset + a)
                    self._hash_done(offset + min(raw.size, a + _PIECE))
                return
            done = 0
            for a in range(0, len(pieces), _IOV_MAX):
                b = min(a + _IOV_MAX, len(pieces))
                stop = int(ends[b - 1])
                self._pwrite(pieces[a:b], stop - done, offset + done)
                done = stop
                self._hash_done(offset + done)
        finally:
            pieces.clear()  # drop the references before the caller sees the job done

    def _pwrite(self, group: list[Any], want: int, offset: int) -> None:
        try:
            n = _pwritev(self.fd, group, offset)
        except (BufferError, ValueError):  # a strided array: write its values
            group = [np.ascontiguousarray(p) for p in group]
            n = _pwritev(self.fd, group, offset)
        if n < want:  # a short write (a signal, a nearly full disk): write the rest
            rest = memoryview(b"".join(group))[n:]
            while rest:
                k = os.pwrite(self.fd, rest, offset + n)
                if k <= 0:  # nothing written and no error: a full disk, never a loop
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                n, rest = n + k, rest[k:]

    def _hash_done(self, written: int) -> None:
        """Hash every block the file now holds whole (the writer thread, in block order)."""
        assert self._hasher is not None
        bb = self.block_bytes
        while (len(self._hashes) + 1) * bb <= written:
            lo = len(self._hashes) * bb
            self._hashes.append(self._hasher.submit(self._digest, lo, bb))

    def _digest(self, lo: int, size: int) -> int:
        """Digest of the file's bytes ``[lo, lo + size)``."""
        base = lo - lo % mmap.ALLOCATIONGRANULARITY
        try:
            mm = mmap.mmap(
                self._rfd,
                size + lo - base,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ,
                offset=base,
            )
        except (OSError, ValueError):  # a file system that cannot map: read it
            data = os.pread(self._rfd, size, lo)
            assert len(data) == size
            return stripe_digest(data)
        try:
            view = np.frombuffer(mm, dtype=np.uint8)
            digest = stripe_digest(view[lo - base :])
            del view
            return digest
        finally:
            mm.close()

    def _reserve(self, end: int) -> None:
        if end > self._allocated and self._allocated >= 0:
            # Reserve the disk blocks ahead, as ndarray.tofile does: ext4 then writes a stream
            # of pieces as fast as one large write (~2x faster than without).
            step = max(end - self._allocated, min(max(64 << 20, self._allocated), 1 << 30))
            ok = _reserve(self.fd, self._allocated, step)
            self._allocated = self._allocated + step if ok else -1

    # ------------------------------------------------------------------------------ the end
    def truncate(self, pos: int) -> None:
        """Cut the file to ``pos`` bytes (at most :attr:`end`), after both threads are done."""
        self.sync()
        self._wait_hashes()
        os.ftruncate(self.fd, pos)
        del self._hashes[pos // self.block_bytes :]
        self.end = pos
        self._allocated = min(self._allocated, pos)

    def _wait_hashes(self) -> None:
        for h in self._hashes:
            h.exception()

    def digests(self) -> list[int]:
        """Wait for the writes; the digest of every block, the last one partial."""
        self.sync()
        tail = self.end - len(self._hashes) * self.block_bytes
        if tail:
            lo = len(self._hashes) * self.block_bytes
            assert self._hasher is not None  # created by the first submit
            self._hashes.append(self._hasher.submit(self._digest, lo, tail))
        out = [h.result() for h in self._hashes]
        if self._allocated > 0:  # release the disk reserved past the end
            os.ftruncate(self.fd, self.end)
            self._allocated = 0
        return out

    def close(self) -> None:
        """Wait for both threads (an error in flight is dropped: the caller is abandoning the
        file or :meth:`digests` already raised it), release the disk reserved past the file's
        end if :meth:`digests` did not, and close the writer's descriptors.  An interrupted
        wait (``KeyboardInterrupt``) leaves the descriptors to the write still in flight: they
        are closed when the writer object goes."""
        try:
            if self._pending is not None:
                self._pending.exception()
                self._pending = None
        finally:
            self._wait_hashes()  # nothing reads the file once this returns
            for pool in (self._pool, self._hasher):
                if pool is not None:  # idle: its thread ends by itself (no join to wait for)
                    pool.shutdown(wait=False)
            self._pool = self._hasher = None
            if self._pending is None:
                if self._allocated > 0 and self.fd >= 0:  # an abandoned file: give it back
                    with contextlib.suppress(OSError):
                        os.ftruncate(self.fd, os.fstat(self.fd).st_size)
                    self._allocated = 0
                self._close_fds()

    def _close_fds(self) -> None:
        for name in ("fd", "_rfd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    def __del__(self) -> None:
        # An abandoned writer (never closed): no thread holds it any more, so nothing is in
        # flight on its descriptors.
        with contextlib.suppress(OSError):
            self._close_fds()


def _pwritev(fd: int, buffers: list[Any], offset: int) -> int:
    """``os.pwritev``, or one ``os.pwrite`` of the joined buffers where the platform lacks it."""
    if hasattr(os, "pwritev"):
        return os.pwritev(fd, buffers, offset)
    return os.pwrite(fd, b"".join(buffers), offset)  # pragma: no cover  (not Linux/BSD/macOS 11+)


@functools.cache
def _fallocate() -> Any:
    """libc's ``fallocate`` through ``ctypes`` (from the symbols the interpreter already links:
    no ``ldconfig`` lookup, which spawns a process), or None where it is missing."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


def _reserve(fd: int, offset: int, length: int) -> bool:
    """``fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length)``; False where unsupported."""
    fn = _fallocate()
    return fn is not None and bool(fn(fd, 1, offset, length) == 0)
