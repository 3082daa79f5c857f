"""A bounded, thread-safe, per-process LRU of decoded Zarr chunks (used by the Zarr backend).

Keys are ``(store key, chunk id)``; the store key names one store's content (its path and the
bytes of its ``zarr.json``, which hold the fingerprint), so backends opened on the same store share
their chunks and a rebuilt store never sees the old one's.  Values are read-only 1-D numpy arrays with a tag (the chunk file's signature);
the bound is on their total ``nbytes`` (``MMPACK_ZARR_CACHE_MB``, default 256 MiB per process).
After a fork the child keeps the parent's entries (copy-on-write) with a new lock.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

DEFAULT_CACHE_BYTES = 256 << 20


def _limit_from_env() -> int:
    raw = os.environ.get("MMPACK_ZARR_CACHE_MB")
    if raw is None or raw == "":
        return DEFAULT_CACHE_BYTES
    try:
        mb = int(raw)
    except ValueError:
        raise ValueError(
            f"MMPACK_ZARR_CACHE_MB={raw!r} is not an integer number of MiB (0 disables the cache)"
        ) from None
    if mb < 0:
        raise ValueError(f"MMPACK_ZARR_CACHE_MB={raw!r} must be >= 0 (0 disables the cache)")
    return mb << 20


class ChunkCache:
    """LRU of decoded chunks bounded by total bytes.

    Parameters
    ----------
    limit_bytes : int
        Most bytes held; an entry larger than the limit is never kept.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes={limit_bytes!r} must be >= 0")
        self.limit_bytes = int(limit_bytes)
        self.nbytes = 0
        self._items: OrderedDict[Hashable, tuple[np.ndarray, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def get_many(self, store: Hashable, ids: Iterable[int]) -> dict[int, tuple[np.ndarray, Any]]:
        """The cached ``(chunk, tag)`` entries among ``ids`` (marked most recently used)."""
        out: dict[int, tuple[np.ndarray, Any]] = {}
        items = self._items
        with self._lock:
            for c in ids:
                key = (store, c)
                arr = items.get(key)
                if arr is not None:
                    items.move_to_end(key)
                    out[c] = arr
        return out

    def put_many(self, store: Hashable, chunks: dict[int, tuple[np.ndarray, Any]]) -> None:
        """Insert ``(chunk, tag)`` entries (read-only arrays and a caller's tag, e.g. the file's
        signature), evicting the least recently used as needed."""
        items = self._items
        with self._lock:
            for c, entry in chunks.items():
                size = int(entry[0].nbytes)
                if size > self.limit_bytes:
                    continue
                key = (store, c)
                old = items.pop(key, None)
                if old is not None:
                    self.nbytes -= int(old[0].nbytes)
                while self.nbytes + size > self.limit_bytes and items:
                    _, evicted = items.popitem(last=False)
                    self.nbytes -= int(evicted[0].nbytes)
                items[key] = entry
                self.nbytes += size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)


_CACHE: ChunkCache | None = None
_CACHE_LOCK = threading.Lock()


def get_cache() -> ChunkCache:
    """The process's cache, created on first use (so a bad ``MMPACK_ZARR_CACHE_MB`` is a
    ``ValueError`` at the first Zarr batch read, not at import)."""
    global _CACHE
    if _CACHE is None:
        with _CACHE_LOCK:
            if _CACHE is None:
                cache = ChunkCache(_limit_from_env())
                if hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=cache._after_fork)
                _CACHE = cache
    return _CACHE
