"""Single ``ds[i]`` through the sampled index (``one_window`` with a non-empty ``top``), whose
kernel reads ahead the pages of the window's possible flat range before searching ``offsets``:
every window, including those at the stream's ends and over empty documents, equals the plain
search's (no sampled index) and the batched path's.  Rerun with NUMBA_BOUNDSCHECK=1 by
``make test`` (KERNEL_TESTS), which also proves the read-ahead stays within ``src``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import WindowDataset
from mmpack._src.kernels.window import INDEX_STEP


@settings(max_examples=12, deadline=None)
@given(
    n_docs=st.integers(INDEX_STEP + 1, 4 * INDEX_STEP),
    max_len=st.integers(0, 12),
    seqlen=st.integers(1, 40),
    stride=st.integers(1, 50),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
    dtype=st.sampled_from(["int64", "int32"]),
    seed=st.integers(0, 2**16),
)
def test_single_reads_with_sampled_index(
    tmp_path_factory, n_docs, max_len, seqlen, stride, use_eot, labels, drop_last, dtype, seed
):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 60000, size=n) for n in rng.integers(0, max_len + 1, size=n_docs)]
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs, dtype=np.uint16)
    kw = dict(eot=65535 if use_eot else None, labels=labels, drop_last=drop_last, dtype=dtype)
    fast = WindowDataset(store, seqlen, stride, sampled_index=True, pad_id=7, **kw)
    plain = WindowDataset(store, seqlen, stride, sampled_index=False, pad_id=7, **kw)
    assert fast._top.size > 1 and plain._top.size == 0
    idx = np.arange(len(fast))
    for i, want in zip(idx.tolist(), plain.__getitems__(idx)):
        got, ref = fast[i], plain[i]
        assert got.keys() == want.keys() == ref.keys()
        for key in got:
            assert got[key].dtype == ref[key].dtype
            np.testing.assert_array_equal(got[key], ref[key])
            np.testing.assert_array_equal(got[key], want[key])


def test_windows_equal_the_naive_stream_with_sampled_index(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) for n in [3, 0, 5, 1] * INDEX_STEP]
    store = mmpack.build(tmp_path / "s", docs, dtype=np.uint16)
    stream = np.concatenate([np.append(d, 9) for d in docs]).astype(np.int64)
    ds = WindowDataset(store, 5, 3, eot=9, labels=True, drop_last=True, sampled_index=True)
    assert ds._top.size > 1 and len(ds) == (stream.size - 6) // 3 + 1
    for i in [0, 1, len(ds) // 2, len(ds) - 2, len(ds) - 1]:
        s = ds[i]
        np.testing.assert_array_equal(s["input_ids"], stream[3 * i : 3 * i + 5])
        np.testing.assert_array_equal(s["labels"], stream[3 * i + 1 : 3 * i + 6])
    with pytest.raises(IndexError):
        ds[len(ds)]
