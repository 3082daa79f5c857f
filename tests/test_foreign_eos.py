"""Flat EOS-separated token files (OLMo-core / Dolma layout, and numpy ``.npy``) opened in place.

OLMo-core itself is not installed here (only megatron-core is); these tests write its files the
way its source documents them (``olmo_core.data.utils``: a headerless ``np.memmap`` of uint16 or
uint32, EOS between documents, ``NAME.csv.gz`` of ``start,end`` per document) and compare with
``NumpyFSLDataset``'s documented instances (``tokens[i*L:(i+1)*L]`` for ``i < N // L``).

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/test_foreign_eos.py``
"""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack.errors import FormatError, StateMismatchError
from mmpack.formats import eos_separated as eos_mod
from mmpack.formats.eos_separated import EosSeparatedStore, open_eos_separated
from mmpack.kernels.eos import find_eos
from mmpack.views.window import WindowDataset


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- the kernel
def find_eos_slow(tokens, eos, base):
    """The specification of :func:`find_eos`."""
    return [base + i for i, t in enumerate(tokens.tolist()) if t == eos]


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


@given(
    st.lists(st.integers(0, 4), max_size=200),
    st.integers(0, 4),
    st.integers(0, 10**12),
    st.sampled_from(["<u1", "<u2", "<u4", "<u8"]),
)
def test_find_eos_matches_its_twin(values, eos, base, dtype):
    tokens = np.array(values, dtype=dtype)
    out = np.full(tokens.size, -1, dtype=np.int64)
    n = find_eos(tokens, eos, base, out)
    assert out[:n].tolist() == find_eos_slow(tokens, eos, base)
    assert (out[n:] == -1).all()


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

    monkeypatch.setattr(eos_mod, "eos_offsets", no_scan)
    again = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    np.testing.assert_array_equal(again.offsets, first.offsets)
    assert again.fingerprint == first.fingerprint
    monkeypatch.undo()
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    flat = np.fromfile(path, dtype=np.uint16)
    flat[:4] = [9, 0, 9, 0]  # rewritten: same size, new content and mtime
    flat.tofile(path)
    changed = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert changed.fingerprint != first.fingerprint
    assert changed.offsets[:3].tolist() == [0, 2, 4]
    mine = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "mine")
    assert list((tmp_path / "mine" / "eos-separated").glob("index-*.npy"))
    assert mine.cache_dir.is_relative_to(tmp_path / "mine")


def test_verify_catches_a_stale_index(tmp_path):
    """A middle token changed with the mtime put back: the identity (size, mtime, inode, first
    and last MiB) is unchanged so the cached index is reused; verify() finds the difference."""
    path = tmp_path / "big.bin"
    rng = np.random.default_rng(3)
    flat = rng.integers(1, 1000, 3 << 20).astype(np.uint16)  # 6 MiB
    flat[::1000] = 0
    flat.tofile(path)
    store = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    assert store.verify()["recorded"]
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(2 * (3 << 19) + 2)  # the middle, not a multiple of 1000 tokens
        f.write(np.uint16(0).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    stale = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")
    np.testing.assert_array_equal(stale.offsets, store.offsets)
    with pytest.raises(FormatError, match="EOS positions changed.*index was removed"):
        stale.verify()
    fresh = mmpack.open(path, format="eos-separated", eos=0, dtype="uint16")  # scanned again
    assert fresh.offsets.size == store.offsets.size + 1


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
