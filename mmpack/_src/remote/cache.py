"""A bounded cache of verified remote pages on local disk, shared by every process of a node.

Layout under ``cache_dir``::

    pages/<fingerprint>-<object>-p<page bytes>.data    one sparse file per remote object
    pages/<fingerprint>-<object>-p<page bytes>.state   its header and per-page states
    pages/.lock                                        ``fcntl.flock``: creation, charging, eviction

(:mod:`mmpack._src.remote.cachefile` describes the two files.)  The fingerprint in the names means a
store rebuilt under the same URL never meets the old one's pages.  Accounting is exact, never
under: each file's header holds the disk bytes charged to it (its state file, a worst-case
extent-tree allowance, each stored page rounded up to whole 4 KiB of disk, charged before it is
written); a charge past ``limit`` first evicts, and what still does not fit is served from
memory.  The lock is never waited for without a bound: a backoff for at most
:data:`LOCK_WAIT_SECONDS`, past which (a holder stopped) this process warns once and reads
around the cache until the lock is free; any ``OSError`` of the cache (a full disk, a read-only
folder) is read around too, with one warning per folder and kind of fault (:func:`warn_once`).
A file of the wrong size is discarded when opened.  Eviction: whole files, least recently used
first, skipping files read in the last :data:`ACTIVE_SECONDS`; a victim is marked ``retired``
and deleted once no process maps it (an exclusive lock on byte 0 of both files succeeds).

Cost: a charge or an eviction scans the few files' headers under the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mmpack._src.remote.cachefile import (
    HEADER,
    CacheFile,
    DamagedCacheFile,
    boot_id,
    close_lock_fd,
    id_runs,
    lock_range,
    open_lock_fd,
    pack_header,
    state_file_size,
    unpack_header,
)
from mmpack.errors import FormatError

__all__ = ["ACTIVE_SECONDS", "CacheLockTimeout", "LOCK_WAIT_SECONDS", "PageCache", "warn_once"]

ACTIVE_SECONDS = 10.0
"""A cached object read this recently is never evicted."""

LOCK_WAIT_SECONDS = 10.0
"""The longest a process waits for the cache's lock (held for milliseconds by a running
process); past it the holder is taken as stopped and the cache is read around."""

_BOOT = boot_id()
_STUCK: set[str] = set()
"""Lock files found held past :data:`LOCK_WAIT_SECONDS` by this process: tried without waiting
until they are free."""
_WARNED: set[tuple[str, str]] = set()
_THREAD_LOCKS: dict[str, threading.Lock] = {}
"""One mutex per lock file for the threads of this process: they queue on it rather than poll
the ``flock`` (only one of them polls while another process holds it); a forked child starts
with none (a parent thread may hold one across the fork)."""
_THREAD_LOCKS_GUARD = threading.Lock()


def _reset_thread_locks() -> None:
    global _THREAD_LOCKS_GUARD
    _THREAD_LOCKS.clear()
    _THREAD_LOCKS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_reset_thread_locks)


@dataclass(slots=True)
class _Charge:
    """Pages charged (``pages``) and written (``written``) by one :meth:`PageCache._charged`."""

    pages: int = 0
    written: int = 0


class CacheLockTimeout(TimeoutError):
    """The cache's lock was held by another process past :data:`LOCK_WAIT_SECONDS`."""


def warn_once(root: Path, exc: OSError) -> None:
    """Warn that the node cache under ``root`` is read around because of ``exc``: once per
    process, cache folder and kind of fault (the lock, or the disk)."""
    kind = "lock" if isinstance(exc, CacheLockTimeout) else "disk"
    if (str(root), kind) in _WARNED:
        return
    _WARNED.add((str(root), kind))
    if kind == "lock":
        text = (
            f"{exc.strerror}: another process holds it (stopped or paused?); reading around the "
            "cache (pages fetched and served from memory) until it is free"
        )
    else:
        what = exc.strerror or str(exc)
        text = f"cannot write under {root} ({what}): serving from memory (pages fetched, not kept)"
    warnings.warn(f"mmpack node cache: {text}", stacklevel=3)


T = TypeVar("T")


class PageCache:
    """Verified pages of remote objects on disk, total at most ``limit`` bytes."""

    def __init__(self, root: Path, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache_limit must be a non-negative integer (bytes), got {limit!r}")
        self.cache_dir = Path(root)
        self.root = self.cache_dir / "pages"  # created by the first open_file
        self.limit = limit

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the cache's lock; :class:`CacheLockTimeout` past :data:`LOCK_WAIT_SECONDS` (at
        once while this process finds it stuck)."""
        path = str(self.root / ".lock")
        with _THREAD_LOCKS_GUARD:
            mutex = _THREAD_LOCKS.setdefault(path, threading.Lock())
        if not mutex.acquire(timeout=0.0 if path in _STUCK else LOCK_WAIT_SECONDS):
            _STUCK.add(path)
            raise CacheLockTimeout(
                errno.ETIMEDOUT, f"{path} held for over {LOCK_WAIT_SECONDS:g} s in this process"
            )
        try:
            fd = open_lock_fd(path, os.O_RDWR | os.O_CREAT)  # no child forked meanwhile keeps it
            try:
                _lock_bounded(fd, path)
                yield
            finally:
                close_lock_fd(fd)
        finally:
            mutex.release()

    # ------------------------------------------------------------------------------ counting
    def _headers(self) -> list[tuple[Path, tuple | None]]:
        out: list[tuple[Path, tuple | None]] = []
        if not self.root.is_dir():
            return out
        for entry in os.scandir(self.root):
            if entry.name.endswith(".state"):
                try:
                    with open(entry.path, "rb") as f:
                        out.append((Path(entry.path), unpack_header(f.read(HEADER))))
                except OSError:
                    continue
        return out

    def usage(self) -> int:
        """Bytes charged to the cached files now (the sum the limit bounds)."""
        return sum(h[2] for _, h in self._headers() if h is not None)

    def allocated(self) -> int:
        """Disk bytes the cache's files occupy now (``st_blocks``)."""
        total = 0
        if not self.root.is_dir():
            return total
        for entry in os.scandir(self.root):
            with contextlib.suppress(OSError):
                total += entry.stat().st_blocks * 512
        return total

    @staticmethod
    def base_charge(npages: int) -> int:
        """Bytes charged when an object's files are created (see the module docstring)."""
        return -(-state_file_size(npages) // 4096) * 4096 + (npages // 340 + 1) * 4096

    # ------------------------------------------------------------------------------ opening
    def open_file(
        self, fingerprint: str, name: str, nbytes: int, page: int, dtype: np.dtype
    ) -> CacheFile | None:
        """The cached object ``name`` of store ``fingerprint``, mapped (created empty if absent,
        or if its files are damaged or from another boot); None when it cannot be had now (no
        room, or being evicted).  ``OSError`` when the cache cannot be used: its folder or files
        cannot be written (:class:`CacheLockTimeout`: its lock is held by a stopped process)."""
        if self.limit == 0 or nbytes <= 0:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        stem = self.root / f"{fingerprint}-{name}-p{page}"
        with self._locked():
            if stem.with_suffix(".state").exists():
                header = _read_header(stem.with_suffix(".state"))
                other_boot = header is not None and header[5] != _BOOT  # nobody can map it
                usable = header is not None and header[1] == nbytes and not header[4]
                if usable and not other_boot and stem.with_suffix(".data").exists():
                    try:
                        return _open(stem, nbytes, page, dtype)
                    except DamagedCacheFile:  # truncated or extended: useless to everyone
                        _retire(stem.with_suffix(".state"))
                        other_boot = True
                if not self._remove(stem, force=other_boot):
                    return None  # retired but still mapped somewhere
            return self._create(stem, nbytes, page, dtype)

    def _create(self, stem: Path, nbytes: int, page: int, dtype: np.dtype) -> CacheFile | None:
        """Create an object's empty files (under the lock); None where the limit has no room."""
        for entry in os.scandir(self.root):  # creation runs under the lock: a leftover is stale
            if ".tmp" in entry.name:
                Path(entry.path).unlink(missing_ok=True)
        npages = -(-nbytes // page)
        charge = self.base_charge(npages)
        state = stem.with_suffix(".state")
        if self._make_room(charge, keep=state) + charge > self.limit:
            return None
        data = stem.with_suffix(".data")
        tmp = stem.with_suffix(f".tmp{os.getpid()}")
        data.unlink(missing_ok=True)  # an unmapped leftover (no state file names it)
        try:
            fd = os.open(data, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                os.ftruncate(fd, nbytes)
            finally:
                os.close(fd)
            with open(tmp, "wb") as f:  # written whole: the mapping never meets a hole
                f.write(pack_header(page, nbytes, charge, _BOOT))
                f.write(bytes(state_file_size(npages) - HEADER))
            os.replace(tmp, state)
        except OSError:
            tmp.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            raise
        return _open(stem, nbytes, page, dtype)

    # ------------------------------------------------------------------------------ charging
    def charge(self, cf: CacheFile, sizes: list[int]) -> int:
        """Charge the first pages of ``sizes`` (bytes each) that fit to ``cf``, evicting other
        files first if needed; returns how many were charged."""
        if not sizes:
            return 0
        with self._locked():
            total = self._make_room(sum(sizes), keep=cf.state_path)
            room = self.limit - total
            k = 0
            while k < len(sizes) and sizes[k] <= room:
                room -= sizes[k]
                k += 1
            if k:
                cf.add_counted(sum(sizes[:k]))
            return k

    def refund(self, cf: CacheFile, nbytes: int) -> None:
        """Give back a charge whose page was not written (or whose space was freed); where the
        lock cannot be had the charge stays (an over-count until the file is evicted)."""
        if nbytes:
            try:
                with self._locked():
                    cf.add_counted(-nbytes)
            except OSError as exc:
                warn_once(self.cache_dir, exc)

    # ------------------------------------------------------------------------------ storing
    @contextlib.contextmanager
    def _charged(self, cf: CacheFile, sizes: list[int]) -> Iterator[_Charge]:
        """Charge the first pages of ``sizes`` that fit (:meth:`charge`) for the body to write
        the first ``charge.pages`` of them, counting each written in ``charge.written``; on
        exit the charge of those not written is given back.  An ``OSError`` (a stuck lock: none
        charged; a full or failing disk: the body stops there) is warned of once and swallowed:
        the caller serves the rest from memory."""
        try:
            charge = _Charge(self.charge(cf, sizes))
        except OSError as exc:
            warn_once(self.cache_dir, exc)
            charge = _Charge()
        try:
            yield charge
        except OSError as exc:
            warn_once(self.cache_dir, exc)
        finally:
            self.refund(cf, sum(sizes[charge.written : charge.pages]))

    def store(self, cf: CacheFile, pages: Mapping[int, Any]) -> list[int]:
        """Write verified ``pages`` (bytes or memoryviews, or arrays written as their bytes;
        claimed by the caller) into ``cf`` in page order as far as the limit allows; returns
        the ids not written (no room, or a full or failing disk: the caller serves them from
        memory)."""
        ids = sorted(pages)
        with self._charged(cf, [cf.charge(b) for b in ids]) as charge:
            for b in ids[: charge.pages]:
                data = pages[b]
                if not isinstance(data, (bytes, memoryview)):
                    data = np.ascontiguousarray(data).tobytes()
                cf.write(b, data)
                charge.written += 1
        return ids[charge.written :]

    def store_run(
        self, cf: CacheFile, b0: int, data: Any, digests: np.ndarray | None = None
    ) -> int:
        """:meth:`store` of the verified pages ``b0, b0 + 1, ...`` that ``data`` holds (whole
        pages, claimed by the caller; ``digests`` their XXH64 digests where known) in one
        write, as far as the limit allows; returns how many were written (the rest: no room,
        or a full or failing disk)."""
        npages = -(-min(len(data), cf.nbytes - (b0 << cf.shift)) // cf.page)
        if npages <= 0:
            return 0
        # every page but the object's last is whole: they are charged alike
        sizes = [cf.charge(b0)] * (npages - 1) + [cf.charge(b0 + npages - 1)]
        with self._charged(cf, sizes) as charge:
            k = charge.pages
            if k:
                cf.write_run(
                    b0, memoryview(data)[: k * cf.page], None if digests is None else digests[:k]
                )
                charge.written = k
        return charge.written

    def fetch_shared(
        self,
        cf: CacheFile,
        ids: list[int],
        fetch: Callable[[list[int]], dict[int, T]],
        timeout: float,
    ) -> tuple[dict[int, T], list[int]]:
        """Fetch the absent pages ``ids`` (sorted) into ``cf``, shared with every process of the
        node: the pages this process claims are fetched here (``fetch(ids)`` returns them
        verified, and maybe pages around them, which are stored where nobody holds them); those
        another process holds are polled until they land, claimed here once their claim is
        released unfinished, and fetched here after ``timeout`` seconds (a stuck claim; such a page
        is fetched at once by later calls while that claim stays: ``cf.stuck``).

        Returns
        -------
        fetched : dict
            Every page fetched here.
        unstored : list of int
            The ids of ``fetched`` not kept in ``cf``; every other id of ``ids`` is in ``cf``.
        """
        fetched: dict[int, T] = {}
        unstored: list[int] = []
        todo = ids
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while todo:
            claim = cf.claim(todo)
            try:
                if claim.mine:
                    got = fetch(claim.mine)
                    fetched.update(got)
                    unstored += self.store(cf, {b: got[b] for b in claim.mine})
                    extra = sorted(set(got).difference(claim.mine))
                    if extra:  # pages that filled a merge gap: cached where nobody holds them
                        unstored += self._store_unclaimed(cf, {b: got[b] for b in extra})
            finally:
                claim.close()
            cf.stuck.difference_update(claim.mine)
            todo = [b for b in claim.theirs if not cf.state[b]]
            if todo and time.monotonic() > deadline:  # a stuck claim: fetch them here
                cf.stuck.update(todo)
            now = [b for b in todo if b in cf.stuck]
            if now:  # held by a claim that outlived a wait: fetched here, not stored
                got = fetch(now)
                fetched.update(got)
                unstored += list(got)
                todo = [b for b in todo if b not in cf.stuck]
            if todo:
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
        return fetched, unstored

    def _store_unclaimed(self, cf: CacheFile, pages: dict[int, Any]) -> list[int]:
        """:meth:`store` of the ``pages`` nobody claims now; returns the ids not stored."""
        claim = cf.claim(sorted(pages))
        try:
            rest = self.store(cf, {b: pages[b] for b in claim.mine})
        finally:
            claim.close()
        mine = set(claim.mine)
        return sorted(rest + [b for b in pages if b not in mine])

    def drop_pages(self, cf: CacheFile, ids: np.ndarray) -> int:
        """Drop present pages ``ids`` (int64, sorted, unique) of ``cf`` (nobody may read them:
        the caller holds their pins exclusively), one hole per run of adjacent ids, give back
        their charge and count the drop in the header, so other readers forget them; returns
        how many were dropped."""
        if not len(ids):
            return 0
        starts, stops = id_runs(ids)
        with self._locked():
            cf.add_counted(-sum(cf.drop_run(a, b) for a, b in zip(starts, stops)))
            cf.count_drop()
        return len(ids)

    def drop_bad(self, cf: CacheFile, bad: list[int], url: str) -> None:
        """Drop pages ``bad`` of ``cf`` (found changed on disk by :meth:`CacheFile.check`), with
        a warning, so the caller fetches them again."""
        if bad:
            self.refund(cf, sum(cf.drop(b) for b in bad))
            warnings.warn(
                f"mmpack node cache: page(s) {bad[:5]} of {url} in {cf.data_path} fail their "
                "checksum (changed on disk); dropped, fetched again",
                stacklevel=4,
            )

    def verify_cached(self, cf: CacheFile, start: int, data: bytes, url: str) -> None:
        """Compare ``cf``'s present pages lying wholly in bytes ``[start, start + len(data))``
        with the verified object bytes ``data``; a differing page (local disk corruption after
        this or any reader checked it) is dropped, then reported as a
        :class:`~mmpack.errors.FormatError` naming the cache file."""
        if not data:
            return
        first = -(-start // cf.page)
        last = (start + len(data)) // cf.page  # exclusive; the object's short tail page too
        if start + len(data) == cf.nbytes:
            last = cf.npages
        ids = np.arange(first, max(first, last), dtype=np.int64)
        raw = np.frombuffer(data, np.uint8)
        bad = []
        for b in ids[cf.present(ids)].tolist():
            lo = b * cf.page - start
            if not np.array_equal(cf.page_bytes(b), raw[lo : lo + cf.page]):
                bad.append(b)
        if bad:
            self.refund(cf, sum(cf.drop(b) for b in bad))
            raise FormatError(
                f"{cf.data_path}: node-cache page(s) {bad[:5]} of {url} differ from the "
                "verified object (local disk corruption); dropped, they will be fetched again"
            )

    # ------------------------------------------------------------------------------ eviction
    def _make_room(self, need: int, keep: Path) -> int:
        """Evict files other than ``keep`` until ``need`` more bytes fit (or nothing more can
        go); returns the total charged afterwards."""
        headers = self._headers()
        total = sum(h[2] for _, h in headers if h is not None)
        if total + need <= self.limit:
            return total
        now = time.time()
        victims = sorted(
            ((h[3] if h is not None else 0.0), p)
            for p, h in headers
            if p != keep and (h is None or h[4] or now - h[3] >= ACTIVE_SECONDS)
        )
        for _, path in victims:
            if total + need <= self.limit:
                break
            header = _read_header(path)
            _retire(path)  # readers let go at their next read
            if self._remove(path.with_suffix(""), force=False) and header is not None:
                total -= header[2]
        return total

    def _remove(self, stem: Path, force: bool) -> bool:
        """Delete an object's files if nobody maps them (or ``force``: a file of another boot)."""
        fds = []
        try:
            for suffix in (".state", ".data"):
                try:
                    fd = open_lock_fd(stem.with_suffix(suffix))
                except FileNotFoundError:
                    continue
                fds.append(fd)
                if not force and not lock_range(fd, fcntl.F_WRLCK, 0, 1):
                    return False
            for suffix in (".data", ".state"):
                stem.with_suffix(suffix).unlink(missing_ok=True)
            return True
        finally:
            for fd in fds:
                close_lock_fd(fd)


def _lock_bounded(fd: int, path: str) -> None:
    """``flock(fd, LOCK_EX)`` waiting at most :data:`LOCK_WAIT_SECONDS` (not at all while
    ``path`` is stuck)."""
    deadline = time.monotonic() + (0.0 if path in _STUCK else LOCK_WAIT_SECONDS)
    delay = 0.0001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                _STUCK.add(path)
                raise CacheLockTimeout(
                    errno.ETIMEDOUT, f"{path} held for over {LOCK_WAIT_SECONDS:g} s"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        else:
            _STUCK.discard(path)
            return


def _retire(state: Path) -> None:
    """Mark a state file retired (its readers let go at their next read), if it can be."""
    with contextlib.suppress(OSError):
        with open(state, "r+b") as f:
            f.seek(40)
            f.write(b"\x01")


def _read_header(path: Path) -> tuple | None:
    try:
        with open(path, "rb") as f:
            return unpack_header(f.read(HEADER))
    except OSError:
        return None


def _open(stem: Path, nbytes: int, page: int, dtype: np.dtype) -> CacheFile | None:
    """The mapped object; None while it is being evicted (``DamagedCacheFile`` passes)."""
    try:
        return CacheFile(stem, nbytes, page, dtype)
    except DamagedCacheFile:
        raise
    except OSError:
        return None
