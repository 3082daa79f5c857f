"""One fetch per block (``mmpack/_src/torch/block_fetch.py``) against a real S3 server
(SeaweedFS, ``tests/_s3.py``) behind the counting proxy: a block-window epoch read through
:func:`mmpack.torch.loader` equals the local store's sample for sample; whole spans are fetched
in parts (requests = parts, bytes fetched per byte of the store <= 1.1); the node cache never
holds more than two windows; two processes sharing a ``cache_dir`` fetch each block once;
DataLoader workers read the shared cache over two epochs (blocks dropped and fetched again).
The span fetcher's own checks are in ``tests/remote/test_spans.py``.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/torch/test_block_fetch.py``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from _block_fetch import (
    CHECK,
    _parts,
    _two_epochs,
    _window_bytes,
    assert_each_block_once,
    block_stores,
    open_cached,
    zarr_block_store,
)
from _remote_stores import _corpus
from _s3 import DelayProxy, isolate_cache_and_env

import mmpack
from mmpack import ResumableSampler
from mmpack._src.remote.spans import SpanFetcher
from mmpack._src.torch.block_fetch import WindowFetcher
from mmpack.errors import SlowReadWarning
from mmpack.torch import loader

SEQLEN = 64
BLOCK = 64 << 10  # bytes per sample block (view.block_bounds)
W = 4  # blocks per window
PART = 16 << 10  # four parts per block
COLD_LIMIT = 240  # seconds for a cold start's epoch (compiling every kernel: ~60 s alone)


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def stores(s3_server, tmp_path_factory):
    return block_stores(s3_server, tmp_path_factory)


def _loader(store, **kw):
    view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
    return loader(view, 16, shuffle="blocks", block_bytes=BLOCK, window_blocks=W, seed=5, **kw)


def _ids(batch):
    return batch["input_ids"].numpy()


def _with_parts(ld):
    f = ld.sampler.window_fetcher
    f.spans.part_pages = PART // CHECK
    return f


def test_a_block_epoch_equals_the_local_store_in_whole_parts(stores, s3_server, tmp_path):
    remote, local = stores
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        store = open_cached(remote, dict(s3_server.options, endpoint=proxy.endpoint), tmp_path)
        ld, ref = _loader(store), _loader(local)
        assert ref.sampler.window_fetcher is None  # a local store keeps today's path
        f = _with_parts(ld)
        cf = f.spans.cache
        sizes = _window_bytes(f, 0)
        bound = max(a + b for a, b in zip(sizes, sizes[1:] + _window_bytes(f, 1)[:1]))
        before, peak, windows = proxy.requests, 0, set()
        for got, want in zip(ld, ref, strict=True):
            np.testing.assert_array_equal(_ids(got), _ids(want))
            peak = max(peak, int(cf.state.sum()) * CHECK)
            windows.add(f.current)
            assert len(f.live) <= 2
        f.wait()
        assert len(windows) == f.order.n_windows > 2
        assert peak <= bound + 2 * W * CHECK  # two windows (a boundary block each end at most)
        stats = f.spans.stats
        served = store.num_tokens * store.dtype.itemsize
        # every window's check pages once (a page at a span's edge once per window using it)
        want = sum(sizes) + _window_bytes(f, 1)[0]
        assert stats["bytes_fetched"] <= want
        assert stats["bytes_fetched"] - _window_bytes(f, 1)[0] <= 1.1 * served
        # the epoch's windows and the first of the next: their parts, and nothing else (a
        # block a reader fetched itself, on a starved machine, leaves its part one block short)
        parts = sum(_parts(f, f.window_spans(0, w)) for w in range(f.order.n_windows))
        reads = store._backend.fetcher.stats["requests"]
        assert parts <= stats["requests"] + reads
        assert stats["requests"] <= parts + _parts(f, f.window_spans(1, 0))
        assert reads <= 4  # readers waited for the parts
        table = 1  # the check table's one stripe, fetched with the first part that needs it
        assert proxy.requests - before == (
            stats["requests"] + store._backend.fetcher.stats["requests"] + table
        )
        assert stats["pages_dropped"] > 0
        # epoch 1: dropped blocks fetched again, still equal
        for got, want in zip(ld, ref, strict=True):
            np.testing.assert_array_equal(_ids(got), _ids(want))
        f.close()
        assert f.live == []
    finally:
        proxy.close()


@pytest.fixture
def start_method(request):
    """The default start method (``request.param``) while the test runs: what a DataLoader made
    without ``multiprocessing_context`` (``mmpack.torch.loader``'s) starts its workers with."""
    was = mp.get_start_method(allow_none=True)
    mp.set_start_method(request.param, force=True)
    try:
        yield request.param
    finally:
        mp.set_start_method(was, force=True)


@pytest.mark.parametrize("start_method", ["fork", "spawn"], indirect=True)
def test_loader_workers_read_the_blocks_the_sampler_fetches(
    start_method, stores, s3_server, tmp_path
):
    """``mmpack.torch.loader(..., num_workers=2)`` with workers forked or spawned, two epochs:
    the batches equal the local store's, each block is fetched once per epoch in whole parts (the
    workers read the node cache and fetch nothing of their own), the node cache holds two windows
    at most (blocks dropped and fetched again in epoch 1)."""
    remote, local = stores
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        store = open_cached(remote, dict(s3_server.options, endpoint=proxy.endpoint), tmp_path)
        ld = _loader(store, num_workers=2)
        ref = _loader(local)
        f = _with_parts(ld)
        sizer, sizes, bound = _two_epochs(ld.dataset, ld.sampler)
        cf, peak, before = f.spans.cache, 0, (proxy.requests, proxy.bytes_down)
        for _ in range(2):
            for got, want in zip(ld, ref, strict=True):
                np.testing.assert_array_equal(_ids(got), _ids(want))
                peak = max(peak, int(cf.state.sum()) * CHECK)
        f.wait()
        opens = 4 * 2 * 2 if start_method == "spawn" else 0  # a spawned worker opens the store
        assert_each_block_once(store, proxy, before, sizer, sizes, bound, peak, opens)
        f.close()
    finally:
        proxy.close()


@pytest.mark.parametrize("workers,start", [(0, None), (2, "fork"), (2, "spawn")])
def test_a_plain_dataloader_over_a_block_sampler_fetches_whole_blocks(
    workers, start, stores, s3_server, tmp_path
):
    """What HF Trainer and Lightning users have: a plain ``DataLoader`` given a block-order
    ``ResumableSampler`` over the view (no mmpack loader).  The sampler drives the fetch as it is
    iterated: over two epochs each block is fetched once per epoch in whole parts (readers, the
    workers included, fetch nothing of their own), the node cache holds two windows at most, and
    the batches equal the local store's.  (It used to fetch one small range per sample and keep
    every block.)"""
    from torch.utils.data import DataLoader

    from mmpack.torch import collate

    remote, local = stores
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        store = open_cached(remote, dict(s3_server.options, endpoint=proxy.endpoint), tmp_path)
        view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
        s = ResumableSampler(
            view, shuffle="blocks", block_bounds=view.block_bounds(BLOCK), window_blocks=W, seed=5
        )
        more = dict(multiprocessing_context=start) if workers else {}
        dl = DataLoader(
            view, sampler=s, batch_size=16, num_workers=workers, collate_fn=collate, **more
        )
        ref = _loader(local)
        spans = store.span_fetcher
        spans.part_pages = PART // CHECK
        sizer, sizes, bound = _two_epochs(view, s)
        cf, peak, before = spans.cache, 0, (proxy.requests, proxy.bytes_down)
        for epoch in range(2):
            s.set_epoch(epoch)
            for got, want in zip(dl, ref, strict=True):
                np.testing.assert_array_equal(_ids(got), _ids(want))
                peak = max(peak, int(cf.state.sum()) * CHECK)
        fetcher = s.window_fetcher
        fetcher.wait()
        opens = 4 * workers * 2 if start == "spawn" else 0  # a spawned worker opens the store
        assert_each_block_once(store, proxy, before, sizer, sizes, bound, peak, opens)
        fetcher.close()
        twin = pickle.loads(pickle.dumps(s))  # a copy holds no window, lock or thread
        assert twin.window_fetcher.sampler is twin and twin.window_fetcher.live == []
    finally:
        proxy.close()


def _rank_epoch(store, rank, barrier, out):
    view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
    ld = loader(
        view, 16, shuffle="blocks", block_bytes=BLOCK, window_blocks=W, seed=5,
        rank=rank, world_size=2,
    )  # fmt: skip
    rows = []
    for batch in ld:  # in lockstep, as ranks of one training step are (DDP's all-reduce)
        barrier.wait(30)
        rows.append(_ids(batch))
    ld.sampler.window_fetcher.wait()
    barrier.wait(30)  # both done before either drops what the other may still read
    ld.sampler.window_fetcher.close()
    out.put((rank, np.concatenate(rows), ld.sampler.window_fetcher.spans.stats["bytes_fetched"]))


def test_two_ranks_sharing_a_cache_fetch_each_block_once(stores, s3_server, tmp_path):
    remote, local = stores
    proxy = DelayProxy(s3_server.port, delay=0.005)
    try:
        store = open_cached(remote, dict(s3_server.options, endpoint=proxy.endpoint), tmp_path)
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_rank_epoch, args=(store, r, barrier, out)) for r in (0, 1)]
        for p in procs:
            p.start()
        got = dict(
            (r, (rows, fetched)) for r, rows, fetched in (out.get(timeout=60) for _ in procs)
        )
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        f = _loader(store).sampler.window_fetcher  # the windows' spans (the same on every rank)
        once = sum(_window_bytes(f, 0)) + _window_bytes(f, 1)[0]  # + the next epoch's first
        assert got[0][1] > 0 and got[1][1] > 0  # both ranks fetched ...
        assert got[0][1] + got[1][1] <= once  # ... each block once for the node
        assert proxy.bytes_down <= 1.02 * once  # (the index objects and headers besides)
        view = mmpack.WindowDataset(local, SEQLEN, eot=65535)
        for r in (0, 1):
            s = ResumableSampler(
                len(view), shuffle="blocks", block_bounds=view.block_bounds(BLOCK),
                window_blocks=W, seed=5, rank=r, world_size=2,
            )  # fmt: skip
            want = view.__getitems__(np.fromiter(s, np.int64)).columns["input_ids"]
            np.testing.assert_array_equal(got[r][0], want)
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def zarr_store(s3_server, stores):
    return zarr_block_store(s3_server)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_over_a_remote_zarr_store_fetches_each_block_once(
    workers, zarr_store, stores, s3_server, tmp_path
):
    """The block order over a remote Zarr store takes the memmap layout's path: the sampler
    fetches a window's inner chunks whole (merged range requests per shard) into the node cache,
    each block once per epoch, readers (forked workers too) fetch nothing of their own, the node
    cache holds two windows at most, and the batches equal the local store's.  (It used to have
    no whole-block fetch: every sample was a small range request.)"""
    from torch.utils.data import DataLoader

    from mmpack.torch import collate

    local = stores[1]
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        store = open_cached(zarr_store, dict(s3_server.options, endpoint=proxy.endpoint), tmp_path)
        assert store.backend == "zarr" and store._backend._layout.num_shards > 4
        view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
        with warnings.catch_warnings():
            warnings.simplefilter("error", SlowReadWarning)  # the block order fetches blocks
            s = ResumableSampler(
                view, shuffle="blocks", block_bounds=view.block_bounds(BLOCK), window_blocks=W,
                seed=5,
            )  # fmt: skip
        more = dict(multiprocessing_context="fork") if workers else {}
        dl = DataLoader(
            view, sampler=s, batch_size=16, num_workers=workers, collate_fn=collate, **more
        )
        ref = _loader(local)
        spans = store.span_fetcher
        assert spans is not None and spans.fetcher.page == CHECK
        spans.part_pages = PART // CHECK
        sizer = WindowFetcher(view, s)  # the windows' spans (fetches nothing itself)
        sizes = [_window_bytes(sizer, e) for e in range(3)]
        seq = sizes[0] + sizes[1] + sizes[2][:1]
        bound = max(a + b for a, b in zip(seq, seq[1:]))
        cf, peak, before, down = spans.cache, 0, proxy.requests, proxy.bytes_down
        for epoch in range(2):
            s.set_epoch(epoch)
            for got, want in zip(dl, ref, strict=True):
                np.testing.assert_array_equal(_ids(got), _ids(want))
                peak = max(peak, int(cf.state.sum()) * CHECK)
        fetcher = s.window_fetcher
        fetcher.wait()
        stats = spans.stats
        assert peak <= bound + 2 * W * CHECK  # two windows (a boundary block each end at most)
        # each block once per epoch (a chunk is its block and a 4-byte crc32c; the shard
        # indexes once), and the next epoch's first window fetched ahead
        blocks = (sum(sizes[0]) + sum(sizes[1]) + sizes[2][0]) // CHECK
        indexes = store._backend._layout.num_shards * store._backend._layout.index_nbytes
        assert stats["bytes_fetched"] <= blocks * (CHECK + 4) + indexes
        assert stats["pages_dropped"] > 0
        # readers waited for the spans (a few requests of their own at most)
        assert proxy.requests - before <= stats["requests"] + 4
        # (and their bytes, with each response's headers)
        assert proxy.bytes_down - down <= 1.1 * stats["bytes_fetched"] + 4 * CHECK
        fetcher.close()
    finally:
        proxy.close()


def test_the_fetcher_needs_a_block_order_and_a_node_cache(stores, s3_server, tmp_path):
    remote, local = stores
    view = mmpack.WindowDataset(local, SEQLEN)
    s = ResumableSampler(len(view), shuffle="blocks", block_bounds=view.block_bounds(BLOCK))
    with pytest.raises(ValueError, match="remote store"):
        WindowFetcher(view, s)
    nocache = mmpack.open(remote.location, storage_options=s3_server.options)
    rview = mmpack.WindowDataset(nocache, SEQLEN)
    assert WindowFetcher.auto(rview, ResumableSampler(len(rview))) is None
    with pytest.raises(ValueError, match="shuffle='blocks'"):
        WindowFetcher(rview, ResumableSampler(len(rview)))


@pytest.mark.parametrize("kind", ["window", "packed"])
def test_a_blocks_token_span_holds_every_range_of_its_samples(kind, tmp_path):
    local = mmpack.build(tmp_path / "s", _corpus(n_docs=800, seed=4))
    if kind == "window":
        view = mmpack.WindowDataset(local, SEQLEN, eot=65535)
    else:
        view = mmpack.PackedDataset(local, SEQLEN, eot=65535, region_tokens=2048)
    bounds = view.block_bounds(BLOCK)
    assert len(bounds) > 3
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        a, b = view.token_span(lo, hi)
        starts, lengths = view._ranges(np.arange(lo, hi) * (view.stride if kind == "window" else 1))
        keep = lengths > 0
        assert (starts[keep] >= a).all() and (starts[keep] + lengths[keep] <= b).all()
        assert a == starts[keep].min() and b == (starts[keep] + lengths[keep]).max()


def test_the_fetcher_follows_the_samplers_skips(stores, s3_server, tmp_path):
    """With the first window's positions skipped, the pass starts in window 1: the fetcher
    fetches that window first (not the skipped one) and the batches equal the local store's
    under the same skip."""
    remote, local = stores
    store = open_cached(remote, s3_server.options, tmp_path)
    ld, ref = _loader(store), _loader(local)
    f = ld.sampler.window_fetcher
    first = int(f.order.window_offsets(0)[1])  # the positions of window 0
    for one in (ld, ref):
        one.sampler.skip(0, first)
    got = iter(ld)
    np.testing.assert_array_equal(_ids(next(got)), _ids(next(iter(ref))))
    assert f.current == (0, 1)
    for a, b in zip(got, list(ref)[1:], strict=True):
        np.testing.assert_array_equal(_ids(a), _ids(b))
    f.wait()


def test_the_current_window_queues_all_its_parts_before_the_next(
    stores, s3_server, tmp_path, monkeypatch
):
    """Parts go out in queue order on one fetch thread: every part of the window the loop
    starts in is queued before any of the next window's, even where the first is slow to queue
    them (they interleaved, and the loop waited for both windows)."""
    remote, _ = stores
    store = open_cached(remote, dict(s3_server.options, max_concurrency=1), tmp_path)
    ld = _loader(store)
    f = _with_parts(ld)
    calls: list[int] = []
    real = SpanFetcher._fetch_part

    def recorded(self, cf, lo, hi):
        calls.append(lo)
        return real(self, cf, lo, hi)

    monkeypatch.setattr(SpanFetcher, "_fetch_part", recorded)
    cut = SpanFetcher._parts
    slow = {"first": True}

    def late(self, ranges, mine):  # the first window is slow to cut its parts: the next waits
        if slow.pop("first", False):
            time.sleep(0.3)
        return cut(self, ranges, mine)

    monkeypatch.setattr(SpanFetcher, "_parts", late)
    first = next(iter(ld))
    f.wait()

    def owner(spans):
        return {b for a, z in spans for b in range(*f.spans.page_range(a, z))}

    here, after = owner(f.window_spans(0, 0)), owner(f.window_spans(0, 1))
    windows = [0 if lo in here else 1 if lo in after else 2 for lo in calls]
    assert first is not None and 0 < windows.count(0) and 0 < windows.count(1)
    assert 2 not in windows  # nothing but the two windows
    assert windows == sorted(windows)  # window 0's parts, then window 1's
    f.close()


def _slow_reader(store, local, ready, checked, dropped, out):
    """A second process of the node: reads a span of window 0 through the node cache, stopped
    between the check of its blocks and their copy until the loader has dropped the window."""
    from mmpack._src.remote.fetcher import PageFetcher

    real = PageFetcher.cached
    once = {"stop": True}

    def stopped(self, starts, lengths):
        src = real(self, starts, lengths)
        if src is not None and once.pop("stop", False):
            checked.set()  # checked and served: the loader now leaves window 0 and drops it
            dropped.wait(30)
        return src

    PageFetcher.cached = stopped
    a, b = _loader(store).sampler.window_fetcher.window_spans(0, 0)[0]
    a, b = a + CHECK, b - CHECK  # inside the span: no check page another window shares
    ready.wait(30)
    got = store.read_range(a, b)  # stopped while the drop runs
    again = store.read_range(a, b)  # after it: dropped blocks are fetched again
    want = local.read_range(a, b)
    out.put((bool(np.array_equal(got, want)), bool(np.array_equal(again, want))))


def test_a_reader_never_copies_a_page_dropped_under_it(stores, s3_server, tmp_path):
    """A process reading through the node cache while a block-order loader drops the window it
    reads: the blocks it checked stay until it has copied them (its pins keep them from the
    drop), where it used to copy the punched holes (rows of zeros); read again after the drop,
    they are fetched again."""
    remote, local = stores
    store = open_cached(remote, s3_server.options, tmp_path)
    ctx = mp.get_context("fork")
    ready, checked, dropped, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(
        target=_slow_reader, args=(store, local, ready, checked, dropped, out)
    )  # forked before the loader's threads start
    reader.start()
    try:
        ld = _loader(store)
        f = ld.sampler.window_fetcher
        batches = iter(ld)
        next(batches)
        f.wait()  # window 0 (and 1) fetched
        assert f.current == (0, 0)
        ready.set()
        assert checked.wait(30)
        while f.current == (0, 0):  # leave window 0: it is unpinned and dropped
            next(batches)
        f.wait()
        dropped.set()
        copied, again = out.get(timeout=60)
        assert copied, "the reader copied blocks dropped under it"
        assert again
        f.close()
    finally:
        dropped.set()
        reader.join(30)
        if reader.is_alive():
            reader.kill()
    assert reader.exitcode == 0


_COLD_LOADER = f"""
import json, sys
import mmpack
from mmpack.torch import loader
location, options, cache_dir = json.loads(sys.argv[1])
store = mmpack.open(location, storage_options=options, cache_dir=cache_dir, cache_limit=1 << 30)
view = mmpack.WindowDataset(store, {SEQLEN}, eot=65535)
ld = loader(view, 16, shuffle="blocks", block_bytes={BLOCK}, window_blocks={W}, num_workers=2, seed=5)
print(sum(len(b["input_ids"]) for b in ld), flush=True)
"""


@pytest.mark.slow
def test_workers_forked_while_fetch_threads_compile_get_their_batches(stores, s3_server, tmp_path):
    """``loader(remote_view, shuffle="blocks", num_workers=2)`` with a cold numba cache: the
    workers are forked while the fetch threads start, which compiled their kernels holding
    numba's lock, and every worker waited for ever on its first kernel.  Run in a process of its
    own (a fresh ``NUMBA_CACHE_DIR``), bounded in time, its process group killed on a hang."""
    remote, local = stores
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(mmpack.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    args = json.dumps([remote.location, s3_server.options, str(tmp_path / "cache")])
    proc = subprocess.Popen(
        [sys.executable, "-c", _COLD_LOADER, args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=COLD_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the loader and its workers
        proc.communicate()
        pytest.fail(f"the loader's first batches hung (no batch in {COLD_LIMIT} s)")
    assert proc.returncode == 0, err[-3000:]
    assert int(out.split()[-1]) == len(mmpack.WindowDataset(local, SEQLEN, eot=65535))


def test_a_remote_store_read_without_whole_blocks_is_warned_of_once(tmp_path):
    """The global order over a remote store, and the block order over one opened with
    ``cache_limit=0``, cannot fetch whole blocks: each warns once, naming the fix; the block
    order with a node cache (the default order there), and any order over a local store, say
    nothing."""
    from mmpack.errors import SlowReadWarning

    docs = _corpus(n_docs=300, seed=6)
    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, docs)
    local = mmpack.build(tmp_path / "local", docs)

    def loaders(store, **kw):
        view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            for _ in range(2):  # once, not once per loader
                loader(view, 16, block_bytes=BLOCK, window_blocks=W, **kw)
        return [str(w.message) for w in rec if issubclass(w.category, SlowReadWarning)]

    nocache = mmpack.open(url, cache_limit=0)
    cached = mmpack.open(url, cache_dir=tmp_path / "cache", cache_limit=1 << 30)
    (slow,) = loaders(nocache, shuffle=True)
    assert "global shuffled order" in slow and "leave shuffle to its default" in slow
    assert url in slow
    (blocks,) = loaders(nocache, shuffle="blocks")
    assert "cache_limit" in blocks and url in blocks
    assert loaders(cached, shuffle="blocks") == loaders(cached) == []
    assert loaders(nocache, shuffle=False) == []  # in order: merged ranges
    assert loaders(local) == loaders(local, shuffle="blocks") == []


def test_a_node_cache_smaller_than_two_windows_is_warned_of_once(tmp_path):
    """Two windows whose blocks the node cache cannot hold would be dropped before they are
    read and fetched again: the fetcher warns once, naming the bytes two windows need and a
    window that fits; a cache that holds two windows says nothing."""
    docs = _corpus(n_docs=300, seed=6)
    url = (tmp_path / "remote").as_uri()
    mmpack.build(url, docs)
    small_blocks = 8 << 10

    def warned(limit, window_blocks=W):
        store = mmpack.open(url, cache_dir=tmp_path / f"cache{limit}", cache_limit=limit)
        view = mmpack.WindowDataset(store, SEQLEN, eot=65535)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            for _ in range(2):  # once, not once per loader
                loader(view, 16, block_bytes=small_blocks, window_blocks=window_blocks)
        return view, [str(w.message) for w in rec if issubclass(w.category, SlowReadWarning)]

    view, said = warned(1 << 30)
    assert said == []
    blocks = len(view.block_bounds(small_blocks)) - 1
    total = view.store.num_tokens * view.store.dtype.itemsize
    assert blocks > 2 * W  # two windows are part of the store
    need = -(-2 * W * total // blocks)
    view, (said,) = warned(need - 1)
    assert f"cache_limit >= {need}" in said and url in said
    fit = (need - 1) * blocks // (2 * total)
    assert 1 <= fit < W and f"window_blocks <= {fit}" in said
    assert warned(need - 1, window_blocks=fit)[1] == []  # the window it names fits
    assert warned(need)[1] == []
