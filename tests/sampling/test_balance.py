"""Balanced dealing (:mod:`mmpack._src.sampling.balance`): each step's samples dealt to the ranks by
attention cost.

Checked: against a brute-force optimum on small groups (exact for two samples per rank, within
4/3 of it otherwise, and no swap with the costliest rank improves it); on the issue's
heavy-tailed corpus, within 2% of each step's exact optimum on average (the benchmark's branch
and bound, itself checked against the brute force); the steps hold the samples
they hold without balance; determinism; exact resume at the same world size and elastic resume
W1 -> W2 (1..8); the views' costs against their rows' ``cu_seqlens``; the loader.

Run: ``pytest tests/sampling/test_balance.py``.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
import mmpack.torch
from benchmarks.bench_balance import _lengths, _plan_costs, optimal_largest_load
from mmpack import ResumableSampler
from mmpack._src.sampling.balance import deal_balanced, largest_load


def optimum(costs, world, m):
    """The smallest largest load over every dealing of ``costs`` into ``world`` ranks of ``m``."""
    best = None
    items = list(range(len(costs)))

    def walk(left, loads):
        nonlocal best
        if not left:
            peak = max(loads)
            best = peak if best is None else min(best, peak)
            return
        first, rest = left[0], left[1:]
        for combo in itertools.combinations(rest, m - 1):
            group = (first, *combo)
            walk([i for i in rest if i not in combo], [*loads, sum(costs[i] for i in group)])

    walk(items, [])
    return best


@settings(max_examples=200, deadline=None)
@given(world=st.integers(1, 3), m=st.integers(1, 3), data=st.data())
def test_dealing_against_the_brute_force_optimum(world, m, data):
    costs = data.draw(st.lists(st.integers(0, 10**6), min_size=world * m, max_size=world * m))
    owner = deal_balanced(costs, world)
    assert sorted(Counter(owner.tolist()).values()) == [m] * world
    got, best = largest_load(costs, owner, world), optimum(costs, world, m)
    if m <= 2:
        assert got == best  # one sample each, or the sorted pairing: optimal
    assert 3 * got <= 4 * best  # the bound the tests hold the rule to
    loads = [sum(c for c, r in zip(costs, owner) if r == k) for k in range(world)]
    top = max(range(world), key=lambda k: (loads[k], -k))
    for a, b in itertools.product(range(len(costs)), repeat=2):  # a local optimum
        if owner[a] == top and owner[b] != top and costs[b] < costs[a]:
            d = costs[a] - costs[b]
            assert max(loads[top] - d, loads[owner[b]] + d) >= loads[top]


def _costs(n, seed=0):
    table = np.random.default_rng(seed).lognormal(8, 1.5, n).astype(np.int64)
    return lambda idx: table[idx]


def _ranks(n, world, batch, drop_last=False, costs=None, seed=4):
    costs = costs or _costs(n)
    return [ResumableSampler(n, seed=seed, rank=r, world_size=world, drop_last=drop_last,
                             costs=costs, batch_size=batch) for r in range(world)]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 120), world=st.integers(1, 8), batch=st.integers(1, 4),
       drop_last=st.booleans())  # fmt: skip
def test_steps_hold_the_samples_they_hold_without_balance(n, world, batch, drop_last):
    plain = [list(ResumableSampler(n, seed=4, rank=r, world_size=world, drop_last=drop_last))
             for r in range(world)]  # fmt: skip
    ranks = [list(s) for s in _ranks(n, world, batch, drop_last)]
    assert [len(x) for x in ranks] == [len(x) for x in plain]
    for t in range(0, len(plain[0]), batch):
        want = Counter(i for x in plain for i in x[t : t + batch])
        assert Counter(i for x in ranks for i in x[t : t + batch]) == want
    assert ranks == [list(s) for s in _ranks(n, world, batch, drop_last)]  # deterministic


def test_exact_solver_of_the_benchmark_is_the_brute_force_optimum():
    rng = np.random.default_rng(3)
    for _ in range(200):
        world, m = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        costs = rng.integers(0, int(rng.choice([5, 50, 10**6])), world * m).tolist()
        upper = largest_load(costs, deal_balanced(costs, world), world)
        best, lower, proven = optimal_largest_load(costs, world, upper)
        assert proven and lower <= best == optimum(costs, world, m)


@pytest.mark.parametrize("batch", [3, 4])
def test_heavy_tailed_steps_are_dealt_within_two_percent_of_their_optimum(batch):
    """The issue's corpus (row costs of lognormal documents, median 600, sigma 1.5, packed into
    8192-token rows), W = 4: the mean over steps of the largest rank cost over the exact optimum
    (``python -m benchmarks.bench_balance`` gives W = 8: at most 1.02 with B <= 4)."""
    costs = _plan_costs(_lengths(np.random.default_rng(0), 4000), 8192)
    world, ratios = 4, []
    for step in (
        np.random.default_rng(1)
        .permutation(costs.shape[0])[: 40 * world * batch]
        .reshape(40, world * batch)
    ):
        got = largest_load(costs[step], deal_balanced(costs[step], world), world)
        best, _, proven = optimal_largest_load(costs[step], world, got)
        assert proven
        ratios.append(got / best)
    assert np.mean(ratios) <= 1.02, np.mean(ratios)


def test_balance_lowers_the_largest_rank_cost():
    n, world, batch = 4000, 8, 2
    costs = _costs(n)
    plain = [ResumableSampler(n, seed=1, rank=r, world_size=world).indices(0, 500)
             for r in range(world)]  # fmt: skip
    ranks = [s.indices(0, 500) for s in _ranks(n, world, batch, costs=costs, seed=1)]

    def peak(shares, t):
        return max(int(costs(x[t : t + batch]).sum()) for x in shares)

    for t in range(0, 500, batch):  # two a rank: the sorted pairing, the optimum
        c = sorted(int(v) for x in plain for v in costs(x[t : t + batch]))
        assert peak(ranks, t) == max(a + b for a, b in zip(c, reversed(c))) <= peak(plain, t)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 150), w1=st.integers(1, 8), w2=st.integers(1, 8),
       batch=st.integers(1, 4), drop_last=st.booleans(), data=st.data())  # fmt: skip
def test_resume_exactly_at_the_same_world_size_and_elastically_at_another(
    n, w1, w2, batch, drop_last, data
):
    old = _ranks(n, w1, batch, drop_last)
    share = len(old[0])
    steps = data.draw(st.integers(0, -(-share // batch)))
    done = min(steps * batch, share)
    its = [iter(s) for s in old]
    seen = Counter(i for it in its for i in [next(it) for _ in range(done)])
    state = old[0].state_dict()
    again = _ranks(n, w1, batch, drop_last)
    for r, s in enumerate(again):  # same world size: exactly the rest of every rank
        s.load_state_dict(state)
        assert list(s) == list(old[r].indices(done, share))
    new = _ranks(n, w2, batch, drop_last)
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert len({len(x) for x in rest}) == 1
    for t in range(0, len(rest[0]), batch):  # every step of the rest dealt for the new world
        want = Counter(
            rest[r][t + j] for r in range(w2) for j in range(len(rest[r][t : t + batch]))
        )
        assert sum(want.values()) == w2 * len(rest[0][t : t + batch])
    got = seen + Counter(i for x in rest for i in x)
    full = Counter(range(n))
    if drop_last:  # every sample at most once, all but fewer than a round of each world
        assert max(got.values(), default=1) == 1 and n - sum(got.values()) < w1 + w2
    else:  # every sample, the padding repeating a few
        assert set(got) == set(full) and sum(got.values()) - n < w1 + w2


def test_a_state_inside_a_step_resumes_only_at_the_same_world_size():
    old = _ranks(100, 2, 4)
    it = iter(old[0])
    [next(it) for _ in range(3)]
    state = old[0].state_dict()
    same = _ranks(100, 2, 4)[0]
    same.load_state_dict(state)
    assert list(same) == list(old[0].indices(3, len(old[0])))
    with pytest.raises(ValueError, match="inside a step of batch_size 4"):
        _ranks(100, 3, 4)[0].load_state_dict(state)


def test_costs_and_batch_size_go_together_and_bad_costs_are_named():
    with pytest.raises(ValueError, match="costs and batch_size go together"):
        ResumableSampler(10, batch_size=2)
    bad = ResumableSampler(10, costs=lambda idx: -np.ones(len(idx), np.int64), batch_size=2)
    with pytest.raises(ValueError, match="negative cost -1"):
        list(bad)
    with pytest.raises(ValueError, match="does not deal evenly"):
        deal_balanced([1, 2, 3], 2)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    lens = rng.lognormal(np.log(40), 1.5, 300).astype(int)
    docs = [rng.integers(0, 900, int(n)) for n in lens]
    return mmpack.build(tmp_path_factory.mktemp("balance") / "s.mmpack", docs)


def _row_costs(view, idx):
    return [int((np.diff(np.asarray(view[i]["cu_seqlens"], np.int64)) ** 2).sum()) for i in idx]


def test_view_costs_are_the_squares_of_their_rows_segments(store):
    views = [
        mmpack.PackedDataset(store, seqlen=128, eot=999),
        mmpack.PackedDataset(store, seqlen=96),
        mmpack.WindowDataset(store, seqlen=100, stride=37, eot=999),
        mmpack.WindowDataset(store, seqlen=127, stride=128, labels=True, drop_last=False),
    ]
    for view in views:
        idx = np.arange(len(view))
        assert view.attention_cost(idx).tolist() == _row_costs(view, idx), view
    sources = [views[0], mmpack.PackedDataset(store, seqlen=128)]
    mix = mmpack.Mixture(sources, weights=[1, 2], num_samples=200, seed=3)
    idx = np.arange(len(mix))
    assert mix.attention_cost(idx).tolist() == _row_costs(mix, idx)


def test_loader_balance_deals_each_step_of_the_same_samples(store):
    view = mmpack.PackedDataset(store, seqlen=128, eot=999)
    world, batch = 3, 2
    got = [list(mmpack.torch.loader(view, batch, rank=r, world_size=world, balance="attention"))
           for r in range(world)]  # fmt: skip
    plain = [list(mmpack.torch.loader(view, batch, rank=r, world_size=world))
             for r in range(world)]  # fmt: skip
    for step in range(len(plain[0])):

        def ids(batches):
            return Counter(tuple(row.tolist()) for b in batches for row in b[step]["input_ids"])

        assert ids(got) == ids(plain)
    with pytest.raises(ValueError, match="balance must be 'attention'"):
        mmpack.torch.loader(view, 2, balance="tokens")
    with pytest.raises(ValueError, match="configure the default collate"):
        mmpack.torch.loader(view, 2, cp_size=2, collate=lambda b: b)
    first = next(iter(mmpack.torch.loader(view, 2, cp_size=2, cp_rank=1, pad_cu_seqlens=True)))
    assert first["cu_seqlens"].shape == (2 * 128 + 1,) and first["input_ids"].shape[0] == 1
