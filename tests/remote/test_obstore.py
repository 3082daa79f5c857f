"""The obstore transport against a real S3 server: the same reads as the built-in client, and a refusal after fork."""

from __future__ import annotations

import pytest
from _contract import assert_views_equal
from _remote_stores import _corpus, _url
from _s3 import (
    isolate_cache_and_env,
)

import mmpack


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def test_obstore_client_reads_the_same_and_refuses_fork(s3_server, tmp_path):
    """The gs:// and az:// path (obstore), exercised on s3:// with client="obstore": same bytes;
    a forked child of a process that used obstore gets a clear error, not a hang."""
    import multiprocessing as mp

    docs = _corpus()
    store = mmpack.build(_url(), docs, storage_options=dict(s3_server.options, client="obstore"))
    local = mmpack.build(tmp_path / "local", docs)
    s = mmpack.open(
        store.location,
        storage_options=dict(s3_server.options, client="obstore"),
        cache_dir=tmp_path,
    )
    assert_views_equal(s, local, 128, every_row=False)
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_read_in_child, args=(s, q))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert "forked from one that used obstore" in q.get(timeout=5)


def _read_in_child(store, q):
    try:
        mmpack.open(store.location, **store._open_options)
        q.put("no error")
    except RuntimeError as exc:
        q.put(str(exc))
