"""Batch-size warm-up and masking-ratio cool-down reproduce the seed's formulas; time strings."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown, parse_tokens


# --------------------------------------------------------------------------- reference twins
def seed_batch_size(min_bs: int, max_bs: int, warmup_tokens: int, world_size: int, t: int) -> int:
    """The seed's BatchSizeWarmupScheduler, formula for formula."""
    warmup = math.ceil(warmup_tokens / world_size)
    total = sum(range(min_bs, max_bs))
    per_unit = warmup / total
    thresholds, cumsum = [], 0
    for bs in range(min_bs, max_bs):
        cumsum += bs
        thresholds.append(math.ceil(per_unit * cumsum))
    if t >= warmup:
        return max_bs
    for i, thr in enumerate(thresholds):
        if t < thr:
            return min_bs + i
    return max_bs


def seed_mask_ratio(initial, final, cooldown, start, schedule, step, world_size, t) -> float:
    """The seed's MaskingRatioCooldownScheduler, formula for formula."""
    n_steps = None
    if schedule == "stair":
        n_steps = math.ceil((initial - final) / step) if initial > final else 0
    start = math.ceil(start / world_size)
    cooldown = math.ceil(cooldown / world_size)
    end = start + cooldown
    if t < start:
        return initial
    if t >= end:
        return final
    progress = (t - start) / cooldown
    if schedule == "linear":
        ratio = initial - progress * (initial - final)
    else:
        ratio = initial - math.floor(progress * n_steps) * step
    return max(ratio, final)


# --------------------------------------------------------------------------- warm-up
def test_warmup_values_at_chosen_token_counts():
    s = BatchSizeWarmup(2, 6, "1000tok", world_size=2)
    assert s.warmup_tokens == 500
    # sum(range(2, 6)) = 14; thresholds ceil(500/14 * [2, 5, 9, 14]) = [72, 179, 322, 500]
    assert s.thresholds == [72, 179, 322, 500]
    expect = {0: 2, 71: 2, 72: 3, 178: 3, 179: 4, 321: 4, 322: 5, 499: 5, 500: 6, 10**9: 6}
    for t, bs in expect.items():
        assert s(t) == bs == seed_batch_size(2, 6, 1000, 2, t), t


@given(
    min_bs=st.integers(1, 20),
    extra=st.integers(1, 20),
    warmup=st.integers(1, 10**7),
    world=st.integers(1, 8),
    t=st.integers(0, 2 * 10**7),
)
def test_warmup_matches_seed(min_bs, extra, warmup, world, t):
    s = BatchSizeWarmup(min_bs, min_bs + extra, warmup, world)
    assert s(t) == seed_batch_size(min_bs, min_bs + extra, warmup, world, t)


def test_warmup_degenerate_and_invalid():
    assert BatchSizeWarmup(4, 4, 100)(0) == 4  # the seed divides by zero here
    with pytest.raises(ValueError, match="min_batch_size"):
        BatchSizeWarmup(5, 4, 100)
    with pytest.raises(ValueError, match="min_batch_size"):
        BatchSizeWarmup(0, 4, 100)
    with pytest.raises(ValueError, match="world_size"):
        BatchSizeWarmup(1, 4, 100, world_size=0)


# --------------------------------------------------------------------------- cool-down
def test_cooldown_values_at_chosen_token_counts():
    lin = MaskingRatioCooldown(0.3, 0.1, "2000tok", start_tokens="400tok", world_size=2)
    assert (lin.start_tokens, lin.cooldown_tokens, lin.end_tokens) == (200, 1000, 1200)
    for t, want in {0: 0.3, 199: 0.3, 200: 0.3, 700: 0.2, 1100: 0.12, 1200: 0.1, 5000: 0.1}.items():
        assert lin(t) == pytest.approx(want)
        assert lin(t) == seed_mask_ratio(0.3, 0.1, 2000, 400, "linear", None, 2, t)

    stair = MaskingRatioCooldown(0.3, 0.15, 1000, schedule="stair", step_size=0.05)
    assert stair.num_stairs == 3
    for t, want in {0: 0.3, 333: 0.3, 334: 0.25, 667: 0.2, 999: 0.2, 1000: 0.15}.items():
        assert stair(t) == pytest.approx(want)
        assert stair(t) == seed_mask_ratio(0.3, 0.15, 1000, 0, "stair", 0.05, 1, t)


@given(
    initial=st.floats(0, 1),
    frac=st.floats(0, 1),
    cooldown=st.integers(1, 10**6),
    start=st.integers(0, 10**6),
    world=st.integers(1, 8),
    stair=st.booleans(),
    step=st.floats(0.001, 0.5),
    t=st.integers(0, 3 * 10**6),
)
def test_cooldown_matches_seed(initial, frac, cooldown, start, world, stair, step, t):
    final = initial * frac
    cooldown = max(cooldown, world)
    schedule = "stair" if stair else "linear"
    s = MaskingRatioCooldown(
        initial,
        final,
        cooldown,
        start_tokens=start,
        schedule=schedule,
        step_size=step if stair else None,
        world_size=world,
    )
    got = s(t)
    assert got == seed_mask_ratio(initial, final, cooldown, start, schedule, step, world, t)
    assert final <= got <= initial


def test_cooldown_invalid():
    with pytest.raises(ValueError, match="step_size"):
        MaskingRatioCooldown(0.3, 0.1, 100, schedule="stair")
    with pytest.raises(ValueError, match="step_size"):
        MaskingRatioCooldown(0.3, 0.1, 100, schedule="stair", step_size=0)
    with pytest.raises(ValueError, match="schedule"):
        MaskingRatioCooldown(0.3, 0.1, 100, schedule="cosine")
    with pytest.raises(ValueError, match="cooldown_tokens"):
        MaskingRatioCooldown(0.3, 0.1, 0, world_size=8)
    with pytest.raises(ValueError, match="final"):
        MaskingRatioCooldown(0.1, 0.3, 100)
    with pytest.raises(ValueError, match="initial"):
        MaskingRatioCooldown(1.5, 0.3, 100)


# --------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    "text, tokens",
    [
        ("100000tok", 100000),
        ("100_000tok", 100000),
        ("1e5tok", 100000),
        ("1.5e3tok", 1500),
        (" 42 TOK ", 42),
        ("0tok", 0),
        (".5e1tok", 5),
    ],
)
def test_parse_tokens(text, tokens):
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["10ba", "3ep", "100sp", "0.5dur"])
def test_parse_rejects_other_units(text):
    with pytest.raises(ValueError, match="only token durations"):
        parse_tokens(text, "warmup_tokens")


@pytest.mark.parametrize("text", ["1.5tok", "tok", "-5tok", "5", "1e-1tok", "1__0tok", "5 k tok"])
def test_parse_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_tokens(text)


def test_parse_ints_and_time_objects():
    assert parse_tokens(7) == 7
    with pytest.raises(ValueError):
        parse_tokens(-1)
    with pytest.raises(TypeError):
        parse_tokens(True)
    with pytest.raises(TypeError):
        parse_tokens(1.5)

    class Unit:
        value = "tok"

    class Time:
        value, unit = 123, Unit()

    assert parse_tokens(Time()) == 123
