"""One remote object's pages in the node cache, as one reader in one process sees them.

:class:`CachedObject` owns this reader's mapping of the object's cache file
(:class:`~mmpack._src.remote.cachefile.CacheFile`, made by
:meth:`~mmpack._src.remote.cache.PageCache.open_file`): it maps the file on first use, lets it go
once an eviction retires it, retries a second after an attempt that got nothing (no room, being
evicted, the lock stuck, the disk full; :func:`~mmpack._src.remote.cache.warn_once` has warned), and
maps it anew in a forked child (the parent's threads and claims are not there).  Every page it
serves from the mapping is checked first, once per reader (:meth:`CacheFile.check`): a page
whose bytes changed on disk is dropped with a warning and reported absent, so the caller
fetches it again.  A reader copies pages out of the mapping only while it pins them
(:meth:`CachedObject.pinned`): another process's drop (:mod:`mmpack._src.remote.spans`) punches its
holes only in pages nobody pins, so a reader never copies a punched hole (zeros).

Cost: :meth:`CachedObject.file` is one ``os.getpid()`` and two attribute reads once the file is
mapped; :meth:`CachedObject.serves` adds one kernel pass over the ranges (~1 us for 32
windows), and the first time a page is served one XXH64 of it (~5 us per 16 KiB);
:meth:`CachedObject.pinned` one descriptor opened and closed and one ``fcntl`` per run of
adjacent pages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np

from mmpack._src.core.process import PerProcess
from mmpack._src.remote.cache import PageCache, warn_once
from mmpack._src.remote.cachefile import (
    PIN_WAIT_SECONDS,
    CacheFile,
    close_lock_fd,
    id_runs,
    open_lock_fd,
)

__all__ = ["CachedObject", "copied"]

_RETRY_SECONDS = 1.0
"""How long a reader that could not map its cache file goes without trying again."""

T = TypeVar("T")


class _Mapping:
    """A :class:`CachedObject`'s mapping in one process (:class:`~mmpack._src.core.process.PerProcess`):
    the cache file mapped (None: none), and when to try again after a failed attempt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cf: CacheFile | None = None
        self.retry = 0.0


class CachedObject:
    """Object ``name`` of store ``fingerprint`` (``nbytes`` bytes of ``dtype`` items, in pages
    of ``page`` bytes, a power of 2) in ``cache``, for the reader of ``url``."""

    def __init__(
        self,
        cache: PageCache,
        fingerprint: str,
        name: str,
        nbytes: int,
        page: int,
        dtype: np.dtype,
        url: str,
    ) -> None:
        self.cache = cache
        self.url = url
        self._spec = (fingerprint, name, nbytes, page, np.dtype(dtype))
        self.page, self.itemsize = page, np.dtype(dtype).itemsize
        self._p = PerProcess(_Mapping)  # a new process: its own mapping and bitmap

    @property
    def mapped(self) -> CacheFile | None:
        """The mapping this reader holds now (None if none), without mapping or letting go."""
        return self._p.get().cf

    def file(self) -> CacheFile | None:
        """The object's cache file, mapped (None while it cannot be had: tried again after
        :data:`_RETRY_SECONDS`)."""
        p = self._p.get()
        cf = p.cf
        if cf is not None and not cf.retired:
            return cf
        p.cf = None  # retired: let go (closed when the last thread using it is done)
        if time.monotonic() < p.retry:
            return None
        with p.lock:
            if p.cf is None and time.monotonic() >= p.retry:
                try:
                    p.cf = self.cache.open_file(*self._spec)
                except OSError as exc:  # the disk, the folder or the lock: read around
                    warn_once(self.cache.cache_dir, exc)
                if p.cf is None:
                    p.retry = time.monotonic() + _RETRY_SECONDS
            return p.cf

    @contextlib.contextmanager
    def pinned(self, ids: np.ndarray) -> Iterator[CacheFile | None]:
        """Pin pages ``ids`` (int64, sorted, unique) for the body (:meth:`CacheFile.pin`, on a
        descriptor of this call's own): no process of the node drops them while the body reads
        them from the mapping, and a drop that ended before the pins were taken is seen (the
        pages it dropped are absent, fetched again).  Yields the mapping, or None where there
        is none or a drop held some page past :data:`PIN_WAIT_SECONDS` (then nothing may be
        read from the mapping)."""
        cf = self.file()
        if cf is None or not len(ids):
            yield cf
            return
        try:
            fd = open_lock_fd(cf.state_path)
        except OSError as exc:  # the file was removed under this reader, or no descriptor
            warn_once(self.cache.cache_dir, exc)
            yield None
            return
        try:
            yield cf if cf.pin(fd, *id_runs(ids), PIN_WAIT_SECONDS) else None
        finally:
            close_lock_fd(fd)

    def serves(self, starts: np.ndarray, lengths: np.ndarray) -> CacheFile | None:
        """The mapping, when every page the token ranges touch (int64, (k,)) is present and
        checked by this reader (present pages not checked yet are checked now); else None."""
        cf = self.file()
        if cf is None:
            return None
        cf.touch()
        cf.forget_dropped()
        if cf.serves(starts, lengths, self.itemsize):  # the hit path: one kernel pass
            return cf
        self.cache.drop_bad(cf, cf.check(starts, lengths, self.itemsize), self.url)
        return cf if cf.serves(starts, lengths, self.itemsize) else None

    def held(self, cf: CacheFile, ids: np.ndarray) -> np.ndarray:
        """bool, like ``ids`` (int64, each in ``[0, npages)``): which pages ``cf`` may serve
        (present and checked; those not checked yet are checked now, a bad one dropped)."""
        cf.forget_dropped()
        self.cache.drop_bad(cf, cf.check_pages(ids), self.url)
        return cf.checked[ids] == 1

    def fetch_shared(
        self,
        cf: CacheFile,
        ids: list[int],
        fetch: Callable[[list[int]], dict[int, T]],
        timeout: float,
    ) -> tuple[dict[int, T], list[int]]:
        """:meth:`PageCache.fetch_shared`; where the cache file cannot be claimed (it was
        removed as damaged under this reader, or a descriptor cannot be had) every page is
        fetched here and none stored."""
        raised: list[BaseException] = []

        def fetching(todo: list[int]) -> dict[int, T]:
            try:
                return fetch(todo)
            except BaseException as exc:  # the transport's errors are OSErrors too: theirs
                raised.append(exc)
                raise

        try:
            return self.cache.fetch_shared(cf, ids, fetching, timeout)
        except OSError as exc:
            if raised and exc is raised[-1]:
                raise
            if not cf.retired:
                warn_once(self.cache.cache_dir, exc)
            got = fetch(ids)
            return got, sorted(got)

    def verify(self, start: int, data: bytes) -> None:
        """:meth:`PageCache.verify_cached` of the object's bytes ``[start, start + len(data))``
        read from the server now (``verify()``)."""
        cf = self.file()
        if cf is not None:
            self.cache.verify_cached(cf, start, data, self.url)


def copied(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Token ranges ``[starts[k], starts[k] + lengths[k])`` (int64, (k,)) of ``src`` (a pinned
    mapping's tokens) copied back to back into a new array: what a reader serves from the node
    cache, never a view of it."""
    if not starts.shape[0]:
        return src[:0].copy()
    return np.concatenate(
        [src[a : a + n] for a, n in zip(starts.tolist(), lengths.clip(0).tolist())]
    )
