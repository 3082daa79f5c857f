"""The single-sample path (``ds[i]``) against the batched path (``__getitems__``), and its
window kernel against the naive stream.

``ds[i]`` skips the general index checks for ints and ``EpochIndex``, makes one ordinary call of
its view's kernel (:func:`mmpack._src.kernels.window.one_window`,
:func:`mmpack._src.kernels.packed_rows.one_bin`) into one buffer and slices it into the sample; the
batch path is a separate kernel over pooled 2-D arrays.  Both must give the same sample: keys,
dtypes, shapes, values (MLM corruption included, keyed by the epoch an index carries), for
random stores and every option that changes the layout.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_window

import mmpack
from mmpack import PackedDataset, WindowDataset
from mmpack._src.kernels.window import META_FIELDS, one_window
from mmpack.store import EpochIndex

corpora = st.lists(st.lists(st.integers(0, 30000), max_size=40), min_size=1, max_size=25)


def assert_same(single, batched):
    assert sorted(single) == sorted(batched)  # same keys
    for key, want in batched.items():
        got = single[key]
        if key == "max_seqlen":
            assert type(got) is int and got == want
            continue
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, key
        assert got.shape == want.shape and got.tolist() == want.tolist(), key
        assert got.flags.c_contiguous and got.flags.writeable, key


def _indices(n, data):
    return data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12)) if n else []


@settings(max_examples=40, deadline=None)
@given(
    docs=corpora,
    seqlen=st.integers(1, 24),
    stride=st.integers(1, 30),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
    sampled_index=st.booleans(),
    dtype=st.sampled_from(["int64", "int32"]),
    data=st.data(),
)
def test_window_single_matches_batch(
    tmp_path_factory, docs, seqlen, stride, use_eot, labels, drop_last, sampled_index, dtype, data
):
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs, dtype=np.uint16)
    ds = WindowDataset(
        store,
        seqlen,
        stride,
        eot=65535 if use_eot else None,
        labels=labels,
        drop_last=drop_last,
        pad_id=7,
        sampled_index=sampled_index,
        dtype=dtype,
    )
    idx = _indices(len(ds), data)
    batch = ds.__getitems__(idx)
    for i, want in zip(idx, batch):
        assert_same(ds[i], want)
        assert_same(ds[EpochIndex(i, 3)], want)  # an EpochIndex is an int to a window view
        assert_same(ds[np.int64(i)], want)  # the general path
        assert_same(ds[i - len(ds)], want)


@settings(max_examples=40, deadline=None)
@given(
    docs=corpora,
    seqlen=st.integers(1, 48),
    eot=st.one_of(st.none(), st.integers(0, 1000)),
    pad_id=st.integers(0, 1000),
    mode=st.sampled_from(["causal-next", "causal-hf", "mlm"]),
    long_docs=st.sampled_from(["split", "truncate", "drop"]),
    dtype=st.sampled_from(["int64", "int32"]),
    data=st.data(),
)
def test_packed_single_matches_batch(
    tmp_path_factory, docs, seqlen, eot, pad_id, mode, long_docs, dtype, data
):
    store = mmpack.build(tmp_path_factory.mktemp("p") / "s", docs, dtype=np.uint16)
    kw: dict = {"label_shift": mode.split("-")[1]} if mode != "mlm" else {}
    if mode == "mlm":
        kw = {"mode": "mlm", "mask_id": 30001, "vocab_size": 30002, "mask_prob": 0.5, "seed": 3}
    ds = PackedDataset(
        store,
        seqlen,
        eot=eot,
        pad_id=pad_id,
        long_docs=long_docs,
        cache=False,
        dtype=dtype,
        **kw,
    )
    idx = _indices(len(ds), data)
    epochs = data.draw(st.lists(st.integers(0, 5), min_size=len(idx), max_size=len(idx)))
    tagged = [EpochIndex(i, e) for i, e in zip(idx, epochs)]
    for i, e, want in zip(idx, epochs, ds.__getitems__(tagged)):
        assert_same(ds[EpochIndex(i, e)], want)  # the epoch travels with the index
        ds.set_epoch(e)
        assert_same(ds[i], want)  # a plain int takes the dataset's epoch
        assert_same(ds[np.int64(i)], want)
        assert_same(ds[i - len(ds)], want)


def test_epoch_index_out_of_range_is_refused(tmp_path):
    store = mmpack.build(tmp_path / "s", [[1, 2, 3, 4, 5]])
    for ds in (WindowDataset(store, 2), PackedDataset(store, 4)):
        with pytest.raises(IndexError):
            ds[EpochIndex(len(ds), 1)]
        with pytest.raises(TypeError):
            ds[True]


@settings(max_examples=30, deadline=None)
@given(
    docs=corpora,
    seqlen=st.integers(1, 12),
    use_eot=st.booleans(),
    labels=st.booleans(),
    sampled_index=st.booleans(),
    token_dtype=st.sampled_from([np.uint16, np.uint32]),
)
def test_the_single_window_kernel_matches_the_naive_stream(
    tmp_path_factory, docs, seqlen, use_eot, labels, sampled_index, token_dtype
):
    """``one_window`` (the kernel of a window view's ``ds[i]``) at every start of the virtual
    stream, into either layout (cu_seqlens in their own int32 array, or after the row and the
    positions in one int32 buffer), against the stream built the obvious way."""
    store = mmpack.build(tmp_path_factory.mktemp("k") / "s", docs, dtype=token_dtype)
    eot = 9 if use_eot else None
    stream, ends = [], []
    for d in docs:
        stream += d + ([eot] if use_eot else [])
        if use_eot or d:
            ends.append(len(stream))
    for dtype in ("int64", "int32") if token_dtype == np.uint16 else ("int64",):
        ds = WindowDataset(
            store, seqlen, eot=eot, labels=labels, sampled_index=sampled_index, dtype=dtype
        )
        width = ds.width
        for v in range(len(stream)):
            row, pos, cu = ref_window(stream, ends, v, seqlen, width, ds.pad_id)
            meta = ds._meta.copy()
            if dtype == "int32":
                meta[META_FIELDS - 1] = width + seqlen
                out = np.full(width + 2 * seqlen + 1, -1, np.int32)
                n = one_window(ds._src, ds._offsets, meta, v, out, out)
                got_cu = out[width + seqlen : width + seqlen + n]
            else:
                meta[META_FIELDS - 1] = 0
                out, got_cu = (
                    np.full(width + seqlen, -1, np.int64),
                    np.full(seqlen + 1, -1, np.int32),
                )
                n = one_window(ds._src, ds._offsets, meta, v, out, got_cu)
                got_cu = got_cu[:n]
            assert out[:width].tolist() == row and out[width : width + seqlen].tolist() == pos
            assert got_cu.tolist() == cu


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_copies_of_a_view_read_by_their_own_addresses(tmp_path, dtype):
    """A copy, a deep copy and an unpickled view each rebuild their own state and read the same
    samples once the original and its store are gone, also from threads sharing one view."""
    import copy
    import gc
    import pickle
    import threading

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 30000, int(n)).tolist() for n in rng.integers(1, 200, 300)]
    store = mmpack.build(tmp_path / "s", docs)
    ds = WindowDataset(store, 32, eot=1, labels=True, dtype=dtype)
    want = list(ds.__getitems__(list(range(len(ds)))))
    views = [copy.copy(ds), copy.deepcopy(ds), pickle.loads(pickle.dumps(ds))]
    del ds, store
    gc.collect()
    for v in views:
        for i in range(0, len(v), 5):
            assert_same(v[i], want[i])
    wrong = []

    def read(seed):
        for i in np.random.default_rng(seed).integers(0, len(views[0]), 500).tolist():
            if views[0][i]["input_ids"].tolist() != want[i]["input_ids"].tolist():
                wrong.append(i)

    threads = [threading.Thread(target=read, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
