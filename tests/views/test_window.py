"""The window view, specified against a naive Python implementation of its semantics.

Run: ``make test`` (or ``.venv/bin/python -m pytest tests/views/test_window.py``).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _windows import corpora, naive_windows
from hypothesis import given
from hypothesis import strategies as st
from reference import naive_stream

import mmpack
from mmpack import WindowDataset

BACKENDS = ["memmap", "zarr"]

# The seed's table: ten documents, lengths given with their eot, tokens 0..n-2, eot 420.
SEED_LENGTHS = [15, 13, 11, 13, 15, 8, 14, 8, 11, 10]
SEED_DOCS = [list(range(n - 1)) for n in SEED_LENGTHS]


def assert_samples_equal(got, want, dtype=np.int64):
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], np.asarray(want[key]), err_msg=key)
        assert got[key].dtype == (np.int32 if key == "cu_seqlens" else dtype), key


# ----------------------------------------------------------------------------- the seed
@pytest.mark.parametrize(("seqlen", "stride", "expected"), [(8, 4, 28), (10, 5, 22), (10, 10, 11)])
def test_seed_example_counts(tmp_path, seqlen, stride, expected):
    """The seed's table: 118 tokens with eots; (118 - W) // stride + 1 windows (the seed's
    per-phase formula reports 26 for seqlen 8 / stride 4, dropping the last window of a phase)."""
    store = mmpack.build(tmp_path / "s", SEED_DOCS)
    ds = WindowDataset(store, seqlen, stride, eot=420)
    assert len(ds) == expected
    want = naive_windows(SEED_DOCS, seqlen, stride, 420, False, True, 0)
    assert len(want) == expected
    for i in range(expected):
        assert_samples_equal(ds[i], want[i])


def test_seed_example_windows(tmp_path):
    """The sample the seed says its code gets wrong (its i=13 for seqlen 10 / stride 5)."""
    ds = WindowDataset(mmpack.build(tmp_path / "s", SEED_DOCS), 10, 5, eot=420)
    assert ds[0]["input_ids"].tolist() == list(range(10))
    assert ds[1]["input_ids"].tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13, 420]
    assert ds[2]["input_ids"].tolist() == [10, 11, 12, 13, 420, 0, 1, 2, 3, 4]
    assert ds[2]["cu_seqlens"].tolist() == [0, 5, 10]
    assert ds[2]["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    # The last window (105..115 of 118 stream tokens) stays inside the stream: reading past
    # the end never wraps around to document 0 as the seed's code does.
    stream, _ = naive_stream(SEED_DOCS, 420)
    assert ds[-1]["input_ids"].tolist() == stream[105:115]
    with pytest.raises(IndexError):
        ds[len(ds)]


# ----------------------------------------------------------------------------- properties


@pytest.mark.slow
@given(
    docs=corpora,
    seqlen=st.integers(1, 24),
    stride=st.integers(1, 30),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
    backend=st.sampled_from(BACKENDS),
)
def test_windows_match_reference(
    tmp_path_factory, docs, seqlen, stride, use_eot, labels, drop_last, backend
):
    eot = 99999 if use_eot else None
    path = tmp_path_factory.mktemp("w") / "s"
    store = mmpack.build(path, docs, backend=backend)
    ds = WindowDataset(store, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last, pad_id=7)
    want = naive_windows(docs, seqlen, stride, eot, labels, drop_last, 7)
    assert len(ds) == len(want)
    for i, w in enumerate(want):
        assert_samples_equal(ds[i], w)
        assert_samples_equal(ds[i - len(ds)], w)
    if want:
        order = np.random.default_rng(0).integers(0, len(want), size=2 * len(want))
        for got, i in zip(ds.__getitems__(order), order):
            assert_samples_equal(got, want[i])


@given(docs=corpora, seqlen=st.integers(1, 16), stride=st.integers(1, 20), use_eot=st.booleans())
def test_length_formula(tmp_path_factory, docs, seqlen, stride, use_eot):
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs)
    total = store.num_tokens + (len(docs) if use_eot else 0)
    ds = WindowDataset(store, seqlen, stride, eot=1 if use_eot else None)
    assert len(ds) == max(0, (total - seqlen) // stride + 1)


@given(docs=corpora, seqlen=st.integers(1, 16), stride=st.integers(1, 16))
def test_no_token_left_out_without_drop_last(tmp_path_factory, docs, seqlen, stride):
    """drop_last=False with stride <= seqlen: every stream position is in some window."""
    stride = min(stride, seqlen)
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs)
    ds = WindowDataset(store, seqlen, stride, eot=5, drop_last=False)
    total = store.num_tokens + len(docs)
    covered = np.zeros(total, dtype=bool)
    for i in range(len(ds)):
        covered[i * stride : i * stride + seqlen] = True
    assert covered.all()


@given(docs=corpora, seqlen=st.integers(1, 16), stride=st.integers(1, 16), use_eot=st.booleans())
def test_locate_reconstructs_the_window(tmp_path_factory, docs, seqlen, stride, use_eot):
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs)
    eot = 123456 if use_eot else None
    ds = WindowDataset(store, seqlen, stride, eot=eot, labels=True, drop_last=False)
    for i in range(len(ds)):
        rebuilt = []
        for piece in ds.locate(i):
            assert piece["at"] == len(rebuilt)
            rebuilt.extend(store[piece["doc"]][piece["start"] : piece["stop"]].tolist())
            rebuilt.extend([eot] if piece["eot"] else [])
        sample = ds[i]
        want = np.concatenate([sample["input_ids"][:1], sample["labels"]])[: len(rebuilt)]
        assert rebuilt == want.tolist()


def test_a_path_is_opened_as_packed_dataset_opens_it(tmp_path):
    store = mmpack.build(tmp_path / "s", SEED_DOCS)
    for path in (tmp_path / "s", str(tmp_path / "s")):
        ds = WindowDataset(path, 8, 4, eot=420)
        assert len(ds) == 28 and ds.store.fingerprint == store.fingerprint
        assert_samples_equal(ds[2], WindowDataset(store, 8, 4, eot=420)[2])
    with pytest.raises(FileNotFoundError):
        WindowDataset(tmp_path / "nope", 8)


# ----------------------------------------------------------------------------- contract details
def test_bad_parameters(tmp_path):
    store = mmpack.build(tmp_path / "s", [[1, 2, 3]])
    for seqlen, stride in [(0, None), (-1, None), (4, 0), (4, -2)]:
        with pytest.raises(ValueError, match="seqlen|stride"):
            WindowDataset(store, seqlen, stride)
    with pytest.raises(TypeError, match="seqlen"):
        WindowDataset(store, 2.5)
    with pytest.raises(TypeError, match="store"):
        WindowDataset([[1, 2]], 4)


def test_indexing_errors(tmp_path):
    ds = WindowDataset(mmpack.build(tmp_path / "s", [list(range(10))]), 4)
    assert len(ds) == 2
    with pytest.raises(IndexError, match="2"):
        ds[2]
    with pytest.raises(IndexError, match="-3"):
        ds[-3]
    for bad in (1.0, "0", None, True):
        with pytest.raises(TypeError):
            ds[bad]
    with pytest.raises(IndexError):
        ds.__getitems__([0, 5])
    with pytest.raises(TypeError):
        ds.__getitems__([0.5])
    assert len(ds.__getitems__([])) == 0
    np.testing.assert_array_equal(ds[np.int32(1)]["input_ids"], [4, 5, 6, 7])


def test_store_shorter_than_a_window(tmp_path):
    ds = WindowDataset(mmpack.build(tmp_path / "s", [[1, 2]]), 8)
    assert len(ds) == 0
    padded = WindowDataset(ds.store, 8, drop_last=False, labels=True, pad_id=-1)
    assert len(padded) == 1
    sample = padded[0]
    assert sample["input_ids"].tolist() == [1, 2, -1, -1, -1, -1, -1, -1]
    assert sample["labels"].tolist() == [2] + [-100] * 7
    assert sample["cu_seqlens"].tolist() == [0, 2, 8]
    empty = WindowDataset(mmpack.build(tmp_path / "e", []), 1, drop_last=False)
    assert len(empty) == 0


def test_stride_larger_than_seqlen_skips_tokens(tmp_path):
    ds = WindowDataset(mmpack.build(tmp_path / "s", [list(range(20))]), 3, 5)
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == [
        [0, 1, 2],
        [5, 6, 7],
        [10, 11, 12],
        [15, 16, 17],
    ]


def test_pickles_small_and_reads_in_the_copy(tmp_path):
    ds = WindowDataset(mmpack.build(tmp_path / "s", SEED_DOCS), 8, 4, eot=420, labels=True)
    blob = pickle.dumps(ds)
    assert len(blob) < 2000
    copy = pickle.loads(blob)
    assert_samples_equal(copy[7], ds[7])


@given(
    lens=st.lists(st.integers(0, 12), min_size=257, max_size=1500),
    use_eot=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_sampled_index_finds_the_same_document(lens, use_eot, seed):
    """The two-level search (every 256th document start in memory) equals a plain searchsorted
    over the virtual document starts, including runs of empty documents."""
    from mmpack._src.kernels.window import INDEX_STEP, fill_sampled_index, find_doc

    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    e = int(use_eot)
    voff = offsets + np.arange(offsets.size) * e
    total = int(voff[-1])
    if total == 0:
        return
    top = np.empty((len(lens) - 1) // INDEX_STEP + 1, dtype=np.int64)
    fill_sampled_index(offsets, e, top)
    np.testing.assert_array_equal(top, voff[::INDEX_STEP][: top.size])
    for v in np.random.default_rng(seed).integers(0, total, size=200):
        want = int(np.searchsorted(voff, v, side="right")) - 1
        assert find_doc(offsets, top, e, int(v)) == want
        assert find_doc(offsets, top[:0], e, int(v)) == want


def test_sampled_index_gives_identical_windows(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 500, size=n) for n in rng.integers(0, 9, size=3000)]
    store = mmpack.build(tmp_path / "s", docs)
    plain = WindowDataset(store, 16, 5, eot=999, labels=True, drop_last=False, sampled_index=False)
    fast = WindowDataset(store, 16, 5, eot=999, labels=True, drop_last=False, sampled_index=True)
    assert fast._top.size > 1 and plain._top.size == 0
    idx = np.arange(len(plain))
    for a, b in zip(plain.__getitems__(idx), fast.__getitems__(idx)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    for i in (0, 17, len(plain) - 1):
        assert plain.locate(i) == fast.locate(i)
        np.testing.assert_array_equal(plain[i]["input_ids"], fast[i]["input_ids"])


# ----------------------------------------------------------------------------- dtype="int32"
@given(
    docs=st.lists(st.lists(st.integers(0, 60000), max_size=30), max_size=20),
    seqlen=st.integers(1, 20),
    stride=st.integers(1, 24),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
    backend=st.sampled_from(BACKENDS),
)
def test_int32_windows_match_reference(
    tmp_path_factory, docs, seqlen, stride, use_eot, labels, drop_last, backend
):
    """dtype="int32": the same samples (the slow twin) as int32 arrays, single and batched."""
    eot = 65535 if use_eot else None
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs, backend=backend, dtype=np.uint16)
    kw = dict(eot=eot, labels=labels, drop_last=drop_last, pad_id=7)
    ds = WindowDataset(store, seqlen, stride, dtype="int32", **kw)
    want = naive_windows(docs, seqlen, stride, eot, labels, drop_last, 7)
    assert len(ds) == len(want)
    for i, w in enumerate(want):
        got = ds[i]
        assert_samples_equal(got, w, np.int32)
        # One buffer holds the row, the positions and cu_seqlens: writing the positions leaves
        # the rest as read (labels are a view of the row by design: row[1:]).
        got["position_ids"][:] = -1
        rest = {k: v for k, v in w.items() if k != "position_ids"}
        assert_samples_equal({k: got[k] for k in rest}, rest, np.int32)
    if want:
        order = np.random.default_rng(0).integers(0, len(want), size=2 * len(want))
        for got, i in zip(ds.__getitems__(order), order):
            assert_samples_equal(got, want[i], np.int32)


def test_dtype_option_is_checked(tmp_path):
    small = mmpack.build(tmp_path / "u16", [[1, 2, 3]], dtype=np.uint16)
    wide = mmpack.build(tmp_path / "u32", [[1, 2, 3]], dtype=np.uint32)
    assert WindowDataset(small, 2).dtype == np.int64
    assert WindowDataset(small, 2, dtype=np.int32).dtype == np.int32
    with pytest.raises(ValueError, match="float32"):
        WindowDataset(small, 2, dtype="float32")
    with pytest.raises(TypeError, match="dtype"):
        WindowDataset(small, 2, dtype=object())
    with pytest.raises(ValueError, match="uint32"):
        WindowDataset(wide, 2, dtype="int32")
    with pytest.raises(ValueError, match="eot=2147483648"):
        WindowDataset(small, 2, eot=2**31, dtype="int32", check_vocab=False)
    with pytest.raises(ValueError, match="pad_id=-2147483649"):
        WindowDataset(small, 2, pad_id=-(2**31) - 1, dtype="int32", check_vocab=False)
    ds = pickle.loads(pickle.dumps(WindowDataset(small, 2, labels=True, dtype="int32")))
    assert ds.dtype == np.int32 and ds[0]["input_ids"].dtype == np.int32
    assert ds[0]["labels"].tolist() == [2, 3]
