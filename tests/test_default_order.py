"""Defaults that follow the storage (``mmpack/_src/core/sample_order.py`` ``check_shuffle``,
``mmpack/_src/remote/opener.py`` ``node_cache``, ``mmpack/_src/torch/block_fetch.py``), against a real S3
server (SeaweedFS, ``tests/_s3.py``) behind the counting proxy and over ``file://`` stores: a
remote store opened without ``cache_limit`` gets a node cache of two windows where its cache
folder can be written (else none, one warning); ``mmpack.torch.loader(view)`` over it reads the
block-window order and fetches whole blocks, saying so once; an explicit ``shuffle=True`` is
honoured with one warning of its cost; subsets and mixtures of remote views resolve by the same
rule; local stores keep the global order, silently.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/test_default_order.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _remote_stores import _build_with_page, _corpus, _url
from _s3 import DelayProxy, isolate_cache_and_env

import mmpack
from mmpack import ResumableSampler
from mmpack._src.core.constants import FETCH_BLOCK_BYTES, NODE_CACHE_BYTES, WINDOW_BLOCKS
from mmpack.errors import DefaultOrderWarning, SlowReadWarning
from mmpack.torch import loader

SEQLEN = 64
BLOCK = 64 << 10  # bytes per sample block (view.block_bounds)
CHECK = 4096  # the store's check pages
W = 4  # blocks per window
PART = 16 << 10  # four parts per block


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def _recorded(make):
    """``make()``'s result and the messages of the mmpack warnings it raised, by category."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = make()
    kinds = (DefaultOrderWarning, SlowReadWarning)
    return out, {k: [str(w.message) for w in rec if issubclass(w.category, k)] for k in kinds}


def _view(store):
    return mmpack.WindowDataset(store, SEQLEN, eot=65535)


def test_two_windows_are_the_default_node_cache():
    assert NODE_CACHE_BYTES == 2 * WINDOW_BLOCKS * FETCH_BLOCK_BYTES == 2 << 30


def test_a_remote_loader_reads_whole_blocks_by_default_and_says_so_once(s3_server, tmp_path):
    docs = _corpus(n_docs=3000, seed=3)
    remote = _build_with_page(_url(), docs, s3_server.options, CHECK)
    local = mmpack.build(tmp_path / "local", docs)
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        options = dict(s3_server.options, endpoint=proxy.endpoint)
        store = mmpack.open(remote.location, storage_options=options, cache_dir=tmp_path / "c")
        assert store.remote and not local.remote
        cache = store._backend.cache  # no cache_limit given: two windows at the defaults
        assert cache is not None and cache.limit == NODE_CACHE_BYTES
        assert store.span_fetcher is not None

        def two_loaders():
            return [loader(_view(store), 16, block_bytes=BLOCK, window_blocks=W, seed=5)] * 2

        (ld, _), said = _recorded(two_loaders)
        (note,) = said[DefaultOrderWarning]  # once, not once per loader
        assert said[SlowReadWarning] == []
        assert remote.location in note and "block-window order" in note
        assert f"windows of {W} blocks" in note and "0.0625 MiB" in note
        assert "+0.9%" in note and "docs/object-storage.md" in note and "shuffle=True" in note
        assert ld.sampler.shuffle == "blocks" and ld.sampler.window_fetcher is not None

        ref, quiet = _recorded(
            lambda: loader(
                _view(local), 16, shuffle="blocks", block_bytes=BLOCK, window_blocks=W, seed=5
            )
        )
        assert quiet == {DefaultOrderWarning: [], SlowReadWarning: []}
        f = ld.sampler.window_fetcher
        f.spans.part_pages = PART // CHECK
        before = proxy.requests
        for got, want in zip(ld, ref, strict=True):
            np.testing.assert_array_equal(got["input_ids"].numpy(), want["input_ids"].numpy())
            assert len(f.live) <= 2
        f.wait()
        spans, reads = f.spans.stats, store._backend.fetcher.stats
        assert reads["requests"] <= 4  # readers waited for the whole blocks' parts
        table = 1  # the check table's one stripe, fetched with the first part that needs it
        assert proxy.requests - before == spans["requests"] + reads["requests"] + table
        served = store.num_tokens * store.dtype.itemsize
        assert (
            spans["bytes_fetched"]
            <= 1.1 * served
            + sum(b - a for a, b in f.window_spans(1, 0)) * store.dtype.itemsize
            + 2 * W * CHECK * f.order.n_windows
        )
        assert cache.usage() <= NODE_CACHE_BYTES
        f.close()

        # an explicit shuffle=True is honoured, with one warning of its cost
        (glob, _), said = _recorded(lambda: [loader(_view(store), 16, shuffle=True)] * 2)
        assert glob.sampler.shuffle is True and glob.sampler.window_fetcher is None
        (slow,) = said[SlowReadWarning]
        assert remote.location in slow and "global shuffled order" in slow
        assert "20-300x" in slow and said[DefaultOrderWarning] == []
    finally:
        proxy.close()


def test_a_remote_zarr_loader_reads_whole_blocks_by_default_too(tmp_path):
    """A remote Zarr store opened without ``cache_limit`` gets the same default node cache and
    the same whole-block fetch as the memmap layout: no warning of slow reads, batches equal
    the local store's.  (It used to warn "cannot fetch whole blocks".)"""
    docs = _corpus(n_docs=600, seed=8)
    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, docs, backend="zarr")
    local = mmpack.build(tmp_path / "local", docs)
    store = mmpack.open(url, cache_dir=tmp_path / "c")
    assert store.backend == "zarr" and store._backend.cache.limit == NODE_CACHE_BYTES
    assert store.span_fetcher is not None
    ld, said = _recorded(lambda: loader(_view(store), 16, block_bytes=BLOCK, window_blocks=W))
    assert said[SlowReadWarning] == [] and len(said[DefaultOrderWarning]) == 1
    f = ld.sampler.window_fetcher
    assert ld.sampler.shuffle == "blocks" and f is not None
    ref = loader(_view(local), 16, shuffle="blocks", block_bytes=BLOCK, window_blocks=W)
    for got, want in zip(ld, ref, strict=True):
        np.testing.assert_array_equal(got["input_ids"].numpy(), want["input_ids"].numpy())
    f.wait()
    assert f.spans.stats["bytes_fetched"] > 0 and store._backend.fetcher.stats["requests"] <= 4
    f.close()


def test_a_local_store_keeps_the_global_order_silently(tmp_path):
    local = mmpack.build(tmp_path / "local", _corpus(n_docs=300, seed=6))
    (ld, sampler), said = _recorded(
        lambda: (loader(_view(local), 16), ResumableSampler(_view(local)))
    )
    assert ld.sampler.shuffle is True and sampler.shuffle is True
    assert ld.sampler.window_fetcher is None
    assert said == {DefaultOrderWarning: [], SlowReadWarning: []}
    assert not local.remote


def test_an_unwritable_cache_folder_keeps_no_node_cache(tmp_path):
    """Where the cache folder cannot be written, the store opens as before without a
    ``cache_limit`` (no node cache) with the node cache's one warning; the default order is
    still the block order, and the loader warns that it cannot fetch whole blocks."""
    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, _corpus(n_docs=300, seed=6))
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")  # a cache_dir under a regular file cannot be made
    with pytest.warns(UserWarning, match="mmpack node cache: cannot write under"):
        store = mmpack.open(url, cache_dir=blocked / "cache")
    assert store._backend.cache is None and store.span_fetcher is None
    ld, said = _recorded(lambda: loader(_view(store), 16, block_bytes=BLOCK, window_blocks=W))
    assert ld.sampler.shuffle == "blocks" and ld.sampler.window_fetcher is None
    assert len(said[DefaultOrderWarning]) == 1
    (slow,) = said[SlowReadWarning]
    assert "cannot fetch whole blocks" in slow and "node cache" in slow
    assert mmpack.open(url, cache_dir=tmp_path / "c0", cache_limit=0)._backend.cache is None


def test_subsets_samplers_and_stages_of_a_remote_store_resolve_alike(tmp_path):
    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, _corpus(n_docs=600, seed=7))
    store = mmpack.open(url, cache_dir=tmp_path / "c")
    half = store.select(np.arange(0, 600, 2))
    assert half.remote
    view = _view(half)
    ld, said = _recorded(lambda: loader(view, 8, block_bytes=BLOCK, window_blocks=W))
    assert ld.sampler.shuffle == "blocks" and len(said[DefaultOrderWarning]) == 1
    sampler, said = _recorded(lambda: ResumableSampler(_view(store)))
    assert sampler.shuffle == "blocks" and len(said[DefaultOrderWarning]) == 1
    want = _view(store).block_bounds(FETCH_BLOCK_BYTES)
    assert sampler.block_order.n_blocks == len(want) - 1
    stages = mmpack.Stages([(64, _view(store), 4)], block_bytes=BLOCK, window_blocks=W)
    assert stages._samplers[0].shuffle == "blocks"
    assert ResumableSampler(_view(store), shuffle=False).shuffle is False


def test_a_mixture_of_remote_sources_reads_blocks_if_built_with_block_bytes(tmp_path):
    """All sources remote: the block order at the mixture's own ``block_bytes``; a mixture
    built without ``block_bytes`` keeps the global order, with the one warning of its cost; a
    mixture with a local source keeps the global order silently."""
    urls = [(tmp_path / f"r{k}").as_uri() for k in range(2)]
    stores = []
    for k, url in enumerate(urls):
        mmpack.build(url, _corpus(n_docs=300, seed=10 + k))
        stores.append(mmpack.open(url, cache_dir=tmp_path / "c"))
    views = [_view(s) for s in stores]
    blocks = mmpack.Mixture(views, [0.5, 0.5], block_bytes=BLOCK, seed=1)
    ld, said = _recorded(lambda: loader(blocks, 8, window_blocks=W))
    assert ld.sampler.shuffle == "blocks"
    assert ld.sampler.block_order.n_blocks == len(blocks.block_bounds(BLOCK)) - 1
    (note,) = said[DefaultOrderWarning]
    assert "a mixture of 2 remote sources" in note and "0.0625 MiB" in note
    plain = mmpack.Mixture(views, [0.5, 0.5], seed=1)
    ld, said = _recorded(lambda: loader(plain, 8))
    assert ld.sampler.shuffle is True and said[DefaultOrderWarning] == []
    (slow,) = said[SlowReadWarning]
    assert "global shuffled order" in slow and "block_bytes" in slow
    local = mmpack.build(tmp_path / "local", _corpus(n_docs=300, seed=12))
    mixed = mmpack.Mixture([views[0], _view(local)], [0.5, 0.5], block_bytes=BLOCK, seed=1)
    ld, said = _recorded(lambda: loader(mixed, 8))
    assert ld.sampler.shuffle is True and said == {DefaultOrderWarning: [], SlowReadWarning: []}


def test_the_slow_read_warning_points_at_the_users_call(tmp_path, monkeypatch):
    """The sampler warns now, wherever it is made: the warning names the line that made it
    (``ResumableSampler(...)`` or ``loader(...)``), not a line inside mmpack or above the call."""
    from mmpack._src.torch import block_fetch

    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, _corpus(n_docs=300, seed=6))
    store = mmpack.open(url, cache_dir=tmp_path / "c")
    makers = [
        lambda: ResumableSampler(_view(store), shuffle=True),
        lambda: loader(_view(store), 16, shuffle=True),
    ]
    for make in makers:
        monkeypatch.setattr(block_fetch, "_WARNED", set())
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            make()
        (slow,) = [w for w in rec if issubclass(w.category, SlowReadWarning)]
        assert slow.filename == __file__, (slow.filename, slow.lineno)
