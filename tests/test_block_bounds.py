"""Where samples live: ``WindowDataset.block_bounds``, ``Mixture(block_bytes=).block_bounds``, and
the block-window sampler over them."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import Mixture, ResumableSampler
from mmpack._src.core.validation import check_block_bounds
from mmpack.sampling import uniform_bounds

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from _orders import naive_block_order


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 500, size=int(n)) for n in rng.integers(1, 60, size=300)]
    return mmpack.build(tmp_path_factory.mktemp("bb") / "s.mmpack", docs, dtype="uint16")


def _span_tokens(ds, lo, hi):
    """Stored tokens spanned by the flat reads of windows ``lo .. hi - 1``."""
    starts, lengths = ds._ranges(np.arange(lo, hi, dtype=np.int64) * ds.stride)
    return int((starts + lengths).max() - starts.min())


@settings(max_examples=40, deadline=None)
@given(
    seqlen=st.integers(1, 40),
    stride=st.integers(1, 60),
    labels=st.booleans(),
    eot=st.sampled_from([None, 499]),
    drop_last=st.booleans(),
    block_bytes=st.integers(1, 3000),
)
def test_window_blocks_read_one_span_of_at_most_block_bytes(
    store, seqlen, stride, labels, eot, drop_last, block_bytes
):
    ds = mmpack.WindowDataset(
        store, seqlen, stride, labels=labels, eot=eot, drop_last=drop_last, pad_id=0
    )
    bounds = ds.block_bounds(block_bytes)
    check_block_bounds(bounds, len(ds))
    sizes = np.diff(bounds)
    assert len(set(sizes[:-1].tolist())) <= 1 and (sizes[-1:] <= sizes[:1]).all()  # equal sizes
    item = store.dtype.itemsize
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        span = _span_tokens(ds, lo, hi) * item
        assert span <= block_bytes or hi - lo == 1, (lo, hi, span)
    if len(ds) and ds.width * item <= block_bytes:  # as many windows as fit the bound
        per = int(sizes[0])
        assert ((per - 1) * ds.stride + ds.width) * item <= block_bytes
        assert (per * ds.stride + ds.width) * item > block_bytes or per == len(ds)


def test_window_block_bounds_arguments(store):
    ds = mmpack.WindowDataset(store, 16)
    for bad, error in ((0, ValueError), (-5, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="block_bytes"):
            ds.block_bounds(bad)
    # 2-byte tokens, 16-token windows: 4096 bytes hold 2048 tokens, 128 windows
    assert np.diff(ds.block_bounds(4096))[0] == 128


def test_sampler_over_a_window_view_reads_whole_blocks(store):
    ds = mmpack.WindowDataset(store, 8, labels=True)
    bounds = ds.block_bounds(200)  # 12 windows a block
    sampler = ResumableSampler(
        len(ds), seed=3, shuffle="blocks", block_bounds=bounds, window_blocks=4
    )
    order = list(sampler)
    assert sorted(order) == list(range(len(ds)))
    assert order == naive_block_order(bounds, 4, 3, 0)
    block_of = np.searchsorted(bounds, order, side="right") - 1
    offsets = sampler.block_order.window_offsets(0)
    for w, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):  # 4 whole blocks a window
        assert sorted(set(block_of[lo:hi].tolist())) == sorted(
            sampler.block_order.window_slots(0, w).tolist()
        )
        assert hi - lo == sum(np.diff(bounds)[sampler.block_order.window_slots(0, w)])


# -- mixtures --------------------------------------------------------------------------------------


class BlockSource:
    """``n`` items in blocks of ``per`` items (``block_bounds`` of any ``block_bytes``)."""

    def __init__(self, n, tag, per):
        self.n, self.tag, self.per = n, tag, per

    def __len__(self):
        return self.n

    def __getitem__(self, j):
        return {"x": np.array([self.tag, j], dtype=np.int64)}

    def block_bounds(self, block_bytes):
        return uniform_bounds(self.n, self.per)


def _draws(mixture):
    src, items = mixture.source_of_many(np.arange(len(mixture)))
    return src, items


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    per=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    weights=st.lists(st.integers(1, 10), min_size=4, max_size=4),
    num_samples=st.integers(0, 400),
    seed=st.integers(0, 2**64 - 1),
)
def test_mixture_blocks_read_one_span_per_source(lengths, per, weights, num_samples, seed):
    sources = [BlockSource(n, k, per[k]) for k, n in enumerate(lengths)]
    mixture = Mixture(
        sources, weights[: len(sources)], num_samples=num_samples, seed=seed, block_bytes=64
    )
    src, items = _draws(mixture)
    # every pass over a source visits each of its items once, whole blocks in some order
    for k, source in enumerate(sources):
        got = items[src == k]
        for p in range(0, got.size, source.n):
            chunk = got[p : p + source.n].tolist()
            assert len(set(chunk)) == len(chunk)
            if len(chunk) == source.n:
                assert sorted(chunk) == list(range(source.n))
    bounds = mixture.block_bounds(64)
    check_block_bounds(bounds, len(mixture))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        for k, source in enumerate(sources):
            mine = items[lo:hi][src[lo:hi] == k]
            if mine.size:  # consecutive items inside one of the source's blocks
                assert (np.diff(mine) == 1).all()
                assert mine[0] // source.per == mine[-1] // source.per
    # the vectorised positions of draws agree with the scalar kernel
    for k in range(len(sources)):
        occ = np.arange(min(int(mixture.counts()[k]), 50), dtype=np.int64)
        expected = [mixture._occurrence_position(k, int(o)) for o in occ]
        assert mixture._positions_of(k, occ).tolist() == expected
        for i in expected[:5]:
            assert mixture.source_of(i) == (k, int(items[i]))


def test_mixture_blocks_with_window_views(store, tmp_path):
    other = mmpack.build(
        tmp_path / "o.mmpack", [np.arange(n) for n in range(1, 90)], dtype="uint16"
    )
    views = [mmpack.WindowDataset(store, 8), mmpack.WindowDataset(other, 8)]
    mixture = Mixture(views, [0.7, 0.3], num_samples=900, seed=2, block_bytes=160)
    bounds = mixture.block_bounds(160)
    src, items = mixture.source_of_many(np.arange(len(mixture)))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        for k, view in enumerate(views):
            mine = items[lo:hi][src[lo:hi] == k]
            if mine.size:
                own = view.block_bounds(160)
                assert np.searchsorted(own, mine[0], "right") == np.searchsorted(
                    own, mine[-1], "right"
                )
    sampler = ResumableSampler(len(mixture), shuffle="blocks", block_bounds=bounds, window_blocks=8)
    assert sorted(sampler) == list(range(len(mixture)))
    back = pickle.loads(pickle.dumps(mixture))
    np.testing.assert_array_equal(back.block_bounds(160), bounds)
    np.testing.assert_array_equal(back.source_of_many(np.arange(900))[1], items)


def test_mixture_block_bounds_refusals():
    plain = Mixture([BlockSource(10, 0, 2)], [1.0])
    with pytest.raises(
        ValueError, match=r"Mixture\(\.\.\., block_bytes=64\); this one has block_bytes=None"
    ):
        plain.block_bounds(64)
    blocked = Mixture([BlockSource(10, 0, 2)], [1.0], block_bytes=32)
    with pytest.raises(ValueError, match="block_bytes=32"):
        blocked.block_bounds(64)

    class NoBlocks(BlockSource):
        block_bounds = None

    with pytest.raises(TypeError, match=r"source 1 \(NoBlocks\) has none"):
        Mixture([BlockSource(10, 0, 2), NoBlocks(5, 1, 1)], [0.5, 0.5], block_bytes=32)
    Mixture([BlockSource(10, 0, 2), NoBlocks(5, 1, 1)], [1.0, 0.0], block_bytes=32)  # weight 0

    class BadBlocks(BlockSource):
        def block_bounds(self, block_bytes):
            return np.array([0, 3, 9])

    with pytest.raises(ValueError, match=r"sources\[0\]\.block_bounds\(32\) must end at n=10"):
        Mixture([BadBlocks(10, 0, 2)], [1.0], block_bytes=32)
    with pytest.raises(ValueError, match="block_bytes"):
        Mixture([BlockSource(10, 0, 2)], [1.0], block_bytes=0)
