"""Batched reads of the unsharded Zarr layout (``tokens`` in plain chunks of 2**18 tokens,
Zarr's default zstd, no per-chunk checksum; the sharded layout of
:mod:`~mmpack.store.backends._zarr_shards` is what builds write).

Chunks are read through a per-process LRU of decoded chunks
(:mod:`mmpack.store.backends._chunk_cache`): numpy finds the chunk ids a batch touches, the cached
ones are taken as they are, the missing ones are read whole with one concurrent call on Zarr's
event loop (``AsyncArray.getitem`` per chunk under ``asyncio.gather``), decoded once and cached.
Every chunk is checked to exist now as a non-empty regular file (one ``stat`` each: Zarr reads a
missing one as zeros), and a cached chunk is used only while its file keeps the (inode, size,
mtime) it had when decoded.  Cost (``python -m benchmarks.bench_window --quick --zarr`` with the
unsharded layout): ~0.4 of memmap with every chunk cached, ~0.02 when the store does not fit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError
from mmpack.store.backends._chunk_cache import get_cache

__all__ = ["LegacyChunkReads"]


def _corrupt(path: Path, what: str, exc: BaseException) -> FormatError:
    """The error for a Zarr read that failed inside zarr/numcodecs (bad JSON, a chunk that does
    not decode): corruption, reported as such instead of as a codec's internal error."""
    return FormatError(
        f"{path}: cannot read {what} ({type(exc).__name__}: {exc}): the Zarr store is corrupt; "
        "rebuild it"
    )


class LegacyChunkReads:
    """Mixin of :class:`~mmpack.store.backends._zarr.ZarrBackend`: ``_chunks`` for legacy
    stores (the attributes it uses are the backend's)."""

    path: Path
    meta: Any
    chunk_tokens: int
    _tokens: Any
    _cache_key: Any
    _chunk_paths: list[str]

    def _check_unchanged(self) -> None:
        raise NotImplementedError

    def _check_unchanged_fast(self) -> None:
        raise NotImplementedError

    def _check_chunks(self, name: str, arr: Any, first: int, stop: int) -> None:
        raise NotImplementedError

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
