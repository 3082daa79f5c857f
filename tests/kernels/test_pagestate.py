"""The node cache's kernels against their slow twins (hypothesis): ``all_pages_present``
(``mmpack._src.kernels.pagestate``) and ``check_ranges`` (``mmpack._src.kernels.store``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import all_pages_present_slow, check_ranges_slow

from mmpack._src.kernels.pagestate import all_pages_present
from mmpack._src.kernels.store import check_ranges
from mmpack._src.store.integrity import stripe_digest


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
    assert all_pages_present(state, starts, lengths, itemsize, shift) == all_pages_present_slow(
        state, starts, lengths, itemsize, shift
    )


def test_no_ranges_and_full_state():
    empty = np.empty(0, np.int64)
    assert all_pages_present(np.empty(0, np.uint8), empty, empty, 2, 14)
    state = np.ones(4, np.uint8)
    assert all_pages_present(state, np.array([0, 8191], np.int64), np.array([8192, 1]), 2, 14)
    assert not all_pages_present(state, np.array([32767], np.int64), np.array([2]), 2, 14)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=700), st.integers(3, 7), st.sampled_from([1, 2, 4]), st.data())
def test_check_ranges_matches_its_twin(data, shift, itemsize, draw):
    """Random bytes and block sizes (a short last block included), digests right or wrong,
    blocks present or not, checked or not, ranges overlapping, empty, before 0 or past the
    end."""
    nblocks = -(-len(data) // (1 << shift))

    def per_block(values):
        return draw.draw(st.lists(values, min_size=nblocks, max_size=nblocks))

    good = [stripe_digest(data[b << shift : (b + 1) << shift]) for b in range(nblocks)]
    digests = np.array([g ^ int(w) for g, w in zip(good, per_block(st.booleans()))], np.uint64)
    state = np.array(per_block(st.sampled_from([0, 1, 1])), np.uint8)
    checked = np.array(per_block(st.sampled_from([0, 0, 1])), np.uint8)
    ranges = draw.draw(st.lists(st.tuples(st.integers(-3, 800), st.integers(-2, 300)), max_size=8))
    starts = np.array([a for a, _ in ranges], np.int64)
    lengths = np.array([n for _, n in ranges], np.int64)
    raw = np.frombuffer(data, np.uint8)
    words = raw[: raw.size // 8 * 8].view("<u8")
    bad = np.empty(nblocks, np.int64)
    out = checked.copy()
    n = check_ranges(raw, words, state, digests, out, starts, lengths, itemsize, shift, bad)
    want_bad, want_checked = check_ranges_slow(
        data, state, digests, checked, starts, lengths, itemsize, shift
    )
    assert bad[:n].tolist() == want_bad
    np.testing.assert_array_equal(out, want_checked)
