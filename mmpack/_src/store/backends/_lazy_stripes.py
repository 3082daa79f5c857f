"""A fixed-width array filled stripe by stripe on first use: what a store cannot map whole.

Two uses: the int64 offsets of a remote store (either layout) or a local Zarr store
(``num_docs + 1`` entries), and a remote store's check table (one uint64 XXH64 per page of
``tokens.bin``).  The array has its full length; its stripes (``stripe_bytes`` each: the
format's checksum unit, or the record's ``check_stripe_bytes``) are filled when first asked for
(:meth:`LazyStripes.load`, :meth:`LazyStripes.load_items`): the stripe's bytes come from a
``fetch`` callable (a range GET, the Zarr chunks of that stripe), are checked against the
metadata's CRC-32 of the stripe and written in place.  Every stripe is checked in each process
before it is used, so an entry never read is never trusted.

Where a ``kept`` path is given (``offsets.bin`` or ``tokens.xxh`` in a remote store's local
folder), the array is a private mapping of a sparse file of the full size (``ftruncate``:
stripes never fetched are holes, reading as zeros, which fail their CRC): a stripe already there
from an earlier process costs a CRC-32 and no request; a fetched one is written with
``os.pwrite`` (only ever whole with its verified bytes, so concurrent processes write identical
bytes) and, where the mapping does not show it or the write fails, copied into this process's
private pages.  Without a kept file the array is anonymous zeros: untouched stripes cost no
memory.  Loads are serialised by a per-process lock (threads; a forked child gets its own).
Cost: opening is O(1) (no stripe is read); each stripe costs one CRC-32 over its bytes once per
process, plus one fetch the first time any process on the machine uses it.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.process import PerProcess
from mmpack.errors import FormatError

__all__ = ["LazyStripes"]

RUN_BYTES = 1 << 26
"""At most this many bytes of stripes are fetched by one ``fetch`` call (:meth:`load`)."""


class LazyStripes:
    """A full-length array of a fixed-width dtype whose stripes are fetched and checked on first
    use.

    Parameters
    ----------
    count : int
        Entries (>= 0).
    stripe_bytes : int
        Bytes per stripe (a positive multiple of the dtype's size).
    crcs : sequence of int, optional
        CRC-32 of each stripe (the metadata's ``offsets_crc32``, the remote record's
        ``check_crc32s``); None where ``fetch`` checks what it reads its own way (a local Zarr
        store's crc32c per chunk) and no ``kept`` file is given (the process's bitmap alone then
        says which stripes are present).
    fetch : callable
        ``fetch(lo, hi)``: bytes ``[lo, hi)`` of the array (whole stripes; the last may be
        short), as ``bytes`` or a numpy array; raises :class:`FormatError` for a missing or
        damaged source.
    where : str
        Named in error messages (the object or folder the array comes from).
    kept : Path, optional
        The local file kept across processes (a sparse file of the full size), or None.
    on_error : callable, optional
        ``on_error(exc)``, told once when ``kept`` cannot be created or written (the stripes are
        then kept in this process's memory); the error is ignored when None.
    dtype : numpy dtype
        The entries' type (``int64`` offsets, ``<u8`` digests).
    what : str
        What the array is, in error messages (``"offsets"``, ``"check table"``).
    """

    def __init__(
        self,
        count: int,
        stripe_bytes: int,
        crcs: Sequence[int] | None,
        fetch: Callable[[int, int], Any],
        where: str,
        kept: Path | None = None,
        on_error: Callable[[OSError], None] | None = None,
        *,
        dtype: Any,
        what: str,
    ) -> None:
        self._fd = -1  # the kept file's descriptor (for pwrite), once it is open
        self.dtype = np.dtype(dtype)
        self.nbytes = int(count) * self.dtype.itemsize
        self.stripe_bytes = int(stripe_bytes)
        if self.stripe_bytes <= 0 or self.stripe_bytes % self.dtype.itemsize:
            raise ValueError(
                f"stripe_bytes={stripe_bytes!r} is not a positive multiple of "
                f"{self.dtype.itemsize} ({self.dtype})"
            )
        n_stripes = -(-self.nbytes // self.stripe_bytes)
        self._crcs = None if crcs is None else [int(c) for c in crcs]
        if kept is not None and self._crcs is None:
            raise ValueError("a kept file needs the stripes' CRC-32s")
        if self._crcs is not None and len(self._crcs) != n_stripes:
            raise FormatError(
                f"{where}: the metadata holds {len(self._crcs)} {what} checksums for "
                f"{n_stripes} stripes"
            )
        self._fetch = fetch
        self._where = where
        self._what = what
        self._on_error = on_error
        self._lock = PerProcess(threading.Lock)  # a forked child never inherits a held lock
        self._loaded = np.zeros(n_stripes, dtype=bool)
        buf = self._map_kept(kept) if kept is not None and self.nbytes else None
        self._buf = np.zeros(int(count), self.dtype) if buf is None else buf  # writable, private
        self.array = self._buf.view()
        """shape (count,), read-only: the stripes :meth:`load` made present hold the data; any
        other entry may read as anything (zeros)."""
        self.array.flags.writeable = False

    def _map_kept(self, kept: Path) -> np.ndarray | None:
        """A private mapping of ``kept`` (created sparse at the full size), or None after
        telling ``on_error``.  The descriptor stays open for :meth:`_write`."""
        fd, writable = -1, True
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(kept, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:  # a copy kept by another user: read it, write nothing
                fd, writable = os.open(kept, os.O_RDONLY), False
            size = os.fstat(fd).st_size
            if size != self.nbytes:
                os.ftruncate(fd, self.nbytes)  # (a read-only descriptor refuses: no file)
            mm = mmap.mmap(fd, self.nbytes, access=mmap.ACCESS_COPY)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            self._tell(exc)
            return None
        if writable:
            self._fd = fd
        else:
            os.close(fd)  # the mapping stays; fetched stripes go to this process's pages
        return np.frombuffer(mm, dtype=self.dtype)

    def _tell(self, exc: OSError) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    def loaded(self, p: int) -> bool:
        """Whether stripe ``p`` is present and checked in this process."""
        return bool(self._loaded[p])

    def load(self, first: int, stop: int | None = None) -> None:
        """Make stripes ``[first, stop)`` (``stop`` None: ``first + 1``) present: each one not
        checked yet in this process is checked where it lies (a kept file), else fetched in
        runs of at most :data:`RUN_BYTES`, checked and written.  :class:`FormatError` naming
        the first stripe that fails its CRC-32 (nothing is written for it)."""
        stop = first + 1 if stop is None else stop
        if self._loaded[first:stop].all():
            return
        with self._lock.get():
            todo = [p for p in range(first, stop) if not self._loaded[p] and not self._here(p)]
            per_run = max(1, RUN_BYTES // self.stripe_bytes)
            k = 0
            while k < len(todo):
                j = k + 1
                while j < len(todo) and todo[j] == todo[j - 1] + 1 and j - k < per_run:
                    j += 1
                self._fetch_run(todo[k], todo[j - 1] + 1)
                k = j

    def load_items(self, lo: int, hi: int) -> None:
        """Make the stripes holding entries ``[lo, hi)`` present (:meth:`load`)."""
        if hi > lo:
            per = self.stripe_bytes // self.dtype.itemsize
            self.load(lo // per, (hi - 1) // per + 1)

    def recheck(self, p: int) -> None:
        """Fetch stripe ``p`` from the source again and check it against its CRC-32, never
        reading or writing the kept copy (``verify``); :class:`FormatError` naming it."""
        lo, hi = self._span(p)
        self._checked(p, lo, self._fetched(lo, hi))

    def _span(self, p: int) -> tuple[int, int]:
        lo = p * self.stripe_bytes
        return lo, min(self.nbytes, lo + self.stripe_bytes)

    def _here(self, p: int) -> bool:
        """Whether stripe ``p`` already holds its bytes (an earlier process kept it); marks it."""
        lo, hi = self._span(p)
        if self._crcs is None or zlib.crc32(self._buf.view(np.uint8)[lo:hi].data) != self._crcs[p]:
            return False
        self._loaded[p] = True
        return True

    def _fetched(self, lo: int, hi: int) -> np.ndarray:
        data = np.frombuffer(memoryview(self._fetch(lo, hi)).cast("B"), dtype=np.uint8)
        if data.size != hi - lo:
            raise FormatError(
                f"{self._where}: {self._what} bytes {lo}..{hi} came back as {data.size} bytes: "
                "the object is truncated or was replaced; rebuild the store"
            )
        return data

    def _checked(self, p: int, lo: int, data: np.ndarray) -> np.ndarray:
        """Stripe ``p``'s bytes out of ``data`` (bytes from ``lo``), checked against its CRC-32."""
        s_lo, s_hi = self._span(p)
        part = data[s_lo - lo : s_hi - lo]
        if self._crcs is not None and (got := zlib.crc32(part.data)) != self._crcs[p]:
            raise FormatError(
                f"{self._where}: {self._what} stripe {p} (bytes {s_lo}..{s_hi}) fails its "
                f"checksum (crc32: stored {self._crcs[p]:#010x}, computed {got:#010x}): the "
                "data is corrupt or was replaced; rebuild the store"
            )
        return part

    def _fetch_run(self, a: int, b: int) -> None:
        lo, hi = self._span(a)[0], self._span(b - 1)[1]
        data = self._fetched(lo, hi)
        for p in range(a, b):
            self._write(self._span(p)[0], self._checked(p, lo, data))
            self._loaded[p] = True

    def _write(self, lo: int, part: np.ndarray) -> None:
        """Put verified bytes ``part`` at byte ``lo``: into the kept file (other processes, the
        next run) and, unless the mapping shows them now, into this process's private pages."""
        mine = self._buf.view(np.uint8)[lo : lo + part.size]
        if self._fd >= 0:
            try:
                done = 0
                while done < part.size:
                    done += os.pwrite(self._fd, part[done:].data, lo + done)
            except OSError as exc:
                os.close(self._fd)
                self._fd = -1
                self._tell(exc)
            if np.array_equal(mine, part):
                return
        mine[:] = part

    def close(self) -> None:
        """Close the kept file's descriptor (the mapping lives as long as the array)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()
