"""``mmpack.kernels.blockstate.all_blocks_present`` against its slow twin (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpack.kernels.blockstate import all_blocks_present


def _twin(state, starts, lengths, itemsize, shift):
    for a, n in zip(starts.tolist(), lengths.tolist()):
        if n <= 0:
            continue
        lo, hi = a * itemsize, (a + n) * itemsize
        if lo < 0:
            return False
        for b in range(lo // (1 << shift), (hi - 1) // (1 << shift) + 1):
            if b >= state.shape[0] or state[b] != 1:
                return False
    return True


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 1, 1, 2]), max_size=40),
    st.lists(st.tuples(st.integers(-3, 700), st.integers(-2, 300)), max_size=12),
    st.sampled_from([1, 2, 4]),
    st.integers(0, 6),
)
def test_all_blocks_present_matches_its_twin(state, ranges, itemsize, shift):
    state = np.array(state, dtype=np.uint8)
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    lengths = np.array([n for _, n in ranges], dtype=np.int64)
    assert all_blocks_present(state, starts, lengths, itemsize, shift) == _twin(
        state, starts, lengths, itemsize, shift
    )


def test_no_ranges_and_full_state():
    empty = np.empty(0, np.int64)
    assert all_blocks_present(np.empty(0, np.uint8), empty, empty, 2, 14)
    state = np.ones(4, np.uint8)
    assert all_blocks_present(state, np.array([0, 8191], np.int64), np.array([8192, 1]), 2, 14)
    assert not all_blocks_present(state, np.array([32767], np.int64), np.array([2]), 2, 14)
