"""What the two remote backends share: :class:`~mmpack.remote.backend.RemoteBackend`
(memmap objects) and :class:`~mmpack.remote.zarr.RemoteZarrBackend` (sharded Zarr).

Each holds per-process state (threads, locks, the mapping of its node-cache file) that a forked
child rebuilds (:meth:`RemoteBase._here`), maps its node-cache file on first use (let go once it
is retired by an eviction, retried a second after an open that failed), is never pickled (the
:class:`~mmpack.store.reader.TokenStore` reopens its URL), and is read-only (remote stores are
written by :mod:`mmpack.remote.writer`).  Cost: one ``os.getpid()`` and an attribute read
per call of :meth:`RemoteBase._cache_file` once the file is mapped.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.remote.cache import BlockCache
from mmpack.remote.cachefile import CacheFile
from mmpack.store.format import StoreMeta

__all__ = ["RemoteBase"]


class RemoteBase:
    """A mixin of the remote backends (listed before :class:`~mmpack.store.backends.Backend`);
    the backend sets the attributes below, ``_init_process_state`` the per-process ones."""

    cache: BlockCache | None
    _pid: int
    _lock: threading.Lock
    _cf: CacheFile | None
    _cf_retry: float
    _offsets: np.ndarray

    def _init_process_state(self) -> None:
        raise NotImplementedError

    def _cache_file_spec(self) -> tuple[str, str, int, int, np.dtype] | None:
        """``BlockCache.open_file``'s arguments (fingerprint, object name, bytes, block bytes,
        dtype) for this store's tokens, or None where they cannot be cached."""
        raise NotImplementedError

    def _here(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's threads are not here
            self._init_process_state()

    def _cache_file(self) -> CacheFile | None:
        """The node cache's file of this store's tokens, mapped (None without a cache, or while
        it cannot be had: retried after a second)."""
        self._here()
        cf = self._cf
        if cf is not None and not cf.retired:
            return cf
        self._cf = None  # retired: let go (closed when the last thread using it is done)
        if self.cache is None or time.monotonic() < self._cf_retry:
            return None
        spec = self._cache_file_spec()
        if spec is None:
            return None
        with self._lock:
            if self._cf is None:
                self._cf = self.cache.open_file(*spec)
                if self._cf is None:
                    self._cf_retry = time.monotonic() + 1.0
            return self._cf

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} is not pickled; the TokenStore reopens its URL")

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        return None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        raise NotImplementedError("remote stores are written by mmpack.remote.writer")

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets
