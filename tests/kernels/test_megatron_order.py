"""Megatron's sample index kernel against its twin and Megatron's own helper."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_sample_index

from mmpack._src.formats import megatron_order
from mmpack._src.kernels.megatron_order import fill_sample_index

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.helpers_cpp import build_sample_idx_int32

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


@settings(max_examples=300)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    epochs=st.integers(1, 3),
    seqlen=st.integers(1, 12),
    extra=st.integers(0, 1),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_sample_index_kernel_equals_its_twin_and_megatrons_helper(
    sizes, epochs, seqlen, extra, drop_last, seed
):
    sizes = np.array(sizes, dtype=np.int32)
    total = epochs * int(sizes.sum())
    if total == 0:
        return
    di = np.tile(np.arange(sizes.size, dtype=np.int32), epochs)
    np.random.default_rng(seed).shuffle(di)
    n = megatron_order._num_samples(total, seqlen, extra, drop_last)
    ours = np.empty((n + 1, 2), dtype=np.int32)
    fill_sample_index(sizes, di, seqlen, extra, total, ours)
    np.testing.assert_array_equal(ours, ref_sample_index(sizes, di, seqlen, extra, n))
    theirs = build_sample_idx_int32(sizes, di, seqlen, epochs, total // epochs, drop_last, extra)
    np.testing.assert_array_equal(ours, theirs)
