"""The node cache of remote stores (``mmpack/_src/remote/cache.py``, ``cachefile.py``) against a
real S3 server (SeaweedFS, ``tests/_s3.py``): one sparse mapped file per store object with a
per-block state array; hits copied out of the mapping (under pins); no duplicate downloads across
processes; the limit (charged and real disk use); eviction; a crash mid-write; a corrupt cached
page (served by a reader that already checked it, caught and dropped by ``verify``; a new
reader's check: ``remote/test_cachefile.py``); a store rebuilt under the same URL;
a file from another boot; DataLoader workers under fork and spawn with the cache.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/remote/test_cache.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
from _contract import assert_workers_serve
from _remote_stores import _build_with_page, _corpus, _url
from _s3 import DelayProxy, isolate_cache_and_env, run_processes
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack._src.remote import cache as cache_mod
from mmpack._src.remote.cache import PageCache
from mmpack.errors import FormatError

GiB = 1 << 30


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def _open(store, options, cache_dir, limit=GiB):
    return mmpack.open(
        store.location, storage_options=options, cache_dir=cache_dir, cache_limit=limit
    )


def _files(cache_dir):
    return sorted(p.name for p in (cache_dir / "pages").iterdir() if not p.name.startswith("."))


# ----------------------------------------------------------------------------- hit path
def test_hits_are_copied_from_the_mapped_file_and_fetch_nothing(s3_server, tmp_path):
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, 4096)
    local = mmpack.build(tmp_path / "local", docs)
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        first = _open(store, opts, tmp_path)
        ds = mmpack.PackedDataset(first, 64, eot=65535)
        want = mmpack.PackedDataset(local, 64, eot=65535).__getitems__(np.arange(len(ds)))
        got = ds.__getitems__(np.arange(len(ds)))  # fills the cache
        np.testing.assert_array_equal(got.columns["input_ids"], want.columns["input_ids"])
        names = _files(tmp_path)
        assert names == [
            f"{store.fingerprint}-tokens-p4096.data",
            f"{store.fingerprint}-tokens-p4096.state",
        ]
        before = proxy.requests
        again = _open(store, opts, tmp_path)  # a new reader (another worker would do the same)
        starts = np.array([0, 5, store.num_tokens - 7], np.int64)
        src, at = again.read_ranges(starts, np.array([10, 100, 7], np.int64))
        cf = again._backend.node_cache.mapped
        assert cf is not None and not np.shares_memory(src, cf.tokens)  # copied under pins
        assert at.tolist() == [0, 10, 110]  # back to back
        for k, n in enumerate((10, 100, 7)):
            np.testing.assert_array_equal(
                src[at[k] : at[k] + n], local.read_range(int(starts[k]), int(starts[k]) + n)
            )
        got = mmpack.PackedDataset(again, 64, eot=65535).__getitems__(np.arange(len(ds)))
        np.testing.assert_array_equal(got.columns["input_ids"], want.columns["input_ids"])
        assert proxy.requests - before == 2  # metadata GET + tokens HEAD at open; no data
        assert again._backend.stats["bytes_fetched"] == 0
    finally:
        proxy.close()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 20_000),
    st.sampled_from([8, 64, 4096]),
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.integers(0, 40_000), st.integers(0, 3000)), max_size=12),
)
def test_serves_matches_a_naive_page_walk(tmp_path_factory, ntok, page, seed, ranges):
    """``CacheFile.serves`` on a real cache file against every page of every range."""
    root = tmp_path_factory.mktemp("cov")
    cf = PageCache(root, GiB).open_file("f" * 16, "tokens", 2 * ntok, page, np.dtype("<u2"))
    assert cf is not None
    rng = np.random.default_rng(seed)
    cf.checked[:] = rng.random(cf.npages) < rng.random()
    starts = np.array([min(a, ntok) for a, _ in ranges], np.int64)
    lengths = np.array([min(n, ntok - a) for a, (_, n) in zip(starts.tolist(), ranges)], np.int64)
    want = all(
        cf.checked[b]
        for a, n in zip(starts.tolist(), lengths.tolist())
        if n > 0
        for b in range(a * 2 // page, -(-(a + n) * 2 // page))
    )
    assert cf.serves(starts, lengths, 2) == want


# ----------------------------------------------------------------------------- sharing
def test_two_processes_fill_the_cache_without_duplicate_fetches(s3_server, tmp_path):
    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    proxy = DelayProxy(s3_server.port, delay=0.05)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        s = _open(store, opts, tmp_path)
        rng = np.random.default_rng(0)
        starts = np.sort(rng.choice(store.num_tokens - 500, size=24, replace=False)).astype(
            np.int64
        )
        want = [store.read_range(int(a), int(a) + 500) for a in starts]
        pages = s._backend.fetcher.page_ids(starts, np.full(24, 500, np.int64))
        before = proxy.requests
        ctx = mp.get_context("fork")
        run_processes(ctx, _read_all, [(s, starts, want)] * 3, 60)
        fetched = proxy.requests - before
        runs = 1 + int((np.diff(pages) > 1).sum())
        assert fetched <= runs + 3  # each page by one process (a run may split between them)
        assert fetched >= 1
        s2 = _open(store, opts, tmp_path)
        assert s2._backend.node_cache.file().present(pages).all()
    finally:
        proxy.close()


def _read_all(store, starts, want):
    src, at = store.read_ranges(starts, np.full(starts.size, 500, np.int64))
    for k in range(starts.size):
        np.testing.assert_array_equal(src[at[k] : at[k] + 500], want[k])


def test_a_fetch_killed_mid_write_leaves_the_page_absent(s3_server, tmp_path):
    """A process that claimed a page and wrote garbage into the data file, then died before
    setting the state byte: the page is not served; its claim died with it."""
    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    s = _open(store, s3_server.options, tmp_path)
    cf = s._backend.node_cache.file()
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_claim_write_garbage_and_die, args=(s, 3))
    p.start()
    p.join(30)
    assert p.exitcode == 7
    assert not cf.state[3]
    a = 3 * 2048  # page 3 of 4 KiB = tokens [6144, 8192)
    np.testing.assert_array_equal(s.read_range(a, a + 2048), store.read_range(a, a + 2048))
    assert cf.state[3]


def _claim_write_garbage_and_die(store, b):
    cf = store._backend.node_cache.file()
    claim = cf.claim([b])
    assert claim.mine == [b]
    os.pwrite(cf._fd_data, b"\xff" * cf.page, b * cf.page)
    os._exit(7)


def test_a_failed_cache_write_marks_nothing_and_refunds_its_charge(
    s3_server, tmp_path, monkeypatch
):
    """The state byte is set only after the page's bytes are written: a write that fails (a
    full disk) leaves the page absent, its charge given back, and the read still correct."""
    import mmpack._src.remote.cachefile as cachefile

    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    s = _open(store, s3_server.options, tmp_path)
    cf = s._backend.node_cache.file()
    before = s._backend.cache.usage()

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cachefile.os, "pwrite", full)
    np.testing.assert_array_equal(s.read_range(0, 6000), store.read_range(0, 6000))
    assert int(cf.state.sum()) == 0 and s._backend.cache.usage() == before
    monkeypatch.undo()
    s2 = _open(store, s3_server.options, tmp_path)
    np.testing.assert_array_equal(s2.read_range(0, 6000), store.read_range(0, 6000))
    assert int(cf.state.sum()) == 3 and s._backend.cache.usage() == before + 3 * 4096


# ----------------------------------------------------------------------------- the limit
def test_limit_holds_in_charges_and_on_disk(s3_server, tmp_path):
    store = _build_with_page(_url(), _corpus(n_docs=600), s3_server.options, 4096)
    base = PageCache.base_charge(-(-store.num_tokens * 2 // 4096))
    limit = base + 7 * 4096 + 100  # room for 7 pages
    s = _open(store, s3_server.options, tmp_path, limit)
    cache = s._backend.cache
    rng = np.random.default_rng(1)
    for _ in range(25):
        starts = rng.integers(0, store.num_tokens - 300, size=int(rng.integers(1, 6)))
        src, at = s.read_ranges(starts, np.full(starts.size, 300))
        for k, a in enumerate(starts.tolist()):
            np.testing.assert_array_equal(src[at[k] : at[k] + 300], store.read_range(a, a + 300))
        assert cache.allocated() <= cache.usage() <= limit
    cf = s._backend.node_cache.file()
    assert int(cf.state.sum()) == 7 and cache.usage() == base + 7 * 4096


def test_least_recently_used_store_is_evicted_once_unmapped(s3_server, tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "ACTIVE_SECONDS", 0.0)
    a = _build_with_page(_url(), _corpus(n_docs=300, seed=1), s3_server.options, 4096)
    b = _build_with_page(_url(), _corpus(n_docs=300, seed=2), s3_server.options, 4096)
    npages = -(-max(a.num_tokens, b.num_tokens) * 2 // 4096)
    limit = PageCache.base_charge(npages) * 2 + 12 * 4096
    ra = _open(a, s3_server.options, tmp_path, limit)
    ra.read_ranges(np.arange(10, dtype=np.int64) * 2048, np.full(10, 10, np.int64))  # 10 pages
    cache = ra._backend.cache
    rb = _open(b, s3_server.options, tmp_path, limit)
    got = rb.read_ranges(np.arange(10, dtype=np.int64) * 2048, np.full(10, 10, np.int64))
    b_file = rb._backend.node_cache.mapped
    assert b_file is None or not np.shares_memory(got[0], b_file.tokens)  # a copy, always
    assert ra._backend.node_cache.mapped.retired and cache.allocated() <= cache.usage() <= limit
    want = [a.read_range(k * 2048, k * 2048 + 10) for k in range(10)]
    src, at = ra.read_ranges(np.arange(10, dtype=np.int64) * 2048, np.full(10, 10, np.int64))
    for k in range(10):  # the retired file's reader lets go and still reads right
        np.testing.assert_array_equal(src[at[k] : at[k] + 10], want[k])
    del ra, src
    import gc

    gc.collect()  # a's mappings gone: the next charge removes its files
    rb.read_ranges(np.arange(10, 20, dtype=np.int64) * 2048, np.full(10, 10, np.int64))
    assert not [n for n in _files(tmp_path) if n.startswith(a.fingerprint)]
    assert cache.allocated() <= cache.usage() <= limit
    assert int(rb._backend.node_cache.file().state.sum()) >= 10


def test_an_active_store_is_not_evicted(s3_server, tmp_path):
    a = _build_with_page(_url(), _corpus(n_docs=300, seed=1), s3_server.options, 4096)
    b = _build_with_page(_url(), _corpus(n_docs=300, seed=2), s3_server.options, 4096)
    npages = -(-max(a.num_tokens, b.num_tokens) * 2 // 4096)
    limit = PageCache.base_charge(npages) * 2 + 12 * 4096
    ra = _open(a, s3_server.options, tmp_path, limit)
    ra.read_ranges(np.arange(12, dtype=np.int64) * 2048, np.full(12, 10, np.int64))
    rb = _open(b, s3_server.options, tmp_path, limit)
    src, at = rb.read_ranges(np.arange(3, dtype=np.int64) * 2048, np.full(3, 10, np.int64))
    for k in range(3):  # served from memory: no room, and a was read just now
        np.testing.assert_array_equal(
            src[at[k] : at[k] + 10], b.read_range(k * 2048, k * 2048 + 10)
        )
    assert (
        not ra._backend.node_cache.mapped.retired
        and int(rb._backend.node_cache.file().state.sum()) == 0
    )


def test_processes_evicting_each_others_stores_stay_correct_and_bounded(
    s3_server, tmp_path, monkeypatch
):
    """Four processes read two stores through one small cache that holds about one store's
    worth; with no "active" grace every charge may evict the other store: reads stay right,
    the charged total and the disk use stay under the limit."""
    monkeypatch.setattr(cache_mod, "ACTIVE_SECONDS", 0.0)
    stores = [
        _build_with_page(_url(), _corpus(n_docs=300, seed=s), s3_server.options, 4096)
        for s in (7, 8)
    ]
    npages = -(-max(s.num_tokens for s in stores) * 2 // 4096)
    limit = PageCache.base_charge(npages) + 16 * 4096
    ctx = mp.get_context("fork")
    run_processes(
        ctx,
        _hammer,
        [(stores[k % 2], s3_server.options, tmp_path, limit, k) for k in range(4)],
        120,
    )
    cache = PageCache(tmp_path, limit)
    assert cache.allocated() <= cache.usage() <= limit


def _hammer(store, options, cache_dir, limit, seed):
    s = _open(store, options, cache_dir, limit)
    cache = s._backend.cache
    rng = np.random.default_rng(seed)
    for _ in range(30):
        starts = rng.integers(0, store.num_tokens - 200, size=6)
        src, at = s.read_ranges(starts, np.full(6, 200))
        for k, a in enumerate(starts.tolist()):
            np.testing.assert_array_equal(src[at[k] : at[k] + 200], store.read_range(a, a + 200))
        assert cache.usage() <= limit


# ----------------------------------------------------------------------------- integrity
def test_corrupt_cached_page_is_trusted_on_reads_and_caught_by_verify(s3_server, tmp_path):
    """A reader checks a page once (here: when it stored it) and serves it as mapped after;
    verify() compares the cached pages with the object, drops a bad one and reports it."""
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, 4096)
    local = mmpack.build(tmp_path / "local", docs)
    s = _open(store, s3_server.options, tmp_path)
    want = local.read_range(0, 3000)
    np.testing.assert_array_equal(s.read_range(0, 3000), want)
    cf = s._backend.node_cache.file()
    assert cf.state[0] and cf.state[1]
    with open(cf.data_path, "r+b") as f:  # flip a byte of token 10 behind the cache's back
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert s.read_range(0, 3000)[10] != want[10]  # this reader checked page 0 already
    before = s._backend.cache.usage()
    with pytest.raises(FormatError, match=r"node-cache page.*\[0\].*dropped"):
        s.verify()
    assert not cf.state[0] and s._backend.cache.usage() == before - 4096
    np.testing.assert_array_equal(s.read_range(0, 3000), want)  # fetched again, verified
    assert s.verify()["bytes"] == local.verify()["bytes"]


def test_rebuilt_store_under_the_same_url_never_sees_old_pages(s3_server, tmp_path):
    url = _url()
    old_docs, new_docs = _corpus(n_docs=300, seed=5), _corpus(n_docs=300, seed=6)
    old = _build_with_page(url, old_docs, s3_server.options, 4096)
    s_old = _open(old, s3_server.options, tmp_path)
    n = min(old.num_tokens, 4000)
    old_tokens = s_old.read_range(0, n)
    from mmpack._src.remote.writer import RemoteStoreWriter

    with RemoteStoreWriter(
        url, storage_options=s3_server.options, check_block_bytes=4096, overwrite=True
    ) as w:
        w.add_many(new_docs)
    s_new = mmpack.open(url, storage_options=s3_server.options, cache_dir=tmp_path, cache_limit=GiB)
    assert s_new.fingerprint != s_old.fingerprint
    local = mmpack.build(tmp_path / "local", new_docs)
    m = min(local.num_tokens, 4000)
    np.testing.assert_array_equal(s_new.read_range(0, m), local.read_range(0, m))
    assert s_new._backend.stats["bytes_fetched"] > 0
    np.testing.assert_array_equal(s_old.read_range(0, n), old_tokens)  # old reader: old bytes


def test_a_cache_file_from_another_boot_is_discarded(s3_server, tmp_path, monkeypatch):
    store = _build_with_page(_url(), _corpus(n_docs=300), s3_server.options, 4096)
    s = _open(store, s3_server.options, tmp_path)
    want = s.read_range(0, 5000)
    del s
    monkeypatch.setattr(cache_mod, "_BOOT", b"\x01" * 16)  # "after a reboot"
    s2 = _open(store, s3_server.options, tmp_path)
    cf = s2._backend.node_cache.file()
    assert int(cf.state.sum()) == 0  # nothing trusted from the other boot
    np.testing.assert_array_equal(s2.read_range(0, 5000), want)
    assert s2._backend.stats["bytes_fetched"] > 0


# ----------------------------------------------------------------------------- workers
@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_share_the_cache(s3_server, tmp_path, context):
    docs = _corpus()
    store = mmpack.build(_url(), docs, storage_options=s3_server.options)
    s = _open(store, s3_server.options, tmp_path)
    local = mmpack.build(tmp_path / "local", docs)
    ds = mmpack.WindowDataset(s, 128)
    ds.__getitems__([0, 1, 2])  # the parent maps the cache before the workers start
    want = mmpack.WindowDataset(local, 128)
    for _ in range(2):  # the second pass is served by the cache the first one filled
        assert_workers_serve(ds, want, context, seed=3, keys=("input_ids",))
    cf = _open(store, s3_server.options, tmp_path)._backend.node_cache.file()
    ids = s._backend.fetcher.page_ids(*ds._ranges(np.arange(len(ds), dtype=np.int64) * ds.stride))
    assert cf.present(ids).all()


def test_fetch_shared_stores_claimed_and_gap_pages_and_reports_the_rest(tmp_path):
    """The one claim loop both remote backends use: pages fetched here are stored (the
    merge-gap extras too, where nobody holds them); what the limit refuses is reported."""
    page = 4096
    cache = PageCache(tmp_path, GiB)
    cf = cache.open_file("a" * 16, "tokens", 8 * page, page, np.dtype("<u2"))
    assert cf is not None
    asked: list[list[int]] = []

    def fetch(ids: list[int]) -> dict[int, bytes]:
        asked.append(list(ids))
        return {b: bytes([b]) * page for b in range(ids[0], ids[-1] + 1)}  # fills gaps

    fetched, unstored = cache.fetch_shared(cf, [1, 3], fetch, timeout=5.0)
    assert asked == [[1, 3]] and sorted(fetched) == [1, 2, 3] and unstored == []
    assert cf.present(np.arange(8)).tolist() == [b in (1, 2, 3) for b in range(8)]
    assert bytes(cf.page_bytes(2)) == bytes([2]) * page
    again, rest = cache.fetch_shared(cf, [2], fetch, timeout=5.0)  # present: nothing claimed
    assert again == {} and rest == [] and len(asked) == 1
    full = PageCache(tmp_path / "full", cache.base_charge(8) + page)  # room for one page
    cf2 = full.open_file("b" * 16, "tokens", 8 * page, page, np.dtype("<u2"))
    assert cf2 is not None
    fetched, unstored = full.fetch_shared(cf2, [5, 6], fetch, timeout=5.0)
    assert sorted(fetched) == [5, 6] and unstored == [6]
    assert cf2.present(np.array([5, 6])).tolist() == [True, False]


def test_a_run_written_and_dropped_at_once_equals_its_pages_one_by_one(tmp_path):
    """``write_run``/``drop_run`` (one write, one hole per run) leave the state, digests and
    charges that ``write``/``drop`` of each page leave, also for a short last page."""
    from mmpack._src.remote.cache import PageCache

    page, nbytes = 4096, 4096 * 5 + 1000
    data = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    one = PageCache(tmp_path / "one", 1 << 30).open_file("f", "t", nbytes, page, np.uint8)
    run = PageCache(tmp_path / "run", 1 << 30).open_file("f", "t", nbytes, page, np.uint8)
    assert one is not None and run is not None
    for b in range(1, 6):
        one.write(b, data[b * page : (b + 1) * page])
    run.write_run(1, data[page:])
    np.testing.assert_array_equal(run.state, one.state)
    np.testing.assert_array_equal(run.digests, one.digests)
    np.testing.assert_array_equal(run.checked, one.checked)
    assert bytes(run.data[page:]) == data[page:]
    freed_one = sum(one.drop(b) for b in range(2, 6))
    assert run.drop_run(2, 6) == freed_one
    np.testing.assert_array_equal(run.state, one.state)
