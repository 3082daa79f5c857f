"""The single-sample fast path (``ds[i]``) against the batched path (``__getitems__``).

``ds[i]`` calls a kernel's compiled entry directly (:mod:`mmpack.kernels.entry`), skips the
general index checks for ints and ``EpochIndex``, and slices one buffer into the sample; the
batch path is a separate kernel over pooled 2-D arrays.  Both must give the same sample: keys,
dtypes, shapes, values (MLM corruption included, keyed by the epoch an index carries), for
random stores and every option that changes the layout.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack.core.validation import EpochIndex
from mmpack.kernels.entry import entry_point
from mmpack.kernels.window import one_window
from mmpack.views.packed import PackedDataset
from mmpack.views.window import WindowDataset
from mmpack.views.window_single import on_arrays

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


def test_entry_point_is_the_compiled_kernel(tmp_path):
    """The entry resolved for the single path gives what the dispatcher gives; a function that
    numba does not compile (NUMBA_DISABLE_JIT, or a plain function) is returned as is."""
    store = mmpack.build(tmp_path / "s", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], dtype=np.uint16)
    ds = WindowDataset(store, 3, eot=10, labels=True)
    args = (ds._src, ds._offsets, ds._meta)
    entry = entry_point(one_window, *args, 0, np.empty(1, np.int64), np.empty(1, np.int32))
    for v in range(0, ds.total - ds.width + 1):
        got, want = np.empty(7, np.int64), np.empty(7, np.int64)
        cu_got, cu_want = np.empty(4, np.int32), np.empty(4, np.int32)
        n_got = entry(*args, v, got, cu_got)
        n_want = one_window(*args, v, want, cu_want)
        assert n_got == n_want and got.tolist() == want.tolist()
        assert cu_got[:n_got].tolist() == cu_want[:n_want].tolist()

    def plain(x):
        return x

    assert entry_point(plain, 1) is plain


@settings(max_examples=25, deadline=None)
@given(
    docs=corpora,
    seqlen=st.integers(1, 12),
    use_eot=st.booleans(),
    labels=st.booleans(),
    sampled_index=st.booleans(),
    token_dtype=st.sampled_from([np.uint16, np.uint32]),
)
def test_address_kernels_match_the_array_kernel(
    tmp_path_factory, docs, seqlen, use_eot, labels, sampled_index, token_dtype
):
    """one_window_at(_flat), which rebuild the token and offsets arrays from the addresses in
    ``meta``, give what one_window gives on the arrays, at every window start, for each token
    dtype (each its own compiled version); so does the fallback used without numba."""
    store = mmpack.build(tmp_path_factory.mktemp("a") / "s", docs, dtype=token_dtype)
    for dtype in ("int64", "int32") if token_dtype == np.uint16 else ("int64",):
        ds = WindowDataset(
            store,
            seqlen,
            eot=9 if use_eot else None,
            labels=labels,
            sampled_index=sampled_index,
            dtype=dtype,
        )
        if len(ds) == 0:
            continue
        assert ds._meta[6] == ds._src.ctypes.data and ds._meta[9] == ds._offsets.shape[0]
        kernel, meta, sdt = ds._fast[:3]
        n, cut = ds._buflen, ds.width + ds.seqlen
        for v in range(0, ds.total):
            want, cu_want = np.full(cut, -1, ds.dtype), np.full(seqlen + 1, -1, np.int32)
            n_want = one_window(ds._src, ds._offsets, meta, v, want, cu_want)
            for fn in (kernel, partial(on_arrays, ds._src, ds._offsets)):
                got = np.full(n, -1, ds.dtype)
                if ds._one_buffer:
                    n_got = fn(meta, sdt, v, got)
                    cu_got = got[cut:]
                else:
                    cu_got = np.full(seqlen + 1, -1, np.int32)
                    n_got = fn(meta, sdt, v, got, cu_got)
                assert n_got == n_want and got[:cut].tolist() == want.tolist()
                assert cu_got[:n_got].tolist() == cu_want[:n_want].tolist()


def test_without_numba_the_single_path_falls_back_to_arrays(tmp_path, monkeypatch):
    """Where numba does not compile (entry_point returns the kernel itself), ds[i] calls
    one_window on the arrays (the address kernels have no Python version) and gives the same
    samples."""
    import mmpack.views.window_single as single

    store = mmpack.build(tmp_path / "s", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], dtype=np.uint16)
    for dtype in ("int64", "int32"):
        fast = WindowDataset(store, 3, eot=10, labels=True, dtype=dtype)
        monkeypatch.setattr(single, "entry_point", lambda kernel, *example: kernel)
        slow = WindowDataset(store, 3, eot=10, labels=True, dtype=dtype)
        monkeypatch.undo()
        assert isinstance(slow._fast[0], partial) and not isinstance(fast._fast[0], partial)
        assert slow._meta[6:10].tolist() == [0, 0, 0, 0]
        for i in range(len(fast)):
            assert_same(slow[i], fast[i])
            assert_same(fast[i], fast.__getitems__([i])[0])


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_copies_of_a_view_read_by_their_own_addresses(tmp_path, dtype):
    """``ds[i]`` reads the mappings by the addresses in ``meta``: a copy, a deep copy and an
    unpickled view each rebuild theirs (none shares the original's ``meta``), and read the same
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
    assert all(v._meta is not ds._meta for v in views)
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
