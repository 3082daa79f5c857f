"""The Zarr chunk cache: a bounded LRU, its limit from the environment."""

from __future__ import annotations

import numpy as np
import pytest


def test_chunk_cache_is_bounded_lru():
    from mmpack._src.store.backends._chunk_cache import ChunkCache

    cache = ChunkCache(100)
    arr = {i: (np.full(10, i, np.int32), i) for i in range(5)}  # 40 bytes each
    cache.put_many("s", {0: arr[0], 1: arr[1]})
    assert sorted(cache.get_many("s", [1, 0, 7])) == [0, 1]  # 0 is now the most recent
    cache.put_many("s", {2: arr[2]})  # 120 bytes > 100: evicts 1, the least recently used
    assert sorted(cache.get_many("s", range(5))) == [0, 2] and cache.nbytes == 80
    cache.put_many("s", {9: (np.zeros(200, np.uint8), None)})  # larger than the bound: not kept
    assert 9 not in cache.get_many("s", [9]) and cache.nbytes <= 100
    assert cache.get_many("other", [0]) == {}  # keys are per store
    with pytest.raises(ValueError, match="limit_bytes"):
        ChunkCache(-1)


def test_chunk_cache_limit_from_environment(monkeypatch):
    from mmpack._src.store.backends import _chunk_cache

    monkeypatch.setenv("MMPACK_ZARR_CACHE_MB", "3")
    assert _chunk_cache._limit_from_env() == 3 << 20
    monkeypatch.setenv("MMPACK_ZARR_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="MMPACK_ZARR_CACHE_MB='lots'"):
        _chunk_cache._limit_from_env()
    monkeypatch.setenv("MMPACK_ZARR_CACHE_MB", "0")
    cache = _chunk_cache.ChunkCache(_chunk_cache._limit_from_env())
    cache.put_many("s", {0: (np.zeros(1, np.uint8), None)})
    assert len(cache) == 0
