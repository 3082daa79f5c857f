"""The foreign index cache (mmpack._src.formats.foreign), through EOS-separated files: an index
cached by the file's identity in the cache, never beside the file; a rewrite (its mtime put back
or just before the open) never served the old index; a stale index caught by verify() and
removed; an unwritable cache warns and opens uncached."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from _olmo import olmo_docs as _docs
from _olmo import write_olmo

import mmpack
from mmpack._src.formats import eos_separated as eos_mod
from mmpack._src.formats import foreign
from mmpack._src.formats.eos_separated import open_eos_separated
from mmpack.errors import FormatError

pytestmark = pytest.mark.usefixtures("foreign_cache")


def test_index_is_cached_by_identity_never_beside_the_file(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    path = data / "tokens.bin"
    write_olmo(path, _docs(np.random.default_rng(2), 20, 500), eos=0)
    before = sorted(os.listdir(data))
    first = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert sorted(os.listdir(data)) == before
    assert list((tmp_path / "cache" / "eos-separated").glob("index-*.npy"))

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned again")

    with monkeypatch.context() as m:
        m.setattr(eos_mod, "eos_offsets", no_scan)
        again = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    np.testing.assert_array_equal(again.offsets, first.offsets)
    assert again.fingerprint == first.fingerprint
    flat = np.fromfile(path, dtype=np.uint16)
    flat[:4] = [9, 0, 9, 0]  # rewritten: same size, new content and mtime
    flat.tofile(path)
    changed = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert changed.fingerprint != first.fingerprint
    assert changed.offsets[:3].tolist() == [0, 2, 4]
    mine = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "mine")
    assert list((tmp_path / "mine" / "eos-separated").glob("index-*.npy"))
    assert mine.cache_dir.is_relative_to(tmp_path / "mine")


def _big_file(path):
    rng = np.random.default_rng(3)
    flat = rng.integers(1, 1000, 3 << 20).astype(np.uint16)  # 6 MiB
    flat[::1000] = 0
    flat.tofile(path)
    return flat


def _rewrite_middle_keeping_mtime(path):
    """One token in the middle (not a multiple of 1000 tokens) set to EOS, the mtime put back:
    size, mtime, inode and the first and last MiB are unchanged."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(2 * (3 << 19) + 2)
        f.write(np.uint16(0).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_rewrite_with_its_mtime_restored_is_never_served_the_old_index(tmp_path, monkeypatch):
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 50_000_000)
    path = tmp_path / "big.bin"
    _big_file(path)
    time.sleep(0.1)  # settled: the first open caches its index
    store = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert list((tmp_path / "cache" / "eos-separated").glob("index-*.npy"))
    _rewrite_middle_keeping_mtime(path)
    again = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert again.offsets.size == store.offsets.size + 1  # scanned again: a new ctime
    assert again.fingerprint != store.fingerprint


def test_a_file_changed_just_before_the_open_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 60_000_000_000)
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5)], eos=0)
    mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert not list((tmp_path / "cache").rglob("index-*"))


def test_verify_catches_a_stale_cached_index(tmp_path):
    """A cached index that no longer matches the file (here: replaced behind mmpack's back, as a
    file system without ctime would allow) is served until verify() finds the difference and
    removes it."""
    path = tmp_path / "big.bin"
    flat = _big_file(path)
    store = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert store.verify()["recorded"]
    (index,) = (tmp_path / "cache" / "eos-separated").glob("index-*.npy")
    wrong = store.offsets.copy()
    wrong[1] += 1
    np.save(index, wrong)
    stale = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    np.testing.assert_array_equal(stale.offsets, wrong)
    with pytest.raises(FormatError, match="EOS positions changed.*index was removed"):
        stale.verify()
    fresh = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")  # scanned again
    np.testing.assert_array_equal(fresh.offsets, store.offsets)
    assert np.concatenate(list(fresh)).size == flat.size


def test_an_unwritable_cache_warns_and_opens_uncached(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    (tmp_path / "a-file").write_text("")
    with pytest.warns(UserWarning, match="could not cache the document index"):
        store = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "a-file" / "c")
    assert [d.tolist() for d in store] == [[1, 2, 3, 4, 0], [1, 2, 0]]
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
