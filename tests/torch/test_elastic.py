"""Elastic resume of :class:`ResumableSampler` (state saved at world size W1, loaded at W2).

The naive model materialises the epoch order as a list (``_orders.epoch_order``: the global
order or the block-window order) and deals it with Python slicing (``naive_deal`` in
``tests/reference.py``); the sampler must agree with it index for index, in every order.
Run: ``pytest tests/torch/test_elastic.py``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from _datasets import IndexDataset
from _orders import ORDERS, epoch_order, order_kwargs, sampler_kwargs
from hypothesis import given
from hypothesis import strategies as st
from reference import naive_deal

from mmpack import Permutation, ResumableSampler
from mmpack._src.torch import elastic
from mmpack.errors import FormatError, StateMismatchError

orders = pytest.mark.parametrize("order", ORDERS)
SHUFFLES = st.sampled_from([False, True, "blocks"])


def draw(sampler, k):
    it = iter(sampler)
    return [next(it) for _ in range(k)]


def make(n, w, drop_last, shuffle=True, seed=3):
    kw = sampler_kwargs(n, shuffle)
    return [
        ResumableSampler(n, seed=seed, rank=r, world_size=w, drop_last=drop_last, **kw)
        for r in range(w)
    ]


@given(
    n=st.integers(0, 400),
    w1=st.integers(1, 6),
    w2=st.integers(1, 6),
    drop_last=st.booleans(),
    shuffle=SHUFFLES,
    epoch=st.integers(0, 2**40),
    data=st.data(),
)
def test_elastic_resume_matches_naive_model(n, w1, w2, drop_last, shuffle, epoch, data):
    old = make(n, w1, drop_last, shuffle)
    for s in old:
        s.set_epoch(epoch)
    k = data.draw(st.integers(0, len(old[0])))
    heads = [draw(s, k) for s in old]
    order = epoch_order(n, seed=3, epoch=epoch, shuffle=shuffle)
    assert heads == [share[:k] for share in naive_deal(order, 0, w1, drop_last)]
    state = old[data.draw(st.integers(0, w1 - 1))].state_dict()  # any rank's state will do
    assert state["offset"] + state["position"] * state["world_size"] == k * w1

    new = make(n, w2, drop_last, shuffle)
    for s in new:
        s.load_state_dict(state)
    tails = [list(s) for s in new]
    g = k * w1
    assert tails == naive_deal(order, g, w2, drop_last)
    assert len({len(t) for t in tails}) <= 1  # equal shares: no rank waits at a collective

    consumed = [i for h in heads for i in h]
    resumed = [i for t in tails for i in t]
    if g < n:  # the old ranks were not in the padding yet
        pad = len(resumed) - (n - g) if not drop_last else 0
        dropped = (n - g) % w2 if drop_last else 0
        padding = [order[i % n] for i in range(pad)]  # wraps around (more than once when W2 > n)
        assert Counter(consumed + resumed) == Counter(order[: n - dropped] + padding)
        assert 0 <= pad < w2 and 0 <= dropped < w2
    else:
        assert resumed == []

    # the next epoch is dealt as usual at W2
    for s in new:
        s.set_epoch(epoch + 1)
    nxt = epoch_order(n, seed=3, epoch=epoch + 1, shuffle=shuffle)
    assert [list(s) for s in new] == naive_deal(nxt, 0, w2, drop_last)


@given(
    n=st.integers(1, 300),
    sizes=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([True, "blocks"]),
    data=st.data(),
)
def test_chained_elastic_resumes_consume_the_epoch_exactly(n, sizes, drop_last, shuffle, data):
    """W1 -> W2 -> W3 ...: each stage draws some rounds, saves, and the next stage loads."""
    order = epoch_order(n, seed=3, epoch=0, shuffle=shuffle)
    state, consumed, g = None, [], 0
    for stage, w in enumerate(sizes):
        ranks = make(n, w, drop_last, shuffle)
        if state is not None:
            for s in ranks:
                s.load_state_dict(state)
        expected = naive_deal(order, g, w, drop_last)
        last = stage == len(sizes) - 1
        k = len(expected[0]) if last else data.draw(st.integers(0, len(expected[0])))
        got = [draw(s, k) for s in ranks]
        assert got == [e[:k] for e in expected]
        consumed += [i for share in got for i in share]
        state = ranks[-1].state_dict()
        g = min(g + k * w, n) if g < n else g
        assert state["offset"] + state["position"] * w >= g
    # every sample once, plus padding (< last W) or minus the dropped tail (< last W)
    counts = Counter(consumed)
    assert set(counts) <= set(order)
    missing = [i for i in order if i not in counts]
    if drop_last:
        assert max(counts.values(), default=1) == 1 and len(missing) < sizes[-1]
        assert missing == order[len(order) - len(missing) :]  # only the tail is dropped
    else:
        assert not missing and sum(c - 1 for c in counts.values()) < sum(sizes)


def test_worked_example_from_the_docstring():
    old = make(10, 4, False, shuffle=False)
    for s in old:
        draw(s, 1)
    new = make(10, 3, False, shuffle=False)
    for s in new:
        s.load_state_dict(old[0].state_dict())
    assert [list(s) for s in new] == [[4, 7], [5, 8], [6, 9]]
    # after one draw at W2=3, the state says offset 4, position 1 (global position 7)
    again = make(10, 3, False, shuffle=False)
    for s in again:
        s.load_state_dict(old[0].state_dict())
    draw(again[1], 1)
    assert {k: again[1].state_dict()[k] for k in ("offset", "position")} == {
        "offset": 4,
        "position": 1,
    }
    last = make(10, 2, False, shuffle=False)
    for s in last:
        s.load_state_dict(again[1].state_dict())
    assert [list(s) for s in last] == [[7, 9], [8, 0]]  # 0: padding, the epoch's first position


@orders
def test_mixture_source_resumes_elastically(order):
    from mmpack import Mixture

    class Source:
        def __init__(self, n, k):
            self.n, self.k = n, k

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"tokens": np.array([self.k, i], dtype=np.int64)}

    mixture = Mixture([Source(40, 0), Source(25, 1)], [0.6, 0.4], num_samples=97, seed=2)
    n = len(mixture)
    full = [tuple(mixture[i]["tokens"]) for i in epoch_order(n, seed=3, epoch=0, order=order)]
    shuffle = True if order == "global" else "blocks"
    old = make(n, 4, False, shuffle)
    heads = [[tuple(mixture[i]["tokens"]) for i in draw(s, 9)] for s in old]
    new = make(n, 3, False, shuffle)
    for s in new:
        s.load_state_dict(old[2].state_dict())
    tails = [[tuple(mixture[i]["tokens"]) for i in s] for s in new]
    got = [x for h in heads for x in h] + [x for t in tails for x in t]
    pad = len(got) - n
    assert 0 <= pad < 3 and Counter(got) == Counter(full + full[:pad])


def test_a_block_order_state_refuses_another_order_at_any_world_size():
    bounds = order_kwargs("blocks", 10)
    state = ResumableSampler(10, seed=1, world_size=2, **bounds).state_dict()
    for kw in (
        {"shuffle": True},
        {**bounds, "window_blocks": 4},
        {**bounds, "block_bounds": [0, 10]},
    ):
        with pytest.raises(StateMismatchError):
            ResumableSampler(10, seed=1, world_size=3, **kw).load_state_dict(state)


def test_refusals_stay_and_bad_offsets_are_named():
    state = ResumableSampler(10, seed=1, world_size=2).state_dict()
    for kw in ({"n": 11, "seed": 1}, {"n": 10, "seed": 2}, {"n": 10, "seed": 1, "shuffle": False}):
        with pytest.raises(StateMismatchError):
            ResumableSampler(**kw, world_size=3).load_state_dict(state)
    s = ResumableSampler(10, seed=1, world_size=3)
    with pytest.raises(FormatError, match="offset=11"):
        s.load_state_dict({**state, "offset": 11})
    with pytest.raises(FormatError, match="offset"):
        s.load_state_dict({**state, "offset": 1.5})
    with pytest.raises(FormatError, match="position=5"):  # offset 3 leaves ceil(7/2) = 4 per rank
        s.load_state_dict({**state, "offset": 3, "position": 5})
    with pytest.raises(FormatError, match="world_size=0"):
        s.load_state_dict({**state, "world_size": 0})
    with pytest.raises(FormatError, match="offset"):  # every field is required
        s.load_state_dict({k: v for k, v in state.items() if k != "offset"})
    s.load_state_dict({**state, "position": 2})  # global position 4 at world size 3: 4, 7
    assert list(s) == Permutation(10, seed=1).map(np.array([4, 7], dtype=np.int64)).tolist()


@pytest.mark.parametrize("field", ["world_size", "position"])
def test_resume_point_names_a_missing_field(field):
    state = ResumableSampler(10, world_size=2).state_dict()
    del state[field]
    with pytest.raises(FormatError, match=field):
        elastic.resume_point(state, 10, 3, False)


def _loader(n, rank, world, num_workers, order, batch_size=4):
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = ResumableSampler(n, seed=5, rank=rank, world_size=world, **order_kwargs(order, n))
    return sampler, StatefulDataLoader(
        IndexDataset(n), sampler=sampler, batch_size=batch_size, num_workers=num_workers
    )


@orders
@pytest.mark.parametrize(
    "w1, w2, workers1, workers2", [(3, 2, 0, 0), (2, 3, 1, 0), (4, 3, 0, 1), (2, 3, 1, 1)]
)
def test_stateful_dataloader_recipe_w1_to_w2(w1, w2, workers1, workers2, order):
    n, k = 61, 3
    seen = []
    states = []
    for r in range(w1):
        _, loader = _loader(n, r, w1, workers1, order)
        it = iter(loader)
        seen += [i for _ in range(k) for i in next(it).reshape(-1).tolist()]
        states.append(loader.state_dict())
        del it
    saved = states[0]  # every rank's loader state holds the same sampler position
    assert all(elastic.sampler_state(s)["position"] == 4 * k for s in states)
    for r in range(w2):
        sampler, loader = _loader(n, r, w2, workers2, order)
        if workers1 == workers2:
            loader.load_state_dict(saved)  # the whole loader state, when num_workers matches
        else:
            sampler.load_state_dict(elastic.sampler_state(saved))  # any num_workers
        seen += [i for b in loader for i in b.reshape(-1).tolist()]
        sampler.set_epoch(1)  # later epochs: the ordinary W2 deal
        following = [i for b in loader for i in b.reshape(-1).tolist()]
        nxt = epoch_order(n, seed=5, epoch=1, order=order)
        assert following == naive_deal(nxt, 0, w2, False)[r]
    counts = Counter(seen)
    assert set(counts) == set(range(n))
    assert sum(counts.values()) - n < w2  # only padding repeats


def test_sampler_state_not_found_is_named():
    with pytest.raises(FormatError, match="no ResumableSampler state"):
        elastic.sampler_state({"_snapshot": {}})


@orders
def test_loaded_position_survives_a_plain_dataloader_with_workers(order):
    """torch's worker iterator calls iter(sampler) twice and draws from the second only."""
    from torch.utils.data import DataLoader

    kw = order_kwargs(order, 30)
    old = ResumableSampler(30, seed=4, world_size=2, **kw)
    draw(old, 6)
    sampler = ResumableSampler(30, seed=4, world_size=3, rank=1, **kw)
    sampler.load_state_dict(old.state_dict())  # global position 12: rank 1 of 3 takes 13, 16, ...
    got = [
        i
        for b in DataLoader(IndexDataset(30), sampler=sampler, batch_size=2, num_workers=1)
        for i in b.reshape(-1).tolist()
    ]
    assert got == [epoch_order(30, seed=4, epoch=0, order=order)[p] for p in range(13, 30, 3)]
