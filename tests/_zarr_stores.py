"""Small Zarr stores for the tests: a random corpus and small inner chunks and shards
(monkeypatched), so that few tokens make many shards."""

from __future__ import annotations

import numpy as np
import pytest

import mmpack._src.store.backends._zarr as zarr_backend
import mmpack._src.store.backends._zarr_shards as shards


def _corpus(seed: int, n_docs: int = 120, high: int = 60000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(4.5, 1.2, size=n_docs).astype(int), 0)
    return [rng.integers(0, high, size=n) for n in lens]


def _small(mp: pytest.MonkeyPatch, inner: int = 512, shard: int = 16 << 10, zstd: int = 0) -> None:
    mp.setattr(shards, "INNER_CHUNK_BYTES", inner)
    mp.setattr(shards, "SHARD_BYTES", shard)
    mp.setattr(zarr_backend, "ZSTD_LEVEL", zstd)
