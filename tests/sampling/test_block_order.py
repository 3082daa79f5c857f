"""The block-window order (:mod:`mmpack._src.sampling.block_order`): its list model and its quality.

The quality tests measure real orders (fixed seeds, so they are deterministic) against the closed
form of the module docstring, with tolerances of many standard errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from _orders import naive_block_order
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.sampling.block_order import bounds_digest
from mmpack.sampling import BlockOrder, uniform_bounds


@st.composite
def block_orders(draw):
    sizes = draw(st.lists(st.integers(1, 9), min_size=0, max_size=40))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    window = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**64 - 1))
    epoch = draw(st.integers(0, 2**64 - 1))
    return bounds, window, seed, epoch


@given(block_orders(), st.data())
def test_matches_the_list_model(case, data):
    bounds, window, seed, epoch = case
    n = int(bounds[-1])
    order = BlockOrder(n, bounds, window_blocks=window, seed=seed)
    expected = naive_block_order(bounds, window, seed, epoch)
    assert order.map(np.arange(n), epoch).tolist() == expected
    # any positions, in any order, repeated
    if n:
        positions = data.draw(st.lists(st.integers(0, n - 1), max_size=30))
        got = order.map(np.array(positions, dtype=np.int64), epoch).tolist()
        assert got == [expected[p] for p in positions]
    # the windows: offsets, slots, and where each position falls
    offsets = order.window_offsets(epoch)
    assert offsets[0] == 0 and offsets[-1] == n and len(offsets) == order.n_windows + 1
    windows = order.window_of(np.arange(n), epoch)
    for w in range(order.n_windows):
        slots = order.window_slots(epoch, w)
        samples = [s for b in slots.tolist() for s in range(bounds[b], bounds[b + 1])]
        assert sorted(expected[offsets[w] : offsets[w + 1]]) == sorted(samples)
        assert (windows[offsets[w] : offsets[w + 1]] == w).all()


def test_one_window_is_a_permutation_of_all_samples():
    bounds = uniform_bounds(1000, 7)
    order = BlockOrder(1000, bounds, window_blocks=10**6, seed=4)
    assert order.n_windows == 1
    got = order.map(np.arange(1000), 3)
    assert sorted(got.tolist()) == list(range(1000))


def test_arguments_are_checked():
    order = BlockOrder(10, [0, 4, 10], window_blocks=1)
    with pytest.raises(IndexError, match=r"positions must lie in \[0, 10\)"):
        order.map(np.array([10]), 0)
    with pytest.raises(TypeError, match="integer array"):
        order.map(np.array([1.0]), 0)
    with pytest.raises(ValueError, match="epoch"):
        order.map(np.array([1]), -1)
    with pytest.raises(ValueError, match="window"):
        order.window_slots(0, 2)
    with pytest.raises(ValueError, match="end at n=11"):
        BlockOrder(11, [0, 4, 10])
    assert (
        bounds_digest(np.array([0, 4, 10])) == order.digest != bounds_digest(np.array([0, 5, 10]))
    )
    assert "blocks=2" in repr(order)


def test_pickles_without_its_caches():
    import pickle

    order = BlockOrder(100, uniform_bounds(100, 3), window_blocks=4, seed=9)
    before = order.map(np.arange(100), 5)
    back = pickle.loads(pickle.dumps(order))
    assert back._offsets == {} and back._windows == {}
    np.testing.assert_array_equal(back.map(np.arange(100), 5), before)


# -- quality ------------------------------------------------------------------------------------


def _window_block_ids(order, epoch, bounds):
    """Block id of the sample at each position of an epoch."""
    samples = order.map(np.arange(order.n), epoch)
    return np.searchsorted(bounds, samples, side="right") - 1


@pytest.mark.parametrize("S, W", [(16, 8), (4, 32), (64, 4), (1, 16)])
def test_same_block_pair_rate_matches_the_closed_form(S, W):
    """Two distinct positions of one window hold samples of one block with probability
    ``(S - 1) / (W S - 1)``: measured over every pair of neighbouring positions and every pair of
    positions of a batch of 8, over 40 epochs."""
    windows = 24
    n = S * W * windows
    bounds = uniform_bounds(n, S)
    order = BlockOrder(n, bounds, window_blocks=W, seed=12345)
    expected = (S - 1) / (W * S - 1)
    same = pairs = 0
    batch_same = batch_pairs = 0
    for epoch in range(40):
        block = _window_block_ids(order, epoch, bounds).reshape(windows, W * S)
        same += int((block[:, 1:] == block[:, :-1]).sum())
        pairs += block[:, 1:].size
        batches = block.reshape(
            -1, 8
        )  # a window holds a whole number of batches of 8 (W*S % 8 == 0)
        eq = batches[:, :, None] == batches[:, None, :]
        batch_same += int((eq.sum() - eq.shape[0] * 8) // 2)
        batch_pairs += batches.shape[0] * 28
    for got in (same / pairs, batch_same / batch_pairs):
        # the standard error of these estimates is below 0.003 for every case here
        assert abs(got - expected) < 0.012 + 0.05 * expected, (got, expected)


def test_epochs_are_independent():
    """Which blocks share a window is drawn afresh each epoch: a pair of blocks sharing a window
    in epoch e shares one in epoch e + 1 at the rate of any pair, ``(W - 1) / (B - 1)``; and a
    sample's position in one epoch does not predict its position in the next."""
    S, W, B = 2, 16, 4096
    n = S * B
    bounds = uniform_bounds(n, S)
    order = BlockOrder(n, bounds, window_blocks=W, seed=7)
    window_of_block = []
    position_of_sample = []
    for epoch in range(12):
        block = _window_block_ids(order, epoch, bounds)
        win = np.empty(B, dtype=np.int64)
        win[block] = np.arange(n) // (S * W)  # every block lies in one window
        window_of_block.append(win)
        pos = np.empty(n, dtype=np.int64)
        pos[order.map(np.arange(n), epoch)] = np.arange(n)
        position_of_sample.append(pos)
    expected = (W - 1) / (B - 1)
    for a, b in zip(window_of_block, window_of_block[1:]):
        # pairs of blocks sharing a window in epoch e: B (W - 1) / 2 = 30720, each sharing one
        # again with probability 0.0037: about 113 of them, standard error 0.00035 on the rate
        together = a[:, None] == a[None, :]
        again = b[:, None] == b[None, :]
        np.fill_diagonal(together, False)
        rate = (together & again).sum() / together.sum()
        assert abs(rate - expected) < 0.0015, (rate, expected)
    rs = [np.corrcoef(a, b)[0, 1] for a, b in zip(position_of_sample, position_of_sample[1:])]
    # r over 4096 independently placed blocks: standard error 1/64 = 0.016 each, 0.005 averaged
    assert max(map(abs, rs)) < 0.07 and abs(np.mean(rs)) < 0.025, rs


def test_window_index_is_not_correlated_with_block_id():
    """A block's window is a keyed draw: no trend with its id (early blocks are not read first),
    and every part of the corpus is spread evenly over the epoch."""
    S, W, B = 4, 8, 4096
    n = S * B
    bounds = uniform_bounds(n, S)
    order = BlockOrder(n, bounds, window_blocks=W, seed=99)
    rs = []
    for epoch in range(10):
        block = _window_block_ids(order, epoch, bounds)
        window = np.arange(n) // (S * W)
        rs.append(np.corrcoef(block, window)[0, 1])
        # each quarter of the corpus fills each quarter of the epoch evenly: 256 blocks per cell
        # on average (relative standard error 0.06), never 30% off
        table = np.zeros((4, 4))
        np.add.at(table, (block * 4 // B, window * 4 // (B // W)), 1)
        assert np.abs(table / (n / 16) - 1).max() < 0.3
    # r over 4096 blocks: standard error 0.016 each, 0.005 averaged over the 10 epochs
    assert abs(np.mean(rs)) < 0.02 and max(map(abs, rs)) < 0.065, rs
