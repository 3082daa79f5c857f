"""Sequence-length stages (:class:`mmpack.Stages`) against a naive list model.

The model runs each stage's sampler as ``_orders.StreamModel`` lists (stage ``i`` keyed by
``stage_seed(seed, i)``), takes ``batch_size`` rounds per step (into the next epoch when one
ends) and ends a stage at the first step where what it served reaches its budget; a run draws
some batches at world size W1, saves any rank's state, resumes at W2 (1..6) and runs to the end.
A real DataLoader then serves two stages of different ``seqlen`` and batch sizes.
Run: ``pytest tests/test_stages.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack.errors import FormatError, StateMismatchError
from mmpack.torch.stages import Stages, stage_seed

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from _orders import StreamModel, served_samples

SEED = 5


class View:
    """``n`` samples of ``seqlen`` tokens; only the length and ``seqlen`` matter here."""

    def __init__(self, n, seqlen):
        self.n, self.seqlen = n, seqlen

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class StagesModel:
    def __init__(self, specs, world_size, drop_last, unit, shuffle):
        self.specs, self.w, self.drop_last, self.unit, self.shuffle = (
            specs,
            world_size,
            drop_last,
            unit,
            shuffle,
        )
        self.stage, self.served = 0, 0
        self.stream = StreamModel(specs[0][0], world_size, drop_last)

    def _normal(self):
        while self.stage < len(self.specs) and self.served >= self.specs[self.stage][2]:
            self.stage, self.served = self.stage + 1, 0
            if self.stage < len(self.specs):
                self.stream = StreamModel(self.specs[self.stage][0], self.w, self.drop_last)

    def batch(self):
        """One step: every rank's batch, or None at the end of the run."""
        self._normal()
        if self.stage == len(self.specs):
            return None
        n, b, _, seqlen = self.specs[self.stage]
        shares = [[] for _ in range(self.w)]
        while len(shares[0]) < b:
            got = self.stream.draw(b - len(shares[0]))
            if not got[0]:
                self.stream.next_epoch()
            for share, more in zip(shares, got, strict=True):
                share += more
        self.served += b * self.w * (seqlen if self.unit == "tokens" else 1)
        seed = stage_seed(SEED, self.stage)
        return [
            [(self.stage, *x) for x in served_samples(n, self.shuffle, seed, share)]
            for share in shares
        ]

    def resume(self, world_size):
        self.w = world_size
        self.stream.resume(world_size)


def _stages(specs, unit, rank, world_size, drop_last, shuffle):
    return Stages(
        [(budget, View(n, seqlen), b) for n, b, budget, seqlen in specs],
        seed=SEED,
        unit=unit,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shuffle=shuffle,
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
    shuffle=st.booleans(),
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

    from mmpack.torch.collate import collate

    store = mmpack.build(tmp_path / "s.mmpack", [np.arange(2000, dtype=np.int32)])
    short = mmpack.WindowDataset(store, seqlen=8)
    long = mmpack.WindowDataset(store, seqlen=32)
    stages = mmpack.Stages([(8 * 6 * 4, short, 6), (32 * 2 * 3, long, 2)], unit="tokens")
    loader = DataLoader(stages.dataset, batch_sampler=stages, collate_fn=collate, num_workers=1)
    shapes = [tuple(b["input_ids"].shape) for b in loader]
    assert shapes == [(6, 8)] * 4 + [(2, 32)] * 3
    assert stages.stage == 2 and len(loader) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_resumes_the_stages_exactly(tmp_path, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mmpack.torch.collate import collate

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
