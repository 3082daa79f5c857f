"""Specification of :class:`mmpack.Mixture` and :mod:`mmpack._src.kernels.mixture`."""

from __future__ import annotations

import pickle
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
from _mixture_sources import FakeSource, mixture_weights, two_stores
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_assignment, reference_item
from torch.utils.data import DataLoader

from mmpack import Mixture, ResumableSampler
from mmpack._src.sampling.mixture import quantize_weights

# -- the obviously-right reference ---------------------------------------------------------------------


def bound_numerator_ok(quotas, period, counts, n) -> bool:
    """``|n q_k - count_k| <= 1 - 1/(2K'-2)`` for every k, in exact integers."""
    quotas, counts, n, period = (
        [int(c) for c in quotas],
        [int(c) for c in counts],
        int(n),
        int(period),
    )
    k_pos = sum(c > 0 for c in quotas)
    if k_pos == 1:
        return all(n * c == period * cnt for c, cnt in zip(quotas, counts))
    m = 2 * k_pos - 2
    return all(abs(n * c - period * cnt) * m <= period * (m - 1) for c, cnt in zip(quotas, counts))


# -- assignment ------------------------------------------------------------------------------------------


@given(
    weights=mixture_weights,
    sizes=st.lists(st.integers(1, 40), min_size=8, max_size=8),
    num_samples=st.integers(0, 250),
    seed=st.integers(0, 2**64 - 1),
)
def test_matches_sequential_reference(weights, sizes, num_samples, seed):
    sources = [FakeSource(sizes[k], k) for k in range(len(weights))]
    mixture = Mixture(sources, weights, num_samples=num_samples, seed=seed)
    ref = reference_assignment(mixture.quotas.tolist(), mixture.period, num_samples)
    src, items = mixture.source_of_many(np.arange(num_samples))
    assert src.tolist() == [k for k, _ in ref]
    assert items.tolist() == [reference_item(mixture, k, o) for k, o in ref]
    counts = np.zeros(len(weights), dtype=np.int64)
    for n, (k, _) in enumerate(ref, start=1):
        counts[k] += 1
        assert bound_numerator_ok(mixture.quotas, mixture.period, counts, n)
        assert np.abs(counts - n * mixture.weights).max() <= 1.5
    np.testing.assert_array_equal(mixture.counts(), counts)
    for i in range(0, num_samples, 37):
        assert mixture.source_of(i) == (src[i], items[i])


_SKEWED = [
    [0.999, 0.0005, 0.0005],
    [0.5, 0.3, 0.1, 0.05, 0.03, 0.01, 0.005, 0.005],
    [1, 1, 1],
    [0.9] + [0.1 / 7] * 7,
    [1e-6, 1 - 2e-6, 1e-6],
    [0.123457, 0.654321, 0.222222],
]


@pytest.mark.parametrize("weights", _SKEWED)
def test_every_prefix_of_a_whole_period_is_within_bound(weights):
    mixture = Mixture([FakeSource(10, k) for k in range(len(weights))], weights, num_samples=10**15)
    quotas, period = mixture.quotas, mixture.period
    seq = mixture._seq
    n = np.arange(1, period + 1, dtype=np.int64)
    k_pos = int((quotas > 0).sum())
    for k in range(len(weights)):
        err = np.abs(n * quotas[k] - period * np.cumsum(seq == k)).max()
        assert err * (2 * k_pos - 2) <= period * (2 * k_pos - 3)
        assert np.cumsum(seq == k)[-1] == quotas[k]  # exact counts at the end: periodic
    stats = mixture.stats()
    assert stats.max_prefix_error <= stats.error_bound < 1
    # far prefixes (many periods plus a remainder) keep the bound
    rng = np.random.default_rng(0)
    for far in rng.integers(0, 10**15, size=50).tolist():
        assert bound_numerator_ok(quotas, period, mixture.counts(far).tolist(), far)


@given(weights=mixture_weights, data=st.data())
def test_occurrence_position_inverts_locate(weights, data):
    mixture = Mixture([FakeSource(5, k) for k in range(len(weights))], weights, num_samples=10**13)
    k = data.draw(st.sampled_from(np.flatnonzero(mixture.quotas).tolist()))
    occ = data.draw(st.integers(0, 10**6))
    pos = mixture._occurrence_position(k, occ)
    src, got = mixture._locate_unchecked(np.array([pos], dtype=np.int64))
    assert (int(src[0]), int(got[0])) == (k, occ)
    assert mixture.counts(pos)[k] == occ


def test_zero_weight_source_is_never_drawn():
    sources = [FakeSource(10, 0), FakeSource(0, 1), FakeSource(10, 2)]
    mixture = Mixture(sources, [1.0, 0.0, 3.0], num_samples=1000)
    src, _ = mixture.source_of_many(np.arange(1000))
    assert set(src.tolist()) == {0, 2}
    assert mixture.counts().tolist() == [250, 0, 750]


def test_lookup_does_not_depend_on_position():
    mixture = Mixture([FakeSource(1000, k) for k in range(3)], [0.2, 0.3, 0.5], num_samples=2**62)
    far = np.arange(2**62 - 1000, 2**62, dtype=np.int64)
    src, items = mixture.source_of_many(far)
    assert ((items >= 0) & (items < 1000)).all()
    c = mixture.counts(2**62 - 1000)
    for i in range(0, 1000, 97):
        k, o = int(src[i]), int(c[src[i]] + (src[:i] == src[i]).sum())
        assert items[i] == reference_item(mixture, k, o)


# -- default length, repeats, statistics ------------------------------------------------------------------


@given(weights=mixture_weights, sizes=st.lists(st.integers(1, 500), min_size=8, max_size=8))
def test_default_length_is_longest_prefix_without_repeats(weights, sizes):
    sources = [FakeSource(sizes[k], k) for k in range(len(weights))]
    mixture = Mixture(sources, weights)
    n = len(mixture)
    lengths = np.array(sizes[: len(weights)])
    active = mixture.quotas > 0
    assert (mixture.counts(n)[active] <= lengths[active]).all()
    assert (mixture.counts(n + 1)[active] > lengths[active]).any()
    assert (mixture.repeats() == 0).all()
    # roughly min_k len_k / q_k
    assert (
        abs(n - (lengths[active] / mixture.weights[active]).min())
        <= 1 / mixture.weights[active].min() + 1
    )


def test_repeats_of_a_small_source_are_fresh_permutations():
    small, big = FakeSource(10, 0), FakeSource(10**6, 1)
    mixture = Mixture([small, big], [0.5, 0.5], num_samples=200, seed=3)
    src, items = mixture.source_of_many(np.arange(200))
    drawn = items[src == 0]
    passes = drawn.reshape(10, 10)
    for p in passes:
        assert sorted(p.tolist()) == list(range(10))
    assert len({tuple(p) for p in passes.tolist()}) >= 8
    assert mixture.repeats().tolist() == [9, 0]
    stats = mixture.stats()
    assert stats.epochs.tolist() == [10.0, 100 / 10**6]
    assert stats.counts.tolist() == [100, 100]
    np.testing.assert_allclose(stats.proportions, [0.5, 0.5])


def test_locate_is_the_sources_locate_and_source_of_the_pair():
    """``Mixture.locate`` returned ``(source, item)`` where the views' ``locate`` returns a list
    of dicts: the pair is ``source_of`` now, and ``locate`` the source's list, tagged."""

    class Located(FakeSource):
        def locate(self, j):
            return [{"doc": j, "start": 0, "stop": 1, "eot": 0, "at": 0, "source": -1}]

    mixture = Mixture([Located(5, 0), Located(7, 1)], [0.5, 0.5], num_samples=12, seed=4)
    for i in range(-12, 12):
        k, j = mixture.source_of(i)
        assert mixture.locate(i) == [
            {"doc": j, "start": 0, "stop": 1, "eot": 0, "at": 0, "source": k}
        ]
    with pytest.raises(IndexError):
        mixture.locate(12)
    plain = Mixture([FakeSource(5, 0)], [1.0], num_samples=3)
    with pytest.raises(TypeError, match=r"source 0 \(FakeSource\) has no locate\(\).*source_of"):
        plain.locate(0)


# -- items -----------------------------------------------------------------------------------------------


def test_items_come_back_unchanged_from_the_right_source():
    sources = [FakeSource(7, 0), FakeSource(50, 1), FakeSource(3, 2)]
    mixture = Mixture(sources, [0.3, 0.5, 0.2], num_samples=400, seed=1)
    for i in range(400):
        k, j = mixture.source_of(i)
        item = mixture[i]
        assert type(item["source"]) is int and item["source"] == k
        np.testing.assert_array_equal(item["x"], [k, j])
        np.testing.assert_array_equal(item["y"], np.full(3, j))
    assert mixture[-1]["x"].tolist() == mixture[399]["x"].tolist()


def test_index_errors():
    mixture = Mixture([FakeSource(5, 0), FakeSource(5, 1)], [1, 1], num_samples=10)
    for bad in (10, -11):
        with pytest.raises(IndexError, match="out of range"):
            mixture[bad]
        with pytest.raises(IndexError):
            mixture.source_of_many(np.array([0, bad]))
        with pytest.raises(IndexError):
            mixture.__getitems__([0, bad])
    for bad in (1.0, True, "1", None):
        with pytest.raises(TypeError, match="index"):
            mixture[bad]
    with pytest.raises(TypeError):
        mixture.__getitems__([0.5])
    with pytest.raises(TypeError):
        mixture.source_of_many(np.array([0.5]))


# -- validation ------------------------------------------------------------------------------------------


def test_weight_validation():
    s = [FakeSource(5, 0), FakeSource(5, 1)]
    for bad in ([1, -1], [0, 0], [1, float("nan")], [1, float("inf")]):
        with pytest.raises(ValueError, match="weights"):
            Mixture(s, bad)
    with pytest.raises(ValueError, match="3 entries but there are 2 sources"):
        Mixture(s, [1, 1, 1])
    with pytest.raises(ValueError, match="at least one"):
        Mixture([], [])


def test_source_validation():
    with pytest.raises(ValueError, match=r"sources \[1\] are empty"):
        Mixture([FakeSource(5, 0), FakeSource(0, 1)], [1, 1])
    with pytest.raises(ValueError, match="sources 0 and 2 have incompatible samples"):
        Mixture([FakeSource(5, 0), FakeSource(5, 1), FakeSource(5, 2, width=4)], [1, 1, 1])

    class OtherKeys(FakeSource):
        def __getitem__(self, j):
            return {"x": np.zeros(2, dtype=np.int64), "z": np.zeros(3, dtype=np.int64)}

    with pytest.raises(ValueError, match="sources 0 and 1"):
        Mixture([FakeSource(5, 0), OtherKeys(5, 1)], [1, 1])

    class Wider(FakeSource):
        def __getitem__(self, j):
            item = super().__getitem__(j)
            return {k: v.astype(np.int32) for k, v in item.items()}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Mixture([FakeSource(5, 0), Wider(5, 1)], [1, 1])
    assert any("dtypes" in str(w.message) for w in caught)


def test_num_samples_and_seed_validation():
    s = [FakeSource(5, 0), FakeSource(5, 1)]
    with pytest.raises(TypeError, match="num_samples"):
        Mixture(s, [1, 1], num_samples=True)
    with pytest.raises(TypeError, match="num_samples"):
        Mixture(s, [1, 1], num_samples=10.0)
    with pytest.raises(ValueError, match="num_samples=-1"):
        Mixture(s, [1, 1], num_samples=-1)
    with pytest.raises(ValueError, match="seed"):
        Mixture(s, [1, 1], seed=-1)
    assert len(Mixture(s, [1, 1], num_samples=0)) == 0


# -- memory, pickling, loaders ---------------------------------------------------------------------------


def test_memory_does_not_depend_on_num_samples():
    sources = [FakeSource(10**9, k) for k in range(3)]
    Mixture(sources, [0.2, 0.3, 0.5], num_samples=10)  # compile the kernels
    tracemalloc.start()
    mixture = Mixture(sources, [1, 1, 1], num_samples=10**15)
    mixture.source_of_many(np.arange(10**15 - 4096, 10**15))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert mixture.period == 10**6
    assert peak < 3 * 2**20, peak  # one period: 1 MB of sources, 62 KB of checkpoints


def test_pickles_small_and_identical():
    mixture = Mixture(
        [FakeSource(100, k) for k in range(3)], [0.123457, 0.3, 0.5], num_samples=10**9, seed=4
    )
    blob = pickle.dumps(mixture)
    assert len(blob) < 2000
    back = pickle.loads(blob)
    idx = np.arange(10**9 - 1000, 10**9, 7)
    for a, b in zip(mixture.source_of_many(idx), back.source_of_many(idx)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("order", ["global", "blocks"])
def test_works_with_resumable_sampler_and_dataloader(order):
    sources = [FakeSource(20, 0), FakeSource(40, 1), FakeSource(60, 2)]
    blocks = {} if order == "global" else {"block_bytes": 1}
    mixture = Mixture(sources, [0.2, 0.3, 0.5], num_samples=120, seed=5, **blocks)
    kw = {}
    if order == "blocks":
        kw = {"shuffle": "blocks", "block_bounds": mixture.block_bounds(1), "window_blocks": 4}
    sampler = ResumableSampler(len(mixture), seed=1, **kw)
    loader = DataLoader(mixture, sampler=sampler, batch_size=8)
    batches = list(loader)
    assert batches[0]["x"].shape == (8, 2) and batches[0]["source"].shape == (8,)
    order = list(sampler)
    flat_x = torch.cat([b["x"] for b in batches]).tolist()
    assert flat_x == [mixture[i]["x"].tolist() for i in order]
    sources_drawn = torch.cat([b["source"] for b in batches])
    assert torch.bincount(sources_drawn).tolist() == mixture.counts().tolist()
    # resuming the sampler resumes the mixture stream
    it = iter(sampler)
    head = [next(it) for _ in range(50)]
    fresh = ResumableSampler(len(mixture), seed=1, **kw)
    fresh.load_state_dict(sampler.state_dict())
    rest = torch.cat([b["x"] for b in DataLoader(mixture, sampler=fresh, batch_size=8)]).tolist()
    assert [mixture[i]["x"].tolist() for i in head] + rest == flat_x


# -- issue 13: mixtures of views of different stores, overflowing weights, integer counts -----------


def test_weights_whose_sum_overflows():
    s = [FakeSource(5, k) for k in range(3)]
    mixture = Mixture(s, [1e308, 1e308, 3e307], num_samples=23)
    np.testing.assert_allclose(mixture.weights, [10 / 23, 10 / 23, 3 / 23], atol=2e-6)
    np.testing.assert_allclose(mixture.stats().requested_weights, [10 / 23, 10 / 23, 3 / 23])
    assert mixture.counts(23).tolist() == [10, 10, 3]
    # scaling by the largest weight must not lose a subnormal one: still drawn (quota 1)
    assert quantize_weights([5e-324, 2.0])[0].tolist() == [1, 999999]


def test_counts_takes_an_integer():
    mixture = Mixture([FakeSource(5, 0), FakeSource(5, 1)], [1, 1], num_samples=10)
    for bad in (2.7, True, "2"):
        with pytest.raises(TypeError, match="n must be an integer"):
            mixture.counts(bad)
    assert mixture.counts(np.int64(4)).tolist() == [2, 2]


def test_getitems_refuses_bools_like_getitem():
    mixture = Mixture([FakeSource(5, 0), FakeSource(5, 1)], [1, 1], num_samples=10)
    for bad in ([0, True], (False,), [np.bool_(True)]):
        with pytest.raises(TypeError, match="bool"):
            mixture.__getitems__(bad)
    with pytest.raises(TypeError, match="bool"):
        mixture[torch.tensor(True)]


def test_mixture_hands_the_epoch_on_to_its_sources(tmp_path):
    from mmpack import PackedDataset
    from mmpack.store import EpochIndex

    a, b = two_stores(tmp_path)
    views = [
        PackedDataset(
            s, seqlen=64, eot=0, pad_id=99, mode="mlm", mask_id=98, vocab_size=100, seed=2
        )
        for s in (a, b)
    ]
    mixture = Mixture(views, [0.5, 0.5], num_samples=20, seed=3)
    for epoch in (1, 2):
        refs = [pickle.loads(pickle.dumps(v)) for v in views]
        for r in refs:
            r.set_epoch(epoch)
        batch = mixture.__getitems__([EpochIndex(i, epoch) for i in range(20)])
        for i in range(20):
            k, j = mixture.source_of(i)
            np.testing.assert_array_equal(batch[i]["input_ids"], refs[k][j]["input_ids"])
            np.testing.assert_array_equal(
                mixture[EpochIndex(i, epoch)]["labels"], refs[k][j]["labels"]
            )
    plain = mixture.__getitems__(list(range(20)))
    assert not all(np.array_equal(plain[i]["input_ids"], batch[i]["input_ids"]) for i in range(20))
