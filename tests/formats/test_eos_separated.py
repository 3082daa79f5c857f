"""Flat EOS-separated token files (OLMo-core / Dolma layout, and numpy ``.npy``) opened in place.

OLMo-core itself is not installed here (only megatron-core is); these tests write its files the
way its source documents them (``olmo_core.data.utils``: a headerless ``np.memmap`` of uint16 or
uint32, EOS between documents, ``NAME.csv.gz`` of ``start,end`` per document) and compare with
``NumpyFSLDataset``'s documented instances (``tokens[i*L:(i+1)*L]`` for ``i < N // L``).

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/formats/test_eos_separated.py``
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack import WindowDataset
from mmpack._src.formats import eos_separated as eos_mod
from mmpack._src.formats import foreign
from mmpack._src.formats.eos_separated import EosSeparatedStore, open_eos_separated
from mmpack.errors import FormatError, StateMismatchError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    # files written by a test are seconds old at most: cache their index all the same
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 0)


# ----------------------------------------------------------------------------- the kernel
def eos_documents_slow(tokens, eos):
    """Documents of a flat file: each ends with its eos; a tail without one is the last."""
    docs, cur = [], []
    for t in tokens.tolist():
        cur.append(t)
        if t == eos:
            docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return docs


@given(st.lists(st.integers(0, 3), max_size=300), st.sampled_from([1, 2, 5, 64]))
def test_eos_offsets_match_the_slow_split_across_chunks(values, chunk):
    tokens = np.array(values, dtype="<u2")
    old = eos_mod._SCAN_CHUNK
    eos_mod._SCAN_CHUNK = chunk
    try:
        offsets = eos_mod.eos_offsets(tokens, 0)
    finally:
        eos_mod._SCAN_CHUNK = old
    docs = eos_documents_slow(tokens, 0)
    assert offsets.tolist() == np.concatenate(([0], np.cumsum([len(d) for d in docs]))).tolist()


# ----------------------------------------------------------------------------- OLMo-core layout
def write_olmo(path, docs, eos, dtype=np.uint16, tail=()):
    """What OLMo-core/Dolma write: the documents, each followed by eos, as a headerless memmap."""
    flat = np.concatenate([np.append(d, eos) for d in docs] + [np.asarray(tail, dtype=np.int64)])
    mm = np.memmap(path, dtype=dtype, mode="w+", shape=(flat.size,))
    mm[:] = flat
    mm.flush()
    del mm
    return flat.astype(dtype)


def write_olmo_metadata(path, dtype, eos):
    """``olmo_core.data.utils.write_document_indices``: ``start,end`` per EOS (end exclusive)."""
    tokens = np.memmap(path, mode="r", dtype=dtype)
    meta = path.with_suffix(".csv.gz")
    with gzip.open(meta, "wt") as f:
        start = 0
        for loc in (tokens == eos).nonzero()[0]:
            f.write(f"{start},{loc + 1}\n")
            start = loc + 1
    return meta


def numpy_fsl_instances(path, dtype, seqlen):
    """``NumpyFSLDataset`` over one file, per its source: file_size // (itemsize * L) instances,
    instance i = tokens[i*L : (i+1)*L]."""
    tokens = np.memmap(path, mode="r", dtype=dtype)
    count = os.path.getsize(path) // (np.dtype(dtype).itemsize * seqlen)
    return [np.asarray(tokens[i * seqlen : (i + 1) * seqlen]) for i in range(count)]


def _docs(rng, n, vocab):
    return [rng.integers(1, vocab, int(rng.integers(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("tail", [(), (7, 8, 9)])
def test_olmo_file_documents_and_fsl_instances(tmp_path, dtype, tail):
    rng = np.random.default_rng(0)
    docs = _docs(rng, 50, 60_000)
    path = tmp_path / "part-0-00000.npy"
    flat = write_olmo(path, docs, eos=0, dtype=dtype, tail=tail)
    store = mmpack.open(path, format="eos-separated", eos=0, dtype=np.dtype(dtype).name)
    assert isinstance(store, EosSeparatedStore)
    expected = [np.append(d, 0) for d in docs] + ([np.array(tail)] if tail else [])
    assert len(store) == len(expected)
    for ours, want in zip(store, expected):
        np.testing.assert_array_equal(ours, want)
    np.testing.assert_array_equal(np.concatenate(list(store)), flat)  # the file, exactly
    for seqlen in (1, 16, 100):
        windows = WindowDataset(store, seqlen)
        instances = numpy_fsl_instances(path, dtype, seqlen)
        assert len(windows) == len(instances)
        for i, inst in enumerate(instances):
            np.testing.assert_array_equal(windows[i]["input_ids"], inst)


def test_olmo_metadata_gives_the_same_documents(tmp_path):
    docs = _docs(np.random.default_rng(1), 30, 1000)
    path = tmp_path / "data.npy"
    write_olmo(path, docs, eos=0, dtype=np.uint16, tail=(5, 6))
    write_olmo_metadata(path, np.uint16, 0)
    scanned = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    listed = mmpack.open(path, format="eos-separated", dtype="uint16", metadata=True)
    np.testing.assert_array_equal(listed.offsets, scanned.offsets)
    with gzip.open(tmp_path / "gap.csv.gz", "wt") as f:
        f.write("0,3\n4,9\n")
    with pytest.raises(FormatError, match="contiguously"):
        open_eos_separated(path, dtype="uint16", metadata=tmp_path / "gap.csv.gz")


def test_npy_header_is_read_with_numpy(tmp_path):
    flat = np.array([5, 6, 0, 7, 0, 0, 8], dtype=np.uint32)
    path = tmp_path / "tokens.npy"
    np.save(path, flat)
    store = mmpack.open(path, eos=0)  # detected by its .npy name; dtype from the header
    assert store.dtype == np.dtype("<u4")
    assert [d.tolist() for d in store] == [[5, 6, 0], [7, 0], [0], [8]]
    with pytest.raises(ValueError, match="disagrees with the .npy header"):
        open_eos_separated(path, eos=0, dtype="uint16")
    np.save(tmp_path / "two.npy", np.zeros((2, 3), dtype=np.uint16))
    with pytest.raises(FormatError, match="1-D"):
        open_eos_separated(tmp_path / "two.npy", eos=0)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"dtype": "uint16"}, ValueError, "eos= is required"),
        ({"eos": 0}, ValueError, "pass dtype="),
        ({"eos": 70_000, "dtype": "uint16"}, ValueError, "eos must be < 65536"),
        ({"eos": True, "dtype": "uint16"}, TypeError, "eos must be an integer"),
        ({"eos": 0, "dtype": "float32"}, FormatError, "not token ids"),
        ({"eos": 0, "dtype": "uint64"}, FormatError, "not a whole number"),
    ],
)
def test_bad_options_are_refused(tmp_path, kwargs, exc, match):
    path = tmp_path / "raw.bin"
    np.arange(6, dtype=np.uint16).tofile(path)
    with pytest.raises(exc, match=match):
        mmpack.open(path, format="eos-separated", **kwargs)


# ----------------------------------------------------------------------------- the index cache
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


# ----------------------------------------------------------------------------- signed files
def test_negative_ids_are_refused_at_open_and_by_verify(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.array([5, -1, 0, 7, 0], dtype=np.int32))
    with pytest.raises(FormatError, match=r"1 negative token ids \(the first at token 1: -1"):
        mmpack.open(path, eos=0)
    meta = tmp_path / "t.csv.gz"
    with gzip.open(meta, "wt") as f:
        f.write("0,3\n3,5\n")
    with pytest.raises(FormatError, match="negative token ids"):
        mmpack.open(path, format="eos-separated", metadata=meta)
    # a file that was fine at open and then got a negative id: verify() refuses it
    np.save(path, np.array([5, 1, 0, 7, 0], dtype=np.int32))
    store = mmpack.open(path, eos=0)
    assert store[0].tolist() == [5, 1, 0] and store.dtype == np.dtype("<u4")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 8)
        f.write(np.int32(-3).tobytes())
    with pytest.raises(FormatError, match=r"1 negative token ids \(the first at token 3: -3"):
        store.verify()


# ----------------------------------------------------------------------------- verify_reads
def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("npy", [False, True])
def test_verify_reads_checks_each_block_against_the_sidecar(tmp_path, npy):
    rng = np.random.default_rng(4)
    flat = rng.integers(1, 1000, 9 << 20).astype(np.uint16)  # 18 MiB: 16 MiB blocks 0 and 1
    flat[::500] = 0
    at = (16 << 20) + 1000  # in block 1, outside the first and last MiB (the fingerprint's)
    flat[at // 2] = 5  # its low byte flipped below: 21, never an EOS
    path = tmp_path / ("t.npy" if npy else "t.bin")
    if npy:
        np.save(path, flat)
    else:
        flat.tofile(path)
    opts = {"eos": 0} if npy else {"eos": 0, "format": "eos-separated", "dtype": "uint16"}
    first = mmpack.open(path, verify_reads=True, **opts)  # no sidecar yet: recorded now
    assert first.verify_reads and first.tokens is None
    assert (first.cache_dir / "checksums.json").is_file()
    np.testing.assert_array_equal(first.read_range(0, 1000), flat[:1000])
    header = os.path.getsize(path) - flat.nbytes
    _flip(path, header + at)  # after the open: the mapping serves the new byte
    with pytest.raises(FormatError, match=r"t\.(npy|bin) stripe 1 .* differs from the checksum"):
        first.read_range(flat.size - 60, flat.size)
    np.testing.assert_array_equal(first.read_range(10, 20), flat[10:20])  # block 0 is fine
    store = mmpack.open(path, verify_reads=True, **opts)
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        WindowDataset(store, 64)[len(WindowDataset(store, 64)) - 1]
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        pickle.loads(pickle.dumps(store)).read_range(flat.size - 60, flat.size)
    plain = mmpack.open(path, **opts)  # the default serves the mapping unchecked
    assert plain.read_range(flat.size - 60, flat.size).size == 60
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        plain.verify()


# ----------------------------------------------------------------------------- read-only cache
def _verify_in_read_only_cache(path, cache):
    """verify() with ``cache`` bind-mounted read-only in a private mount namespace."""
    script = (
        "import sys, warnings, mmpack\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    s = mmpack.open({str(path)!r}, format='eos-separated', eos=0, dtype='uint16', "
        f"cache_dir={str(cache)!r})\n"
        "    r = s.verify()\n"
        "print(r['recorded'], r['sidecar'], any('could not keep the checksum sidecar' in "
        "str(x.message) for x in w))\n"
    )
    mount = (
        f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache} && "
        f'{sys.executable} -c "$0"'
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )


def test_verify_with_a_read_only_cache_verifies_and_warns(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    out = _verify_in_read_only_cache(path, cache)
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount read-only here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "None", "True"]
    assert not any(cache.rglob("*"))  # nothing could be written, nothing was


def test_verify_with_a_cache_path_through_a_file_warns_and_keeps_the_sums(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    (tmp_path / "a-file").write_text("")
    with pytest.warns(UserWarning, match="could not cache the document index"):
        store = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "a-file" / "c")
    with pytest.warns(UserWarning, match="could not keep the checksum sidecar"):
        first = store.verify()
    assert first["recorded"] and first["sidecar"] is None and first["blocks"] == 1
    assert not store.verify()["recorded"]  # checked against the sums kept in memory
    _flip(path, 2)
    with pytest.raises(FormatError, match="recorded in memory"):
        store.verify()


def test_pickling_reopens_and_refuses_changed_data(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    store = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    again = pickle.loads(pickle.dumps(store))
    assert [d.tolist() for d in again] == [[1, 2, 3, 4, 0], [1, 2, 0]]
    blob = pickle.dumps(store)
    write_olmo(path, [np.arange(1, 3), np.arange(1, 5)], eos=0)
    with pytest.raises(StateMismatchError):
        pickle.loads(blob)


def test_an_unwritable_cache_warns_and_opens_uncached(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    (tmp_path / "a-file").write_text("")
    with pytest.warns(UserWarning, match="could not cache the document index"):
        store = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "a-file" / "c")
    assert [d.tolist() for d in store] == [[1, 2, 3, 4, 0], [1, 2, 0]]
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
