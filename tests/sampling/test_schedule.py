"""Mixture schedules against a naive list model: the walk of :func:`reference.reference_split_walk`
(every position, one at a time), the prefix bound against the exact integral of the schedule,
schedule changes, resume and elastic resume through the sampler, a mixture of views of two stores,
the fingerprint."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from _orders import epoch_order
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    naive_deal,
    reference_item,
    reference_schedule_integral,
    reference_split_walk,
)

import mmpack
from mmpack import Mixture, ResumableSampler, Schedule


class Src:
    """``n`` samples; sample ``i`` of source ``k`` holds ``[k, i]``."""

    def __init__(self, n: int, k: int = 0, seqlen: int | None = None) -> None:
        self.n, self.k = n, k
        if seqlen is not None:
            self.seqlen = seqlen

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"tokens": np.array([self.k, int(i)], dtype=np.int64)}


def walk(mixture: Mixture, n: int) -> list[tuple[int, int]]:
    if mixture._plan is None:  # constant weights
        src, occ = mixture._locate_unchecked(np.arange(n, dtype=np.int64))
        return list(zip(src.tolist(), occ.tolist()))
    return reference_split_walk(mixture._plan, n)


@st.composite
def schedules(draw, k_min=2, k_max=8, max_points=8, max_gap=200):
    k = draw(st.integers(k_min, k_max))
    n_points = draw(st.integers(2, max_points))
    points, start = [], 0
    for _ in range(n_points):
        kind = draw(st.sampled_from(["uniform", "sparse", "round"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        w = rng.random(k) if kind != "sparse" else rng.random(k) * (rng.random(k) < 0.5)
        if kind == "round":
            w = np.round(w, 1)
        if w.sum() == 0:
            w[0] = 1.0
        points.append((start, w.tolist()))
        start += draw(st.integers(1, max_gap))
    return Schedule(points, interpolate=draw(st.sampled_from(["constant", "linear"])))


def _mixture(schedule, lengths, n, seed=1, **kw):
    return Mixture(
        [Src(m, k) for k, m in enumerate(lengths)], schedule, num_samples=n, seed=seed, **kw
    )


# ----------------------------------------------------------------------------- Schedule itself
@pytest.mark.parametrize(
    ("points", "kw", "error", "match"),
    [
        ([], {}, TypeError, "non-empty sequence"),
        ([(1, [1.0])], {}, ValueError, "must start at 0"),
        ([(0, [1.0]), (0, [1.0])], {}, ValueError, "strictly increasing"),
        ([(0, [1.0, 2.0]), (5, [1.0])], {}, ValueError, "points\\[1\\] has 1 weights"),
        ([(0, [1.0, -1.0])], {}, ValueError, "non-negative"),
        ([(0, [1.0, float("nan")])], {}, ValueError, "finite"),
        ([(0, [0.0, 0.0])], {}, ValueError, "must not all be zero"),
        ([(0.0, [1.0])], {}, TypeError, "start must be an int"),
        ([(0, "ab")], {}, TypeError, "sequence of numbers"),
        ([(0, [1.0])], {"interpolate": "cubic"}, ValueError, "interpolate"),
        ([(0, [1.0])], {"unit": "bytes"}, ValueError, "unit"),
        ([0], {}, TypeError, "pair"),
    ],
)
def test_bad_schedules_are_refused_by_name(points, kw, error, match):
    with pytest.raises(error, match=match):
        Schedule(points, **kw)


def test_schedule_must_match_the_sources_and_tokens_need_seqlen():
    with pytest.raises(ValueError, match="3 weights but there are 2 sources"):
        Mixture([Src(5), Src(5)], Schedule([(0, [1, 1, 1]), (4, [1, 0, 1])]))
    tokens = Schedule([(0, [1, 1]), (40, [1, 3])], unit="tokens")
    with pytest.raises(TypeError, match="source 0 .* seqlen=None"):
        Mixture([Src(5), Src(5)], tokens)


def test_segments_are_the_schedule_from_a_point_on():
    s = Schedule([(0, [0.8, 0.2]), (1000, [0.2, 0.8])], interpolate="linear")
    starts, w, slopes = s.segments(250)
    assert starts == [250, 1000]
    np.testing.assert_allclose(w, [[0.65, 0.35], [0.2, 0.8]])
    np.testing.assert_allclose(slopes, [[-0.0006, 0.0006], [0, 0]])
    np.testing.assert_allclose(s.weights_at(500), [0.5, 0.5])
    np.testing.assert_allclose(s.weights_at(5000), [0.2, 0.8])


# ----------------------------------------------------------------------------- the list model
@given(schedule=schedules(k_max=5, max_points=6, max_gap=80), data=st.data())
def test_positions_match_the_naive_walk(schedule, data):
    k = schedule.num_sources
    lengths = data.draw(st.lists(st.integers(1, 30), min_size=k, max_size=k))
    n = data.draw(st.integers(1, schedule.starts[-1] + 60))
    mixture = _mixture(schedule, lengths, n)
    ref = walk(mixture, n)
    src, items = mixture.source_of_many(np.arange(n))
    assert src.tolist() == [s for s, _ in ref]
    assert items.tolist() == [reference_item(mixture, s, o) for s, o in ref]
    i = data.draw(st.integers(0, n - 1))
    assert mixture.source_of(i) == (int(src[i]), int(items[i]))
    assert mixture[i]["tokens"].tolist() == [int(src[i]), int(items[i])]
    batch = mixture.__getitems__(list(range(n))[::-1])
    assert [b["source"] for b in batch] == src[::-1].tolist()
    for m in {0, i, n}:
        assert mixture.counts(m).tolist() == np.bincount(src[:m], minlength=k).tolist()


@given(schedule=schedules(k_max=4, max_points=5, max_gap=60), data=st.data())
def test_default_length_is_the_longest_prefix_without_a_repeat(schedule, data):
    k = schedule.num_sources
    lengths = data.draw(st.lists(st.integers(1, 25), min_size=k, max_size=k))
    mixture = Mixture([Src(m, j) for j, m in enumerate(lengths)], schedule)
    n = len(mixture)
    ref = walk(mixture, n + 1)
    assert all(o < lengths[s] for s, o in ref[:n])  # no source repeats in the mixture
    assert ref[n][1] == lengths[ref[n][0]]  # and the next position would repeat one


@st.composite
def dirichlet_schedules(draw, max_points=6, max_gap=150):
    """Schedules of 2..8 sources whose weights are uniform, Dirichlet(0.2) or sparse."""
    k = draw(st.integers(2, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    points, start = [], 0
    for _ in range(draw(st.integers(2, max_points))):
        kind = draw(st.sampled_from(["uniform", "dirichlet", "sparse"]))
        w = rng.random(k) if kind == "uniform" else rng.dirichlet(np.full(k, 0.2))
        if kind == "sparse":
            w = w * (rng.random(k) < 0.4)
        if w.sum() == 0:
            w[int(rng.integers(k))] = 1.0
        points.append((start, w.tolist()))
        start += draw(st.integers(1, max_gap))
    return Schedule(points, interpolate=draw(st.sampled_from(["constant", "linear"])))


def _worst_against_the_integral(mixture, schedule, n):
    src, _ = mixture.source_of_many(np.arange(n))
    exact = reference_schedule_integral(
        list(schedule.starts), [list(w) for _, w in schedule.spec()[2]], schedule.interpolate, n
    )
    counts, worst = [0] * schedule.num_sources, Fraction(0)
    for p in range(n + 1):
        worst = max(worst, *(abs(c - t) for c, t in zip(counts, exact[p])))
        if p < n:
            counts[int(src[p])] += 1
    return float(worst)


@settings(deadline=None)
@given(schedule=dirichlet_schedules())
def test_every_prefix_is_within_one_and_a_half_samples_of_the_exact_integral(schedule):
    n = schedule.starts[-1] + 100
    mixture = _mixture(schedule, [10**6] * schedule.num_sources, n)
    worst = _worst_against_the_integral(mixture, schedule, n)
    assert worst <= 1.5
    stats = mixture.stats()
    assert worst <= stats.error_bound + 1e-9
    assert abs(stats.max_prefix_error - worst) <= 1e-6  # what benchmarks report is this worst


def _integrals_at(schedule, probes):
    """The exact integral of each source's normalized weight over ``[0, p]``, for each probe."""
    starts = list(schedule.starts)
    w = [[Fraction(v) for v in row] for _, row in schedule.spec()[2]]
    w = [[v / sum(row) for v in row] for row in w]
    linear = schedule.interpolate == "linear"

    def part(j, length):  # the integral over the first ``length`` positions of segment j
        hi_w = w[j]
        if linear and j + 1 < len(starts):
            t = Fraction(length, starts[j + 1] - starts[j])
            hi_w = [x + (y - x) * t for x, y in zip(w[j], w[j + 1])]
        return [length * (x + y) / 2 for x, y in zip(w[j], hi_w)]

    at_start = [[Fraction(0)] * len(w[0])]
    for j in range(len(starts) - 1):
        at_start.append([a + b for a, b in zip(at_start[-1], part(j, starts[j + 1] - starts[j]))])
    out = []
    for p in probes:
        j = max(i for i, a in enumerate(starts) if a <= p)
        out.append([a + b for a, b in zip(at_start[j], part(j, p - starts[j]))])
    return out


def _token_targets(schedule, seqlens, n):
    """Each source's target in samples at positions ``0 .. n`` of a ``unit="tokens"`` schedule,
    from its definition: the token ``x`` where the samples' integral (each source's normalized
    weight over its ``seqlen``) reaches ``p``, found by bisection, and each source's integral there."""
    starts = list(schedule.starts)
    w = [np.array(row, dtype=float) / sum(row) for _, row in schedule.spec()[2]]
    per = np.array(seqlens, dtype=float)

    def integral(x):
        out = np.zeros(len(per))
        for j, a in enumerate(starts):
            b = starts[j + 1] if j + 1 < len(starts) else math.inf
            if x <= a:
                break
            hi = min(x, b)
            end = w[j]
            if schedule.interpolate == "linear" and b < math.inf:
                end = w[j] + (w[j + 1] - w[j]) * (hi - a) / (b - a)
            out += (hi - a) * (w[j] + end) / 2 / per
        return out

    targets = []
    for p in range(n + 1):
        lo, hi = 0.0, 1.0
        while integral(hi).sum() < p:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if integral(mid).sum() < p else (lo, mid)
        targets.append(integral(hi))
    return np.array(targets)


@settings(deadline=None, max_examples=10)
@given(schedule=dirichlet_schedules(max_points=4, max_gap=2000), data=st.data())
def test_a_token_schedule_follows_its_integral_in_samples(schedule, data):
    k = schedule.num_sources
    seqlens = data.draw(st.lists(st.integers(1, 64), min_size=k, max_size=k))
    tokens = Schedule(list(zip(schedule.starts, [w for _, w in schedule.spec()[2]])),
                      interpolate=schedule.interpolate, unit="tokens")  # fmt: skip
    n = 200
    mixture = Mixture([Src(10**6, j, seqlen=m) for j, m in enumerate(seqlens)], tokens,
                      num_samples=n, seed=1)  # fmt: skip
    src, _ = mixture.source_of_many(np.arange(n))
    counts = np.zeros((n + 1, k))
    counts[np.arange(1, n + 1), src] = 1
    worst = float(np.abs(np.cumsum(counts, axis=0) - _token_targets(tokens, seqlens, n)).max())
    assert worst <= 1.5
    if mixture._plan is not None:
        assert worst <= mixture.stats().error_bound + 1e-6


@pytest.mark.parametrize("interpolate", ["constant", "linear"])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_long_segments_track_the_exact_integral(interpolate, k):
    rng = np.random.default_rng(k)
    n = 10**9
    points = [(s * n // 100, rng.dirichlet(np.ones(k)).tolist()) for s in range(100)]
    schedule = Schedule(points, interpolate=interpolate)
    mixture = _mixture(schedule, [10**9] * k, n)
    probes = rng.integers(0, n, 100).tolist() + [s + d for s, _ in points for d in (-1, 0, 7)]
    probes = sorted(set(min(max(x, 0), n) for x in probes))
    worst = 0.0
    for p, want in zip(probes, _integrals_at(schedule, probes)):
        got = mixture.counts(p).tolist()
        worst = max(worst, *(float(abs(c - t)) for c, t in zip(got, want)))
    assert worst <= min(1.5, mixture.stats().error_bound)


def test_one_constant_piece_is_the_weight_vector_bit_for_bit():
    w = [0.123457, 0.5, 0.376543]
    a = Mixture([Src(50, k) for k in range(3)], w, seed=9)
    b = Mixture([Src(50, k) for k in range(3)], Schedule([(0, w), (10, w)]), seed=9)
    assert b._plan is None and len(a) == len(b)
    for x, y in zip(a.source_of_many(np.arange(len(a))), b.source_of_many(np.arange(len(b)))):
        assert x.tolist() == y.tolist()


# ----------------------------------------------------------------------------- schedule changes
@given(schedule=schedules(k_max=5, max_points=5, max_gap=60), data=st.data())
def test_with_schedule_keeps_the_past_and_continues_every_pass(schedule, data):
    k = schedule.num_sources
    lengths = data.draw(st.lists(st.integers(1, 20), min_size=k, max_size=k))
    n = schedule.starts[-1] + 150
    first = _mixture(schedule, lengths, n)
    p1 = data.draw(st.integers(0, n))
    new1 = data.draw(schedules(k_min=k, k_max=k, max_points=4, max_gap=60))
    second = first.with_schedule(new1, from_position=p1)
    p2 = data.draw(st.integers(p1, n))
    new2 = Schedule([(0, np.arange(1.0, k + 1).tolist())])
    third = second.with_schedule(new2, from_position=p2)
    a, b, c = (m.source_of_many(np.arange(n)) for m in (first, second, third))
    for x, y in zip(a, b):
        assert x[:p1].tolist() == y[:p1].tolist()
    for x, y in zip(b, c):
        assert x[:p2].tolist() == y[:p2].tolist()
    # the occurrences of each source run 0, 1, 2, ...: every pass is a permutation of the source
    src, occ = third._locate_unchecked(np.arange(n, dtype=np.int64))
    for s in range(k):
        assert occ[src == s].tolist() == list(range(int((src == s).sum())))
        items = c[1][src == s]
        for start in range(0, items.size, lengths[s]):
            chunk = items[start : start + lengths[s]].tolist()
            assert len(set(chunk)) == len(chunk)
    assert len({first.fingerprint, second.fingerprint, third.fingerprint}) == 3
    assert [p for p, _ in third.schedule] == [0, p1, p2]


def test_with_schedule_refuses_a_bad_position_and_accepts_a_weight_vector():
    mixture = Mixture([Src(40), Src(40)], [0.5, 0.5])
    with pytest.raises(ValueError, match="from_position"):
        mixture.with_schedule([1, 0], from_position=-1)
    changed = mixture.with_schedule([1, 0], from_position=10)
    src, _ = changed.source_of_many(np.arange(len(changed)))
    assert (src[10:] == 0).all() and src[:10].tolist() == mixture.source_of_many(np.arange(10))[
        0
    ].tolist()


def test_with_schedule_on_one_source_keeps_every_position():
    one = Mixture([Src(40, seqlen=8)], [1.0], seed=3)
    for new in ([1.0], Schedule([(0, [1.0]), (50, [3.0])], interpolate="linear")):
        for unit_schedule in (new, Schedule([(0, [1.0])], unit="tokens")):
            changed = one.with_schedule(unit_schedule, from_position=7)
            assert len(changed) == len(one) == 40
            assert list(map(changed.source_of, range(40))) == list(map(one.source_of, range(40)))
            assert [p for p, _ in changed.schedule] == [0, 7]
            assert changed.fingerprint != one.fingerprint
    with pytest.raises(ValueError, match="2 weights but there are 1 sources"):
        one.with_schedule([0.5, 0.5], from_position=7)


# ----------------------------------------------------------------------------- the sampler
def _served(mixture, indices):
    return [tuple(mixture[i]["tokens"].tolist()) for i in indices]


@settings(deadline=None, max_examples=15)
@given(
    w1=st.integers(1, 6),
    w2=st.integers(1, 6),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_resume_and_elastic_resume_across_a_schedule_change(w1, w2, shuffle, drop_last, data):
    sched = Schedule([(0, [0.6, 0.3, 0.1]), (40, [0.2, 0.3, 0.5])], interpolate="linear")
    base = Mixture([Src(60, 0), Src(45, 1), Src(30, 2)], sched, num_samples=120, seed=4)
    mixture = base.with_schedule(Schedule([(0, [0.1, 0.1, 0.8])]), from_position=70)
    n = len(mixture)
    model = [tuple(x) for x in zip(*(a.tolist() for a in mixture.source_of_many(np.arange(n))))]
    order = epoch_order(n, seed=3, epoch=0, shuffle=shuffle)

    def make(w):
        return [ResumableSampler(n, shuffle=shuffle, seed=3, rank=r, world_size=w,
                                 drop_last=drop_last) for r in range(w)]  # fmt: skip

    old = make(w1)
    k = data.draw(st.integers(0, len(old[0])))
    iters = [iter(s) for s in old]
    heads = [[next(it) for _ in range(k)] for it in iters]
    assert heads == [share[:k] for share in naive_deal(order, 0, w1, drop_last)]
    new = make(w2)
    for s in new:
        s.load_state_dict(old[data.draw(st.integers(0, w1 - 1))].state_dict())
    tails = [list(s) for s in new]
    assert tails == naive_deal(order, k * w1, w2, drop_last)
    served = [x for h in heads for x in _served(mixture, h)]
    served += [x for t in tails for x in _served(mixture, t)]
    want = [model[i] for share in naive_deal(order, 0, w1, drop_last) for i in share[:k]]
    want += [model[i] for share in naive_deal(order, k * w1, w2, drop_last) for i in share]
    assert served == want  # order and multiset of the list model
    assert Counter(served) == Counter(want)


# ----------------------------------------------------------------------------- views of two stores
def test_a_schedule_over_views_of_two_stores(tmp_path):
    rng = np.random.default_rng(0)
    a = mmpack.build(tmp_path / "a", [rng.integers(0, 50, int(m)) for m in rng.integers(5, 40, 60)])
    b = mmpack.build(tmp_path / "b", [rng.integers(0, 50, int(m)) for m in rng.integers(5, 40, 80)])
    views = [mmpack.WindowDataset(a, seqlen=16), mmpack.WindowDataset(b, seqlen=16)]
    sched = Schedule([(0, [3, 1]), (20, [1, 1]), (60, [1, 3])], interpolate="linear")
    mixture = Mixture(views, sched, seed=5)
    n = len(mixture)
    src, items = mixture.source_of_many(np.arange(n))
    ref = walk(mixture, min(n, 300))
    assert src[:300].tolist() == [k for k, _ in ref]
    assert items[:300].tolist() == [reference_item(mixture, k, o) for k, o in ref]
    batch = mixture.__getitems__(list(range(n)))
    assert batch.columns["source"].tolist() == src.tolist()
    for i in range(n):
        want = views[int(src[i])][int(items[i])]["input_ids"]
        assert np.array_equal(batch.columns["input_ids"][i], want)
    assert mixture.locate(3)[0]["source"] == int(src[3])
    later = mixture.with_schedule(Schedule([(0, [1, 0])]), from_position=n // 2)
    assert later.source_of_many(np.arange(n // 2))[0].tolist() == src[: n // 2].tolist()
    assert mixture.fingerprint != Mixture(views[::-1], sched, seed=5).fingerprint


def test_a_token_schedule_converts_with_each_source_seqlen():
    sources = [Src(10**5, 0, seqlen=32), Src(10**5, 1, seqlen=8)]
    sched = Schedule([(0, [0.5, 0.5]), (32_000, [0.8, 0.2])], unit="tokens")
    mixture = Mixture(sources, sched, num_samples=4000)
    # 0.5 / 32 + 0.5 / 8 = 0.078125 samples per token: 32 000 tokens last 2500 samples,
    # drawn 1:4 (sample weights 0.2, 0.8); then token weights 0.8, 0.2 are samples 1:1
    np.testing.assert_allclose(mixture.weights_at(0), [0.2, 0.8])
    np.testing.assert_allclose(mixture.weights_at(2499), [0.2, 0.8])
    np.testing.assert_allclose(mixture.weights_at(2500), [0.5, 0.5])
    counts = mixture.counts(2500)
    assert (counts * [32, 8]).tolist() == [16_000, 16_000]
    later = mixture.with_schedule(
        Schedule([(0, [1, 1]), (48_000, [0, 1])], unit="tokens"), from_position=2500
    )  # at 2500 samples, 32 000 tokens are consumed: 16 000 more at 1:4 is 1250 samples
    np.testing.assert_allclose(later.weights_at(3749), [0.2, 0.8])
    np.testing.assert_allclose(later.weights_at(3750), [0, 1])
    assert later.counts(3750).tolist() == [750, 3000]


def test_block_bounds_work_with_a_schedule(tmp_path):
    rng = np.random.default_rng(1)
    a = mmpack.build(tmp_path / "a", [rng.integers(0, 50, 30) for _ in range(60)])
    views = [mmpack.WindowDataset(a, seqlen=8), mmpack.WindowDataset(a, seqlen=8, stride=4)]
    sched = Schedule([(0, [1, 1]), (100, [1, 4])])
    mixture = Mixture(views, sched, seed=2, block_bytes=256)
    bounds = mixture.block_bounds(256)
    assert bounds[0] == 0 and bounds[-1] == len(mixture) and (np.diff(bounds) > 0).all()
    src, items = mixture.source_of_many(np.arange(len(mixture)))
    for s in range(2):
        drawn = items[src == s]
        assert len(set(drawn.tolist())) == drawn.size  # no repeat within the default length
