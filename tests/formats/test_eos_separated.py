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

import numpy as np
import pytest
from _olmo import olmo_docs as _docs
from _olmo import write_olmo
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack import WindowDataset
from mmpack._src.formats import eos_separated as eos_mod
from mmpack._src.formats.eos_separated import EosSeparatedStore, open_eos_separated
from mmpack.errors import FormatError, StateMismatchError

pytestmark = pytest.mark.usefixtures("foreign_cache")


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


# ----------------------------------------------------------------------------- pickling
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
