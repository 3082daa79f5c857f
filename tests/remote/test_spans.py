"""Specification of :mod:`mmpack._src.remote.spans`: :class:`SpanFetcher` against a real S3
server (SeaweedFS, ``tests/_s3.py``): a corrupt part of a memmap or Zarr store is caught by the
checksum and fetched again (bad twice, a FormatError and nothing stored); a drop under a stuck
cache lock keeps the pages.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/remote/test_spans.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _block_fetch import block_stores, open_cached, zarr_block_store
from _s3 import isolate_cache_and_env

from mmpack._src.remote.spans import SpanFetcher
from mmpack.errors import FormatError


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def stores(s3_server, tmp_path_factory):
    return block_stores(s3_server, tmp_path_factory)


@pytest.fixture(scope="module")
def zarr_store(s3_server, stores):
    return zarr_block_store(s3_server)


def test_a_corrupt_part_is_fetched_again(stores, s3_server, tmp_path, monkeypatch):
    remote, local = stores
    store = open_cached(remote, s3_server.options, tmp_path)
    spans: SpanFetcher = store.span_fetcher
    transport = spans.fetcher.transport
    real = type(transport).get_ranges
    bad = {"left": 1}

    def flaky(self, key, ranges):
        out = real(self, key, ranges)
        if bad["left"] and key.endswith("tokens.bin"):
            bad["left"] -= 1
            out[0] = bytes([out[0][0] ^ 0xFF]) + out[0][1:]
        return out

    monkeypatch.setattr(type(transport), "get_ranges", flaky)
    spans.fetch([(0, 20_000)])
    assert spans.stats["refetched"] == 1
    np.testing.assert_array_equal(store.read_range(0, 20_000), local.read_range(0, 20_000))
    bad["left"] = 2  # bad twice: never served
    spans.drop([(0, 20_000)])
    with pytest.raises(FormatError, match="checksum"):
        spans.fetch([(0, 20_000)])


def test_a_corrupt_zarr_part_is_fetched_again(zarr_store, stores, s3_server, tmp_path, monkeypatch):
    """A span part of a remote Zarr store whose chunk fails its crc32c is fetched once more;
    bad twice, a FormatError and nothing stored."""
    local = stores[1]
    store = open_cached(zarr_store, s3_server.options, tmp_path)
    spans: SpanFetcher = store.span_fetcher
    source = store._backend.source
    source.reader.indexes(list(range(store._backend._layout.num_shards)))  # indexes first
    transport = spans.fetcher.transport
    real = type(transport).get_ranges
    bad = {"left": 1}

    def flaky(self, key, ranges):
        out = real(self, key, ranges)
        size = source.objects.get(key[len(source.data) :], 0)
        if bad["left"] and "/tokens/" in key and ranges[0][1] < size:  # a chunk, not an index
            bad["left"] -= 1
            out[0] = bytes([out[0][0] ^ 0xFF]) + out[0][1:]
        return out

    monkeypatch.setattr(type(transport), "get_ranges", flaky)
    spans.fetch([(0, 20_000)])
    assert spans.stats["refetched"] >= 1
    np.testing.assert_array_equal(store.read_range(0, 20_000), local.read_range(0, 20_000))
    bad["left"] = 1 << 20  # every chunk response bad (so each is bad twice): never served
    spans.drop([(0, 20_000)])
    cf = spans.cache
    b0, b1 = spans.page_range(0, 20_000)
    with pytest.raises(FormatError, match="checksum"):
        spans.fetch([(0, 20_000)])
    assert not cf.state[b0:b1].any()


def test_a_drop_under_a_stuck_cache_lock_keeps_the_pages(stores, s3_server, tmp_path, monkeypatch):
    """A process stopped while it holds the cache's lock: a drop waits the lock's bound, warns
    once and keeps the blocks (they stay readable and are dropped by a later drop)."""
    import warnings

    from _remote_stores import hold_cache_lock

    from mmpack._src.remote import cache as cache_mod

    monkeypatch.setattr(cache_mod, "LOCK_WAIT_SECONDS", 0.3)
    remote, local = stores
    store = open_cached(remote, s3_server.options, tmp_path)
    spans: SpanFetcher = store.span_fetcher
    spans.fetch([(0, 20_000)])
    with hold_cache_lock(tmp_path):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            assert spans.drop([(0, 20_000)]) == 0
        assert any("lock" in str(w.message) for w in rec), [str(w.message) for w in rec]
        np.testing.assert_array_equal(store.read_range(0, 20_000), local.read_range(0, 20_000))
    assert spans.drop([(0, 20_000)]) > 0
