"""Skips and replays of :class:`ResumableSampler`, against a naive list model.

The model (``_orders.StreamModel``) keeps epoch ``e``'s stream as a plain Python list of global
positions (``e * n + j``, skipped ones removed, replayed ranges inserted where they were asked
for) and deals it with ``naive_deal`` (``tests/reference.py``); a global position ``p`` holds
sample ``epoch_order(epoch = p // n)[p % n]``.  A run is a random program of
draws, skips, replays (valid and refused), state round trips through JSON into samplers of
another world size (elastic resume, W1 -> W2 in 1..6) and epoch changes; every rank must serve
what the model deals it, with the epoch each sample was first drawn for.
Run: ``pytest tests/sampling/test_sampler_edits.py``.
"""

from __future__ import annotations

import json
from itertools import islice

import pytest
from _orders import StreamModel, sampler_kwargs, served_samples
from hypothesis import given
from hypothesis import strategies as st

from mmpack import ResumableSampler
from mmpack.errors import FormatError, StateMismatchError

SEED = 3


class Run:
    """``world_size`` samplers and their live iterators."""

    def __init__(self, n, world_size, drop_last, shuffle, state=None, epoch=0):
        kw = sampler_kwargs(n, shuffle)
        self.ranks = [
            ResumableSampler(n, seed=SEED, rank=r, world_size=world_size, drop_last=drop_last, **kw)
            for r in range(world_size)
        ]
        for s in self.ranks:
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))
            else:
                s.set_epoch(epoch)
        self.its = [iter(s) for s in self.ranks]

    def draw(self, k):
        return [[(int(i), i.epoch) for i in islice(it, k)] for it in self.its]

    def edit(self, name, a, b):
        for s in self.ranks:
            getattr(s, name)(a, b)


def _edit(data, model, name):
    """A range for ``name``: valid mostly, sometimes refused (the run must refuse it too)."""
    n, front = model.n, model.frontier()
    length = data.draw(st.integers(1, 2 * n))
    if name == "skip":
        lo = data.draw(st.integers(max(front - 3, 0), front + 2 * n))
        return lo, lo + length
    hi = data.draw(st.integers(1, front + 2))
    return max(hi - length, 0), hi


@given(
    n=st.integers(1, 40),
    w1=st.integers(1, 6),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([False, True, "blocks"]),
    data=st.data(),
)
def test_skips_and_replays_match_the_list_model_under_elastic_resume(
    n, w1, drop_last, shuffle, data
):
    model, run = StreamModel(n, w1, drop_last), Run(n, w1, drop_last, shuffle)
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["draw", "draw", "skip", "replay", "resume", "epoch"]))
        if op == "draw":
            k = data.draw(st.integers(0, 6))
            expected = [served_samples(n, shuffle, SEED, share) for share in model.draw(k)]
            assert run.draw(k) == expected
        elif op in ("skip", "replay"):
            a, b = _edit(data, model, op)
            try:
                getattr(model, op)(a, b)
            except ValueError:
                for s in run.ranks:
                    with pytest.raises(ValueError, match=rf"\[{a}, {b}\)"):
                        getattr(s, op)(a, b)
            else:
                run.edit(op, a, b)
        elif op == "resume":
            w2 = data.draw(st.integers(1, 6))
            state = run.ranks[data.draw(st.integers(0, len(run.ranks) - 1))].state_dict()
            model.resume(w2)
            run = Run(n, w2, drop_last, shuffle, state=state)
        else:  # finish the epoch, then the next one
            assert run.draw(10**6) == [
                served_samples(n, shuffle, SEED, sh) for sh in model.draw(10**6)
            ]
            model.next_epoch()
            run = Run(n, model.w, drop_last, shuffle, state=run.ranks[0].state_dict())
            for s in run.ranks:
                s.set_epoch(model.epoch)
            run.its = [iter(s) for s in run.ranks]
    rest = [served_samples(n, shuffle, SEED, share) for share in model.draw(10**6)]
    assert run.draw(10**6) == rest
    assert len({len(r) for r in rest}) == 1  # ranks stay in step


def test_a_spike_skip_and_a_replay_worked_example():
    s = ResumableSampler(10, shuffle=False, world_size=2)
    it = iter(s)
    assert [next(it), next(it)] == [0, 2]  # global positions 0..3 consumed by the two ranks
    s.skip(6, 13)  # the rest of epoch 0 from 6, and epoch 1's positions 0..2
    s.replay(1, 3)
    assert list(it) == [1, 4]  # rank 0's stream: 0 1 2 3 | 1 2 | 4 5 (then 6.. skipped)
    assert s.state_dict()["skips"] == [[6, 13]]
    s.set_epoch(1)
    assert list(s) == [3, 5, 7, 9]  # epoch 1's positions 10..12 (samples 0..2) are skipped
    with pytest.raises(ValueError, match=r"cannot skip \[12, 14\).*below 20"):
        s.skip(12, 14)
    with pytest.raises(ValueError, match=r"cannot replay \[15, 21\).*from 20 on"):
        s.replay(15, 21)
    with pytest.raises(ValueError, match=r"start=5, stop=5"):
        s.skip(5, 5)
    with pytest.raises(TypeError, match="start"):
        s.replay(1.5, 3)


def test_a_resumed_state_carries_its_edits_and_len_counts_them():
    s = ResumableSampler(20, seed=1)
    s.skip(5, 10)
    assert len(s) == 15
    fresh = ResumableSampler(20, seed=1, world_size=4)
    fresh.load_state_dict(s.state_dict())
    assert len(fresh) == 4 and fresh.skips == [(5, 10)]


def test_the_state_refuses_another_dataset_and_bad_edits():
    state = ResumableSampler(10, fingerprint="mix-a").state_dict()
    assert state["fingerprint"] == "mix-a"
    with pytest.raises(StateMismatchError, match="fingerprint='mix-a'.*fingerprint='mix-b'"):
        ResumableSampler(10, fingerprint="mix-b").load_state_dict(state)
    with pytest.raises(StateMismatchError, match="fingerprint='mix-a'.*fingerprint=None"):
        ResumableSampler(10).load_state_dict(state)
    with pytest.raises(TypeError, match="fingerprint"):
        ResumableSampler(10, fingerprint=3)
    s = ResumableSampler(10, fingerprint="mix-a")
    with pytest.raises(FormatError, match=r"unknown fields \['extra'\]"):
        s.load_state_dict({**state, "extra": 1})
    with pytest.raises(FormatError, match=r"replays=\[\[0, 11, 0, 2\]\]"):
        s.load_state_dict({**state, "replays": [[0, 11, 0, 2]]})
    with pytest.raises(FormatError, match="edits"):
        ResumableSampler(0).load_state_dict({**ResumableSampler(0).state_dict(), "skips": [[0, 1]]})
    with pytest.raises(ValueError, match="n=0"):
        ResumableSampler(0).skip(0, 1)


def test_replays_queue_in_the_order_they_were_asked():
    # two replays asked at one point, the first served, a third asked: it waits for the second
    s = ResumableSampler(3, shuffle=False)
    it = iter(s)
    assert [next(it), next(it)] == [0, 1]
    s.replay(0, 1)
    s.replay(0, 1)
    assert next(it) == 0
    s.replay(1, 2)
    assert list(it) == [0, 1, 2]
    # a replay asked while another is half served waits for its rest too
    s = ResumableSampler(6, shuffle=False)
    it = iter(s)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    s.replay(0, 3)
    assert next(it) == 0
    s.replay(3, 4)
    assert list(it) == [1, 2, 3, 4, 5]
