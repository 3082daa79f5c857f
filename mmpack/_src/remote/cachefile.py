r"""One remote object in the node cache: a sparse data file mapped read-only, its page states
and digests, and which pages this reader has checked.

A cached object (a remote store's ``tokens.bin``, or a remote Zarr store's decoded token chunks)
is two files under ``<cache_dir>/pages/``: ``<stem>.data``, the object's bytes at their own
offsets in a sparse file, and ``<stem>.state``, a 64-byte header (magic, version, page size,
size, bytes charged, last use, retired, drops, the creating boot's id), one state byte per page
(0 absent, 1 present), then every page's XXH64; a file of another size or boot is damaged
(:class:`DamagedCacheFile`) and discarded.  Writing (:meth:`CacheFile.write`): bytes already checked against the store (XXH64 per check
page, crc32c per Zarr chunk) are charged, written (``pwrite``), their XXH64 recorded, and only
then the state byte set, so a killed writer leaves a page absent, never wrong.  Serving: a page
is served from the mapping only once this reader checked it (wrote it, or recomputed its XXH64:
:meth:`CacheFile.check`, :func:`mmpack._src.kernels.store.check_ranges`, one call per batch); a
page that fails is dropped and fetched again.  Claims: a process fetches only pages it holds
an exclusive OFD lock on (``fcntl(F_OFD_SETLK)`` over their state bytes, never blocking; the
lock dies with its process); a mapping holds a shared lock on byte 0, and eviction removes only
files it can lock exclusively.  Pins, the one rule of every drop: a reader pins what it serves
from the mapping (:meth:`CacheFile.pin`: shared OFD locks, a byte per page past the state
file's end); a drop takes only pages it locks exclusively there (:meth:`CacheFile.unpinned`).

Cost: one XXH64 per page per reader, once (``python -m benchmarks.trust_costs node_cache``);
the hit test (:meth:`CacheFile.serves`) is one kernel pass over the batch's ranges
(:func:`~mmpack._src.kernels.pagestate.all_pages_present`); a hit is zero copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.libc import libc_function
from mmpack._src.kernels.pagestate import all_pages_present
from mmpack._src.kernels.store import check_ranges
from mmpack._src.store.integrity import stripe_digests

__all__ = [
    "CacheFile",
    "DamagedCacheFile",
    "HEADER",
    "MAGIC",
    "PIN_WAIT_SECONDS",
    "boot_id",
    "id_runs",
    "lock_range",
    "pack_header",
    "state_file_size",
]

MAGIC = b"MMPKBLK2"
VERSION = 2
HEADER = 64
_HEADER_FMT = "<8sIIQQdB7x16s"  # magic, version, page, nbytes, counted, last_used, retired, boot
PIN_WAIT_SECONDS = 1.0
"""The longest a pin waits for a drop of its pages under way (a drop holds its exclusive locks
for milliseconds); retried 5 ms apart."""
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # Linux; 37 is its value on every Linux arch
_FORK_CLOSE: set[int] = set()
"""Lock descriptors open now: a forked child closes its copies at once (a ``flock`` or OFD lock
lives as long as any descriptor of its open file, so a child's copy would keep the parent's lock
alive until the child exits)."""
_FORK_GUARD = threading.Lock()
"""Held while a lock descriptor is opened and registered, or unregistered and closed, and
across ``fork``: a child never inherits a descriptor the set does not name."""


def open_lock_fd(path: str | os.PathLike, flags: int = os.O_RDWR, mode: int = 0o644) -> int:
    """Open ``path`` for taking locks on: a descriptor no forked child keeps (close it with
    :func:`close_lock_fd`)."""
    with _FORK_GUARD:
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        _FORK_CLOSE.add(fd)
    return fd


def close_lock_fd(fd: int) -> None:
    """Close a descriptor of :func:`open_lock_fd` (its locks are released)."""
    with _FORK_GUARD:
        _FORK_CLOSE.discard(fd)
        os.close(fd)


def _close_in_child() -> None:
    global _FORK_GUARD
    for fd in list(_FORK_CLOSE):
        with contextlib.suppress(OSError):
            os.close(fd)
    _FORK_CLOSE.clear()
    _FORK_GUARD = threading.Lock()  # the parent's is held across the fork


os.register_at_fork(
    before=lambda: _FORK_GUARD.acquire(),
    after_in_parent=lambda: _FORK_GUARD.release(),
    after_in_child=_close_in_child,
)


def boot_id() -> bytes:
    """The running boot's id (16 bytes; zeros where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return bytes(16)


class DamagedCacheFile(OSError):
    """A cache file whose size is not the one its object implies (truncated, extended)."""


def _digests_at(npages: int) -> int:
    return -(-(HEADER + npages) // 8) * 8


def state_file_size(npages: int) -> int:
    """Bytes of the state file of an object of ``npages`` pages (header, states, digests)."""
    return _digests_at(npages) + 8 * npages


def pack_header(page: int, nbytes: int, counted: int, boot: bytes) -> bytes:
    return struct.pack(_HEADER_FMT, MAGIC, VERSION, page, nbytes, counted, time.time(), 0, boot)


def unpack_header(raw: bytes) -> tuple[Any, ...] | None:
    """``(page, nbytes, counted, last_used, retired, boot)``, or None for a foreign header."""
    if len(raw) < HEADER:
        return None
    magic, version, *rest = struct.unpack(_HEADER_FMT, raw[:HEADER])
    return tuple(rest) if magic == MAGIC and version == VERSION else None


def lock_range(fd: int, kind: int, start: int, length: int) -> bool:
    """Take an OFD lock (``fcntl.F_RDLCK``/``F_WRLCK``/``F_UNLCK``) on bytes ``[start, start +
    length)`` of ``fd`` without waiting; False when another holder conflicts."""
    arg = struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, arg)
    except (BlockingIOError, PermissionError):
        return False
    return True


def id_runs(ids: np.ndarray) -> tuple[list[int], list[int]]:
    """The runs ``[starts[k], stops[k])`` of adjacent ids in sorted, unique page ids ``ids``
    (int64)."""
    if not len(ids):
        return [], []
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([ids[:1], ids[cut]])
    stops = np.concatenate([ids[cut - 1], ids[-1:]]) + 1
    return starts.tolist(), stops.tolist()


def _load_punch() -> Any:
    return libc_function(
        "fallocate", ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    )


_FALLOCATE = _load_punch()
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


class Claim:
    """Pages this process fetches (``mine``: locked here, absent) and pages another holder is
    fetching (``theirs``); :meth:`close` releases every lock."""

    def __init__(self, fd: int, mine: list[int], theirs: list[int]) -> None:
        self.fd, self.mine, self.theirs = fd, mine, theirs

    def close(self) -> None:
        if self.fd >= 0:
            close_lock_fd(self.fd)
            self.fd = -1


class CacheFile:
    """A cached object, mapped: ``state`` (uint8, (npages,)) and ``data`` (uint8, (nbytes,)),
    ``tokens`` the data as ``dtype``.  Made by :meth:`PageCache.open_file` (under its lock)."""

    def __init__(self, stem: Path, nbytes: int, page: int, dtype: np.dtype) -> None:
        self.stem = stem
        self.state_path = stem.with_suffix(".state")
        self.data_path = stem.with_suffix(".data")
        self.nbytes, self.page = nbytes, page
        self.shift = page.bit_length() - 1
        self.npages = -(-nbytes // page)
        self._fd_state = self._fd_data = -1
        state_size = state_file_size(self.npages)
        try:
            self._fd_state = os.open(self.state_path, os.O_RDWR | os.O_CLOEXEC)
            self._fd_data = os.open(self.data_path, os.O_RDWR | os.O_CLOEXEC)
            for fd, want, path in (
                (self._fd_state, state_size, self.state_path),
                (self._fd_data, nbytes, self.data_path),
            ):
                size = os.fstat(fd).st_size
                if size != want:
                    raise DamagedCacheFile(f"{path} holds {size} bytes, not {want}")
            for fd in (self._fd_state, self._fd_data):  # "mapped here": held by the mappings
                if not lock_range(fd, fcntl.F_RDLCK, 0, 1):
                    raise OSError("the cache file is being evicted")
            self._state_map = mmap.mmap(self._fd_state, state_size)
            self._data_map = mmap.mmap(self._fd_data, nbytes, access=mmap.ACCESS_READ)
        except OSError:
            self.close()
            raise
        self._data_map.madvise(mmap.MADV_RANDOM)
        self.state = np.frombuffer(self._state_map, np.uint8, self.npages, HEADER)
        self.digests = np.frombuffer(self._state_map, "<u8", self.npages, _digests_at(self.npages))
        self.checked = np.zeros(self.npages, np.uint8)
        """1 for the pages this reader may serve (written by it, or checked), 2 for a page
        found bad and not dropped yet, else 0 (process memory)."""
        # pages whose claim outlived a reader's wait here (a stopped holder): fetched at once
        # while that claim stays, so a stuck claim delays a reader once, not at every read
        self.stuck: set[int] = set()
        self._counted = np.frombuffer(self._state_map, np.uint64, 1, 24)
        self._last_used = np.frombuffer(self._state_map, np.float64, 1, 32)
        self._retired = np.frombuffer(self._state_map, np.uint8, 1, 40)
        self._drops = np.frombuffer(self._state_map, np.uint32, 1, 44)
        self._drops_seen = int(self._drops[0])
        self.data = np.frombuffer(self._data_map, np.uint8)
        self._words = self.data[: nbytes // 8 * 8].view("<u8")  # the kernel's view of the bytes
        if sys.byteorder != "little":  # pragma: no cover  (the kernel reads native words)
            self._words = self._words.astype(np.uint64)
        self.tokens = self.data.view(dtype)
        self._touched = 0.0

    # ------------------------------------------------------------------------------ reading
    @property
    def retired(self) -> bool:
        """True once an eviction chose this file: let go of it (:meth:`close`) and reopen."""
        return bool(self._retired[0])

    def forget_dropped(self) -> None:
        """After another process dropped pages (the header's ``drops`` count moved), forget
        the checks of every page not present now, so they are fetched again rather than
        served from a punched hole (one u32 read; O(npages) when the count moved)."""
        drops = int(self._drops[0])
        if drops != self._drops_seen:
            self._drops_seen = drops
            self.checked[self.state != 1] = 0

    def count_drop(self) -> None:
        """Record that pages were dropped (the caller holds the cache's lock and has marked
        them absent first)."""
        self._drops[0] = (int(self._drops[0]) + 1) & 0xFFFFFFFF
        self._drops_seen = int(self._drops[0])

    def pin_offset(self, p: int) -> int:
        """The byte of the state file, past its end, whose OFD lock pins page ``p`` (a shared
        lock: a window in use; an exclusive one: a window being dropped)."""
        return state_file_size(self.npages) + p

    def pin(self, fd: int, starts: list[int], stops: list[int], wait: float) -> bool:
        """Pin pages ``[starts[k], stops[k])`` (shared locks on their :meth:`pin_offset` bytes,
        held on ``fd`` until it is closed or unlocked): no process of the node drops them
        meanwhile.  A run being dropped now (an exclusive lock) is tried again 5 ms apart for at
        most ``wait`` seconds in all; returns False when some run stayed unpinned."""
        deadline = time.monotonic() + wait
        for p0, p1 in zip(starts, stops):
            while p1 > p0 and not lock_range(fd, fcntl.F_RDLCK, self.pin_offset(p0), p1 - p0):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
        return True

    @contextlib.contextmanager
    def unpinned(self, runs: list[tuple[int, int]]) -> Iterator[np.ndarray]:
        """The present pages of ``runs`` (``[(p0, p1), ...]``) that no process pins (int64,
        sorted, unique), held for the body by exclusive locks on their :meth:`pin_offset` bytes
        (so no pin is taken on them meanwhile: the body may drop them).  A run some page of
        which is pinned gives its other pages."""
        fd = open_lock_fd(self.state_path)
        try:
            free: list[np.ndarray] = []
            for p0, p1 in runs:
                if p1 > p0 and lock_range(fd, fcntl.F_WRLCK, self.pin_offset(p0), p1 - p0):
                    free.append(np.arange(p0, p1, dtype=np.int64))
                else:  # some page of it is pinned: the others
                    ks = [k for k in range(p0, p1)
                          if lock_range(fd, fcntl.F_WRLCK, self.pin_offset(k), 1)]  # fmt: skip
                    free.append(np.array(ks, dtype=np.int64))
            ids = np.unique(np.concatenate(free)) if free else np.zeros(0, np.int64)
            yield ids[self.state[ids] != 0]
        finally:
            close_lock_fd(fd)

    def touch(self) -> None:
        """Record a read (for the least-recently-used order), at most once a second."""
        now = time.time()
        if now - self._touched > 1.0:
            self._touched = now
            self._last_used[0] = now

    def serves(self, starts: np.ndarray, lengths: np.ndarray, itemsize: int) -> bool:
        """Whether every page that token ranges ``[starts, starts + lengths)`` (int64, (k,),
        of one length) touch is present and checked by this reader (a present page it has not
        checked yet answers False): whether the mapping may serve the ranges as they are (one
        kernel pass, ~1 us for 32 windows)."""
        return bool(all_pages_present(self.checked, starts, lengths, itemsize, self.shift))

    def present(self, ids: np.ndarray) -> np.ndarray:
        """bool, like ``ids``: which pages are present."""
        return self.state[ids] == 1

    def check(self, starts: np.ndarray, lengths: np.ndarray, itemsize: int) -> list[int]:
        """Check the present pages that token ranges ``[starts, starts + lengths)`` (int64,
        (k,), of one length) touch and this reader has not checked yet: their XXH64 against the
        recorded one (one kernel call, :func:`~mmpack._src.kernels.store.check_ranges`).  Marks
        the good ones checked; returns the bad ones, sorted (the caller drops them)."""
        bound = int(lengths.clip(0).sum()) * itemsize // self.page + 2 * lengths.shape[0]
        bad = np.empty(min(self.npages, bound), np.int64)
        n = check_ranges(
            self.data, self._words, self.state, self.digests, self.checked,
            starts, lengths, itemsize, self.shift, bad,
        )  # fmt: skip
        return sorted(bad[:n].tolist())

    def check_pages(self, ids: np.ndarray) -> list[int]:
        """:meth:`check` of whole pages ``ids`` (int64); returns the bad ones."""
        return self.check(ids << self.shift, np.full(ids.shape[0], self.page, np.int64), 1)

    def page_bytes(self, p: int) -> np.ndarray:
        """A view of page ``p``'s bytes in the mapping (meaningful only if present)."""
        return self.data[p << self.shift : min((p + 1) << self.shift, self.nbytes)]

    def charge(self, p: int) -> int:
        """Disk bytes page ``p`` occupies (its length rounded up to whole 4 KiB of disk)."""
        n = min(self.page, self.nbytes - (p << self.shift))
        return -(-n // 4096) * 4096

    # ------------------------------------------------------------------------------ writing
    def claim(self, ids: list[int]) -> Claim:
        """Lock the absent ones of sorted page ids ``ids`` that nobody else holds."""
        fd = open_lock_fd(self.state_path)
        mine: list[int] = []
        theirs: list[int] = []
        k = 0
        while k < len(ids):  # one lock call per run of adjacent pages
            j = k
            while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
                j += 1
            run = ids[k : j + 1]
            if lock_range(fd, fcntl.F_WRLCK, HEADER + run[0], len(run)):
                mine.extend(run)
            else:
                for p in run:
                    (mine if lock_range(fd, fcntl.F_WRLCK, HEADER + p, 1) else theirs).append(p)
            k = j + 1
        state = self.state
        return Claim(fd, [p for p in mine if not state[p]], [p for p in theirs if not state[p]])

    def write(self, p: int, data: bytes) -> None:
        """Store verified page ``p`` (claimed, its space charged; bytes past the object's end
        are not written): bytes first, then their digest, the state byte last; the page is
        checked for this reader."""
        self.write_run(p, memoryview(data)[: self.page])  # a padded last chunk is cut there

    def write_run(self, p0: int, data: Any, digests: np.ndarray | None = None) -> None:
        """Store the verified pages ``p0, p0 + 1, ...`` that ``data`` holds (whole pages; the
        object's last may end it) in one write, as :meth:`write` does one; ``digests`` (uint64,
        one per page) are their XXH64 digests where the caller has them."""
        mv = memoryview(data).cast("B")[: max(0, self.nbytes - (p0 << self.shift))]
        p1 = p0 - (-len(mv) >> self.shift)
        if digests is None:
            digests = stripe_digests(mv, self.page)
        if len(digests) != p1 - p0:
            raise ValueError(f"{len(digests)} digests for pages {p0}..{p1}")
        done = 0
        while done < len(mv):  # pwrite may write less than asked
            n = os.pwrite(self._fd_data, mv[done:], (p0 << self.shift) + done)
            if n <= 0:
                raise OSError(f"{self.data_path}: short write of pages {p0}..{p1}")
            done += n
        self.digests[p0:p1] = digests
        self.state[p0:p1] = 1
        self.checked[p0:p1] = 1

    def drop(self, p: int) -> int:
        """Mark page ``p`` absent and free its disk space; returns the bytes freed (0 where the
        file system cannot punch holes: the space then stays allocated and counted)."""
        return self.drop_run(p, p + 1)

    def drop_run(self, p0: int, p1: int) -> int:
        """:meth:`drop` of pages ``[p0, p1)`` with one hole punched for the run."""
        self.state[p0:p1] = 0
        self.checked[p0:p1] = 0
        if _FALLOCATE is None or p1 <= p0:
            return 0
        lo = p0 << self.shift
        if _FALLOCATE(self._fd_data, _PUNCH_HOLE, lo, min(p1 << self.shift, self.nbytes) - lo):
            return 0
        # every page but the object's last is whole: they are charged alike
        return (p1 - p0 - 1) * self.charge(p0) + self.charge(p1 - 1)

    def add_counted(self, delta: int) -> None:
        """Change the bytes charged to this file (the caller holds the cache's lock)."""
        self._counted[0] = max(0, int(self._counted[0]) + delta)

    def __del__(self) -> None:
        self.close()

    def close(self, _close: Any = os.close) -> None:
        """Close the descriptors (called when the last reference goes: a thread still writing
        keeps the object alive; ``os.close`` is bound early, so this also runs while the
        interpreter shuts down).  The shared locks live on in the mappings' own descriptors
        until no array views them."""
        for fd in (getattr(self, "_fd_state", -1), getattr(self, "_fd_data", -1)):
            if fd >= 0:
                try:
                    _close(fd)
                except OSError:
                    pass
        self._fd_state = self._fd_data = -1
