"""The run's one epoch walk (:meth:`mmpack._src.sampling.dealing.Dealing.draws`, over
:meth:`~mmpack._src.sampling.sampler_edits.EditLog.run`) against a walk of one epoch at a time."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mmpack._src.sampling.dealing import Dealing
from mmpack._src.sampling.sampler_edits import EditLog, merge_skip


def _dealing(n, world_size, drop_last, skips=(), replays=()):
    edits = EditLog(n)
    merged: list[list[int]] = []
    for a, b in skips:
        merged = merge_skip(merged, a, b)
    edits.set(merged, [list(r) for r in replays])
    return Dealing(
        n, shuffle=False, seed=0, rank=0, world_size=world_size, drop_last=drop_last, edits=edits
    )


def _one_epoch_at_a_time(deal, where, d):
    """The slow twin: every epoch's share, one after the other."""
    epoch, position, base = where
    rest = deal.share(epoch, base) - position
    if d <= rest:
        return epoch, position + d, base
    d -= rest
    epoch += 1
    while True:
        per = deal.share(epoch)
        if d <= per:
            return epoch, d, 0
        d -= per
        epoch += 1


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 9),
    world_size=st.integers(1, 4),
    drop_last=st.booleans(),
    skips=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 25)), max_size=3),
    replays=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40), st.integers(1, 9))),
    start=st.integers(0, 7),
    d=st.integers(0, 200),
)
def test_draws_match_one_epoch_at_a_time(n, world_size, drop_last, skips, replays, start, d):
    skips = [(a, a + k) for a, k in skips]
    replays = [(e, 0, a, a + k) for e, a, k in replays]  # each before its epoch's first index
    deal = _dealing(n, world_size, drop_last, skips, replays)
    where = (start, 0, 0)
    assume(n >= world_size or not drop_last)  # else only edited epochs deal anything
    assert deal.draws(where, d) == _one_epoch_at_a_time(deal, where, d)
    if d:
        epoch, drawn, _ = _one_epoch_at_a_time(deal, (0, 0, 0), d)
        assert deal.rank_epoch(d - 1) == (epoch, drawn - 1)


def test_a_far_edit_costs_its_edits_not_its_epochs():
    """An epoch skipped two million epochs in: the walk takes the plain epochs before it in one
    division (it once walked them one by one, and refused past a million)."""
    n, far = 10, 2_000_000
    deal = _dealing(n, 1, False, skips=[(far * n, (far + 1) * n)])
    assert deal.rank_epoch(far * n + 3) == (far + 1, 3)
    assert deal.rank_epoch(far * n - 1) == (far - 1, n - 1)
    assert deal.next_epoch(far - 1) == far + 1


def test_a_rank_dealt_nothing_is_told_so():
    deal = _dealing(1, 2, True)
    with pytest.raises(ValueError, match="rank 0 of 2 is dealt nothing"):
        deal.rank_epoch(0)
