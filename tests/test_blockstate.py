"""``mmpack.kernels.blockstate``'s kernels against their slow twins (hypothesis):
``all_blocks_present`` and ``check_ranges``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpack.kernels.blockstate import all_blocks_present, check_ranges
from mmpack.store.integrity import block_digest


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


def _check_twin(data: bytes, state, digests, checked, starts, lengths, itemsize, shift):
    """Each touched block hashed on its own by ``block_digest``; returns (bad ids, checked)."""
    checked = checked.copy()
    bad = []
    for a, n in zip(starts.tolist(), lengths.tolist()):
        lo = a * itemsize
        if n <= 0 or lo < 0:
            continue
        for b in range(lo >> shift, min((lo + n * itemsize - 1) >> shift, state.size - 1) + 1):
            if checked[b] != 0 or state[b] != 1:
                continue
            ok = block_digest("xxh64", data[b << shift : (b + 1) << shift]) == int(digests[b])
            checked[b] = 1 if ok else 2
            if not ok:
                bad.append(b)
    return bad, checked


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=700), st.integers(3, 7), st.sampled_from([1, 2, 4]), st.data())
def test_check_ranges_matches_its_twin(data, shift, itemsize, draw):
    """Random bytes and block sizes (a short last block included), digests right or wrong,
    blocks present or not, checked or not, ranges overlapping, empty, before 0 or past the
    end."""
    nblocks = -(-len(data) // (1 << shift))

    def per_block(values):
        return draw.draw(st.lists(values, min_size=nblocks, max_size=nblocks))

    good = [block_digest("xxh64", data[b << shift : (b + 1) << shift]) for b in range(nblocks)]
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
    want_bad, want_checked = _check_twin(
        data, state, digests, checked, starts, lengths, itemsize, shift
    )
    assert bad[:n].tolist() == want_bad
    np.testing.assert_array_equal(out, want_checked)
