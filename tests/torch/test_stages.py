"""Sequence-length stages (:class:`mmpack.Stages`) against a naive list model.

The model runs each stage's sampler as ``_orders.StreamModel`` lists (stage ``i`` keyed by
``stage_seed(seed, i)``), takes ``batch_size`` rounds per step (into the next epoch when one
ends) and ends a stage at the first step where what it served reaches its budget; a run draws
some batches at world size W1, saves any rank's state, resumes at W2 (1..6) and runs to the end,
in the global, the block-window (``_orders.bounds_of`` blocks) and the in-order order.  A random
program then mixes steps, skips and replays on the current or a later stage (valid or refused,
each model stage keeping its own ``StreamModel`` edits), the spike recipe (``positions_of`` of
some steps ahead, compared with the model's first-served positions, then skipped), new iterators
and JSON state round trips into W2 ranks, checking every rank's batches, ``step`` and ``stage``.
Budgets count what is served (a skipped position nothing, a replayed one again), so the model's
steps per stage never change with edits.  A real DataLoader serves two stages of different
``seqlen`` and batch sizes, and stages in block order follow each stage's plain sampler.
Run: ``pytest tests/torch/test_stages.py``.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from _orders import TEST_WINDOW_BLOCKS, StreamModel, bounds_of, served_samples
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack import ResumableSampler, Stages
from mmpack._src.torch.stages import StageDataset
from mmpack.errors import FormatError, StateMismatchError
from mmpack.torch import stage_seed

SEED = 5


class View:
    """``n`` samples of ``seqlen`` tokens; only the length, ``seqlen`` and the block bounds
    (``_orders.bounds_of``, whatever ``block_bytes``) matter here."""

    def __init__(self, n, seqlen):
        self.n, self.seqlen = n, seqlen

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i

    def block_bounds(self, block_bytes):
        return bounds_of(self.n)


class StagesModel:
    """The run as lists: one ``StreamModel`` per stage (edits of a later stage wait in its
    model), ``batch_size`` rounds a step, a stage over at the first step reaching its budget."""

    def __init__(self, specs, world_size, drop_last, unit, shuffle):
        self.specs, self.w, self.drop_last, self.unit, self.shuffle = (
            specs,
            world_size,
            drop_last,
            unit,
            shuffle,
        )
        self.stage, self.served, self.step = 0, 0, 0
        self.streams = [StreamModel(n, world_size, drop_last) for n, *_ in specs]

    def normal(self):
        while self.stage < len(self.specs) and self.served >= self.specs[self.stage][2]:
            self.stage, self.served = self.stage + 1, 0
        return self.stage

    def batch(self):
        """One step: every rank's batch, or None at the end of the run."""
        if self.normal() == len(self.specs):
            return None
        n, b, _, seqlen = self.specs[self.stage]
        stream = self.streams[self.stage]
        shares = [[] for _ in range(self.w)]
        while len(shares[0]) < b:
            got = stream.draw(b - len(shares[0]))
            if not got[0]:
                stream.next_epoch()
            for share, more in zip(shares, got, strict=True):
                share += more
        self.served += b * self.w * (seqlen if self.unit == "tokens" else 1)
        self.step += 1
        seed = stage_seed(SEED, self.stage)
        return [
            [(self.stage, *x) for x in served_samples(n, self.shuffle, seed, share)]
            for share in shares
        ]

    def edit(self, op, stage, a, b):
        if stage < self.normal():
            raise ValueError
        getattr(self.streams[stage], op)(a, b)

    def positions_of(self, start, stop):
        """``(stage, lo, hi)``: the positions steps ``[start, stop)`` serve first, per stage."""
        sim = copy.deepcopy(self)
        while sim.step < start and sim.batch() is not None:
            pass
        spans = {}
        while sim.step < stop and sim.normal() < len(sim.specs):
            s = sim.stage
            lo = sim.streams[s].frontier()
            sim.batch()
            hi = sim.streams[s].frontier()
            spans[s] = (spans.get(s, (lo,))[0], hi)
        return [(s, lo, hi) for s, (lo, hi) in sorted(spans.items()) if lo < hi]

    def resume(self, world_size):
        self.w = world_size
        for stream in self.streams:
            stream.resume(world_size)


def _stages(specs, unit, rank, world_size, drop_last, shuffle):
    blocks = {"block_bytes": 64, "window_blocks": TEST_WINDOW_BLOCKS} if shuffle == "blocks" else {}
    return Stages(
        [(budget, View(n, seqlen), b) for n, b, budget, seqlen in specs],
        seed=SEED,
        unit=unit,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shuffle=shuffle,
        **blocks,
    )


def _batches(its, k):
    out = [[] for _ in its]
    for r, it in enumerate(its):
        for _ in range(k):
            batch = next(it, None)
            if batch is None:
                break
            out[r].append([(s, int(i), i.epoch) for s, i in batch])
    return out


@given(
    specs=st.lists(
        st.tuples(st.integers(6, 30), st.integers(1, 4), st.integers(1, 120), st.integers(1, 4)),
        min_size=1,
        max_size=3,
    ),
    unit=st.sampled_from(["samples", "tokens"]),
    w1=st.integers(1, 6),
    w2=st.integers(1, 6),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([False, True, "blocks"]),
    data=st.data(),
)
def test_stages_match_the_list_model_under_elastic_resume(
    specs, unit, w1, w2, drop_last, shuffle, data
):
    model = StagesModel(specs, w1, drop_last, unit, shuffle)
    first = [_stages(specs, unit, r, w1, drop_last, shuffle) for r in range(w1)]
    total = len(first[0])
    k = data.draw(st.integers(0, total))
    head = _batches([iter(s) for s in first], k)
    for step in range(k):
        assert [h[step] for h in head] == model.batch()
    assert all(len(h) == k for h in head)
    state = first[data.draw(st.integers(0, w1 - 1))].state_dict()
    assert state["stage"] == first[0].stage
    second = [_stages(specs, unit, r, w2, drop_last, shuffle) for r in range(w2)]
    for s in second:
        s.load_state_dict(json.loads(json.dumps(state)))
    model.resume(w2)
    expected = []
    while (step := model.batch()) is not None:
        expected.append(step)
    assert len(second[0]) == len(expected)
    tail = _batches([iter(s) for s in second], 10**6)
    assert [[t[j] for t in tail] for j in range(len(expected))] == expected
    assert all(len(t) == len(expected) for t in tail)  # ranks stay in step
    assert all(s.stage == len(specs) for s in second)


class Run:
    """Every rank's :class:`Stages` at one world size, and their live iterators."""

    def __init__(self, specs, unit, world_size, drop_last, shuffle, state=None):
        self.ranks = [
            _stages(specs, unit, r, world_size, drop_last, shuffle) for r in range(world_size)
        ]
        for s in self.ranks:
            if state is not None:
                s.load_state_dict(json.loads(json.dumps(state)))
        self.its = [iter(s) for s in self.ranks]

    def steps(self, k):
        """The next ``k`` steps (fewer at the end of the run), each as every rank's batch."""
        got = _batches(self.its, k)
        assert len({len(g) for g in got}) == 1  # ranks stay in step
        return [[g[j] for g in got] for j in range(len(got[0]))]


def _edit_range(data, stream, op):
    """A range for ``op`` on a stage's stream: valid mostly, sometimes refused."""
    n, front = stream.n, stream.frontier()
    length = data.draw(st.integers(1, 2 * n))
    if op == "skip":
        lo = data.draw(st.integers(max(front - 3, 0), front + 2 * n))
        return lo, lo + length
    hi = data.draw(st.integers(1, front + 2))
    return max(hi - length, 0), hi


@given(
    specs=st.lists(
        st.tuples(st.integers(6, 20), st.integers(1, 3), st.integers(1, 60), st.integers(1, 3)),
        min_size=1,
        max_size=3,
    ),
    unit=st.sampled_from(["samples", "tokens"]),
    w1=st.integers(1, 6),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([False, True, "blocks"]),
    data=st.data(),
)
def test_skips_and_replays_across_stages_match_the_list_model(
    specs, unit, w1, drop_last, shuffle, data
):
    model = StagesModel(specs, w1, drop_last, unit, shuffle)
    run = Run(specs, unit, w1, drop_last, shuffle)
    for _ in range(data.draw(st.integers(1, 10))):
        op = data.draw(
            st.sampled_from(["steps", "steps", "skip", "replay", "spike", "resume", "iter"])
        )
        if op == "steps":
            k = data.draw(st.integers(0, 4))
            expected = [b for b in (model.batch() for _ in range(k)) if b is not None]
            assert run.steps(k) == expected
        elif op in ("skip", "replay"):
            stage = data.draw(st.integers(max(model.normal() - 1, 0), len(specs) - 1))
            a, b = _edit_range(data, model.streams[stage], op)
            try:
                model.edit(op, stage, a, b)
            except ValueError:
                for s in run.ranks:
                    with pytest.raises(ValueError, match=rf"\[{a}, {b}\)"):
                        getattr(s, op)(a, b, stage=stage)
            else:
                for s in run.ranks:
                    getattr(s, op)(a, b, stage=stage)
        elif op == "spike":  # skip what steps [t1, t2) would serve, over stage changes too
            t1 = model.step + data.draw(st.integers(0, 3))
            t2 = t1 + data.draw(st.integers(1, 4))
            spans = model.positions_of(t1, t2)
            assert all(s.positions_of(t1, t2) == spans for s in run.ranks)
            for stage, a, b in spans:
                model.edit("skip", stage, a, b)
                for s in run.ranks:
                    s.skip(a, b, stage=stage)
        elif op == "resume":  # any rank's state, through JSON, at another world size
            w2 = data.draw(st.integers(1, 6))
            state = run.ranks[data.draw(st.integers(0, len(run.ranks) - 1))].state_dict()
            model.resume(w2)
            run = Run(specs, unit, w2, drop_last, shuffle, state=state)
        else:  # a new iterator continues where the run stands
            run.its = [iter(s) for s in run.ranks]
        assert all(s.step == model.step and s.stage == model.normal() for s in run.ranks)
    expected = []
    while (step := model.batch()) is not None:
        expected.append(step)
    assert len(run.ranks[0]) == len(expected)
    assert run.steps(10**6) == expected


def test_a_spike_in_stages_skips_the_steps_positions_and_keeps_the_budget():
    specs = [(10, 2, 8, 1), (12, 3, 9, 1)]  # stage 0: 4 steps of 2; stage 1: 3 steps of 3
    full = _batches([iter(_stages(specs, "samples", 0, 1, False, False))], 100)[0]
    assert [len(b) for b in full] == [2] * 4 + [3] * 3
    run = _stages(specs, "samples", 0, 1, False, False)
    head = _batches([iter(run)], 2)[0]
    checkpoint = run.state_dict()
    assert checkpoint["step"] == 2
    resumed = _stages(specs, "samples", 0, 1, False, False)
    resumed.load_state_dict(checkpoint)
    assert resumed.step == 2
    assert resumed.positions_of(3, 5) == [(0, 6, 8), (1, 0, 3)]  # steps 3 and 4, two stages
    for stage, a, b in resumed.positions_of(3, 5):
        resumed.skip(a, b, stage=stage)
    assert len(resumed) == 5  # skipped positions are not served: the steps and budgets stand
    rest = _batches([iter(resumed)], 100)[0]
    ids = [[i for _, i, _ in batch] for batch in head + rest]
    assert ids == [[0, 1], [2, 3], [4, 5], [8, 9], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    with pytest.raises(ValueError, match=r"steps \[3, 5\).*step 7"):
        resumed.positions_of(3, 5)
    with pytest.raises(ValueError, match=r"cannot skip \[0, 2\) in stage 0: stage 0 is over"):
        resumed.skip(0, 2, stage=0)
    with pytest.raises(ValueError, match=r"in stage 1: cannot replay \[0, 2\)"):
        _stages(specs, "samples", 0, 1, False, False).replay(0, 2, stage=1)
    with pytest.raises(ValueError, match="stage=2"):
        resumed.skip(0, 2, stage=2)
    state = resumed.state_dict()
    assert state["edits"] == [
        {"skips": [[6, 8]], "replays": []},
        {"skips": [[0, 3]], "replays": []},
    ]


def test_a_replay_in_stages_is_served_again_and_counts_toward_the_budget():
    specs = [(10, 2, 12, 1), (12, 3, 9, 1)]  # two ranks: 3 steps of 2, then 2 steps of 3
    run = _stages(specs, "samples", 0, 2, False, False)
    it = iter(run)
    assert [[i for _, i, _ in b] for b in _batches([it], 1)[0]] == [[0, 2]]  # positions 0..3
    run.replay(0, 4)
    rest = [[i for _, i, _ in b] for b in _batches([it], 100)[0]]
    assert rest == [[0, 2], [4, 6], [0, 2, 4], [6, 8, 10]]  # without the replay: [8, 0] third
    assert run.stage == 2 and run.step == 5


def test_a_skip_over_many_epochs_is_walked_by_arithmetic():
    run = _stages([(10, 2, 8, 1), (12, 3, 9, 1)], "samples", 0, 1, False, False)
    run.skip(3, 10**10 + 5)  # the rest of epoch 0, then 10**9 - 1 whole epochs, then 0..4
    served = [[(i, e) for _, i, e in b] for b in _batches([iter(run)], 4)[0]]
    assert served == [[(0, 0), (1, 0)], [(2, 0), (5, 10**9)], [(6, 10**9), (7, 10**9)]] + [
        [(8, 10**9), (9, 10**9)]
    ]
    assert run.state_dict()["sampler"]["epoch"] == 0  # the next stage's sampler, at its start
    again = _stages([(10, 2, 8, 1), (12, 3, 9, 1)], "samples", 0, 1, False, False)
    again.skip(3, 10**10 + 5)
    assert again.positions_of(1, 3) == [(0, 2, 10**10 + 8)]


def test_a_stages_state_refuses_bad_edits_and_changes_nothing():
    specs = [(10, 2, 7, 1), (12, 3, 9, 1)]
    run = _stages(specs, "samples", 0, 1, False, True)
    run.skip(4, 6, stage=1)
    state = run.state_dict()
    assert state["edits"] == [{"skips": [], "replays": []}, {"skips": [[4, 6]], "replays": []}]
    other = _stages(specs, "samples", 0, 1, False, True)
    other.skip(1, 2)
    bad = {**state, "edits": [state["edits"][0], {"skips": [[6, 4]], "replays": []}]}
    with pytest.raises(FormatError, match=r"edits\[1\].*skips"):
        other.load_state_dict(bad)
    assert other.state_dict()["edits"][0] == {"skips": [[1, 2]], "replays": []}  # as it was
    with pytest.raises(FormatError, match="one {'skips', 'replays'} per stage"):
        other.load_state_dict({**state, "edits": state["edits"][:1]})
    with pytest.raises(FormatError, match=r"edits\[0\] has skips=\[\[0, 1\]\].*skips=\[\]"):
        other.load_state_dict({**state, "edits": [{"skips": [[0, 1]], "replays": []}] * 2})
    with pytest.raises(FormatError, match="step is out of range: -1"):
        other.load_state_dict({**state, "step": -1})
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_stages_in_block_order_follow_each_stages_plain_sampler(tmp_path):
    store = mmpack.build(tmp_path / "s.mmpack", [np.arange(n, dtype=np.int32) for n in [300] * 9])
    views = [mmpack.WindowDataset(store, seqlen=8), mmpack.WindowDataset(store, seqlen=32)]
    budgets = [3 * len(views[0]) // 2, len(views[1]) + 5]  # stage 0 runs into its second epoch
    stages = mmpack.Stages(
        [(budgets[0], views[0], 4), (budgets[1], views[1], 3)],
        seed=7,
        shuffle="blocks",
        block_bytes=128,
        window_blocks=5,
    )
    got, middle = [[], []], None
    for step, batch in enumerate(stages):
        for s, i in batch:
            got[s].append((int(i), i.epoch))
        if step == 5:
            middle = stages.state_dict()
    for s, view in enumerate(views):
        plain = ResumableSampler(
            len(view),
            seed=stage_seed(7, s),
            shuffle="blocks",
            block_bounds=view.block_bounds(128),
            window_blocks=5,
        )
        assert plain.block_order.n_blocks > 5
        want = []
        for epoch in range(3):
            plain.set_epoch(epoch)
            want += [(int(i), i.epoch) for i in plain]
        assert got[s] == want[: len(got[s])] and len(got[s]) >= budgets[s]
    for kwargs, field in (
        ({"shuffle": True}, "shuffle"),
        ({"shuffle": "blocks", "block_bytes": 256, "window_blocks": 5}, "block_bounds"),
        ({"shuffle": "blocks", "block_bytes": 128, "window_blocks": 4}, "window_blocks"),
    ):
        other = mmpack.Stages(
            [(budgets[0], views[0], 4), (budgets[1], views[1], 3)], seed=7, **kwargs
        )
        with pytest.raises(StateMismatchError, match=field):
            other.load_state_dict(middle)
    with pytest.raises(TypeError, match="block_bounds"):
        mmpack.Stages([(4, list(range(10)), 2)], shuffle="blocks")


def test_state_dict_consumed_counts_batches():
    specs = [(10, 2, 7, 1), (12, 3, 9, 1)]
    run = _stages(specs, "samples", 0, 1, False, True)
    full = _batches([iter(run)], 100)[0]
    again = _stages(specs, "samples", 0, 1, False, True)
    it = iter(again)
    _batches([it], 6)  # a prefetching loader has drawn 6, the loop used 5
    state = again.state_dict(consumed=5)
    assert state["stage"] == 1 and state["served"] == 3  # 4 steps of 2 reach 7; then one of 3
    assert len(full) == 4 + 3
    resumed = _stages(specs, "samples", 0, 1, False, True)
    resumed.load_state_dict(state)
    assert full[:5] + _batches([iter(resumed)], 100)[0] == full
    with pytest.raises(ValueError, match="consumed=7"):
        again.state_dict(consumed=7)


def test_a_stages_state_refuses_other_stages_and_bad_fields():
    specs = [(10, 2, 7, 1), (12, 3, 9, 1)]
    state = _stages(specs, "samples", 0, 1, False, True).state_dict()
    with pytest.raises(StateMismatchError, match=r"stages=\[\[7, 2, 10, 1\].*stages=\[\[8, 2"):
        _stages([(10, 2, 8, 1), (12, 3, 9, 1)], "samples", 0, 1, False, True).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="unit"):
        _stages(specs, "tokens", 0, 1, False, True).load_state_dict(state)
    run = _stages(specs, "samples", 0, 1, False, True)
    with pytest.raises(FormatError, match="stage is out of range: 3"):
        run.load_state_dict({**state, "stage": 3})
    with pytest.raises(FormatError, match="fields"):
        run.load_state_dict({**state, "extra": 0})
    same_n = [(10, 2, 7, 1), (10, 3, 9, 1)]
    state = _stages(same_n, "samples", 0, 1, False, True).state_dict()
    with pytest.raises(StateMismatchError, match="seed="):
        _stages(same_n, "samples", 0, 1, False, True).load_state_dict({**state, "stage": 1})
    with pytest.raises(ValueError, match="unit must be"):
        Stages([(1, View(3, 1), 1)], unit="steps")
    with pytest.raises(TypeError, match=r"stages\[0\] view.seqlen"):
        Stages([(1, list(range(4)), 1)], unit="tokens")
    with pytest.raises(ValueError, match="too few"):
        Stages([(1, View(3, 1), 1)], world_size=4, drop_last=True)


def test_a_dataloader_gets_each_stage_at_its_seqlen_and_batch_size(tmp_path):
    from torch.utils.data import DataLoader

    from mmpack.torch import collate

    store = mmpack.build(tmp_path / "s.mmpack", [np.arange(2000, dtype=np.int32)])
    short = mmpack.WindowDataset(store, seqlen=8)
    long = mmpack.WindowDataset(store, seqlen=32)
    stages = mmpack.Stages([(8 * 6 * 4, short, 6), (32 * 2 * 3, long, 2)], unit="tokens")
    assert isinstance(stages.dataset, StageDataset)
    loader = DataLoader(stages.dataset, batch_sampler=stages, collate_fn=collate, num_workers=1)
    shapes = [tuple(b["input_ids"].shape) for b in loader]
    assert shapes == [(6, 8)] * 4 + [(2, 32)] * 3
    assert stages.stage == 2 and len(loader) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_resumes_the_stages_exactly(tmp_path, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mmpack.torch import collate

    store = mmpack.build(tmp_path / "s.mmpack", [np.arange(3000, dtype=np.int32)])

    def loader():
        short, long = mmpack.WindowDataset(store, seqlen=8), mmpack.WindowDataset(store, seqlen=32)
        stages = mmpack.Stages([(6 * 5, short, 6), (2 * 4, long, 2)])
        return StatefulDataLoader(
            stages.dataset, batch_sampler=stages, collate_fn=collate, num_workers=workers
        )

    full = [b["input_ids"][:, 0].tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["input_ids"][:, 0].tolist() for _ in range(6)]  # the stage changes at 5
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    assert len(full) == 9 and head + [b["input_ids"][:, 0].tolist() for b in again] == full


def test_tokens_stages_take_a_mixture_of_views_of_one_seqlen(tmp_path):
    from mmpack import Mixture

    a = mmpack.build(tmp_path / "a.mmpack", [np.arange(400, dtype=np.int32)])
    b = mmpack.build(tmp_path / "b.mmpack", [np.arange(500, 900, dtype=np.int32)])
    mix = Mixture([mmpack.WindowDataset(a, seqlen=8), mmpack.WindowDataset(b, seqlen=8)], [1, 1])
    assert mix.seqlen == 8
    stages = Stages([(8 * 4 * 3, mix, 4), (5, View(9, 3), 1)], unit="tokens")
    assert [len(batch) for batch in stages] == [4, 4, 4, 1, 1]

    class Rows:
        def __init__(self, seqlen=None):
            if seqlen is not None:
                self.seqlen = seqlen

        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"tokens": np.array([i])}

    assert Mixture([Rows(8), Rows(4)], [1, 1]).seqlen is None
    with pytest.raises(TypeError, match=r"its sources have seqlen \[8, None\]"):
        Stages([(8, Mixture([Rows(8), Rows()], [1, 1]), 1)], unit="tokens")
