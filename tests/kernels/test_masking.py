"""The MLM kernel's own rules: its integer threshold is the float comparison, and the indexed kernel is the row keys, then the rows."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.kernels.masking import _threshold, mlm_indexed_rows
from mmpack._src.packing.masking import corrupt_rows, excluded_ids, row_keys


@given(p=st.floats(0, 1), delta=st.integers(-2, 2))
def test_integer_threshold_is_the_float_comparison(p, delta):
    """The kernel compares the 53-bit draw ``m`` as an integer against ``_threshold(p)``;
    that is exactly ``m * 2**-53 < p``, also next to the boundary."""
    t = int(_threshold(p))
    m = min(max(t + delta, 0), 2**53 - 1)
    assert (m < t) == (m * 2.0**-53 < p)
    assert (m < int(_threshold(0.8 * p))) == (m * 2.0**-53 < 0.8 * p)


@given(
    rows=st.integers(0, 3),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**40),
    mask_prob=st.floats(0, 1),
)
def test_indexed_kernel_is_keys_then_rows(rows, seed, epoch, mask_prob):
    """The one-call path of ``PackedDataset`` (keys computed in the kernel) corrupts exactly
    as :func:`row_keys` then :func:`corrupt_rows`."""
    rng = np.random.default_rng(seed % 2**32)
    ids = rng.integers(0, 120, size=(rows, 40))
    maskable = rng.integers(0, 2, size=(rows, 40))
    index = rng.integers(0, 2**40, size=rows)
    ex = excluded_ids(120, [3, 7], pad_id=0)
    want = ids.copy()
    want_labels = corrupt_rows(
        want,
        maskable,
        row_keys(seed, epoch, index),
        mask_prob=mask_prob,
        mask_id=1,
        vocab_size=120,
        excluded=ex,
    )
    labels = np.empty_like(ids)
    mlm_indexed_rows(
        ids, maskable, np.uint64(seed), np.uint64(epoch), index, ex, 117, mask_prob, 1, -100, labels
    )
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(labels, want_labels)
