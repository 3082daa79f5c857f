"""One configuration fingerprint per view, recorded by default and carried across schedule changes.

Every view (store, subset, window, packed, mixture, stages) has a ``fingerprint`` of what decides
its samples; ``mmpack.torch.loader`` (through ``ResumableSampler(view)``) records it in its state
and refuses a state of another; a mixture changed by ``with_schedule(new, from_position=p)``
accepts the states of the mixture it was changed from taken at or before ``p``, and no other.

Run: ``pytest tests/core/test_fingerprints.py``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import mmpack
import mmpack.torch
from mmpack import ResumableSampler, Stages
from mmpack.errors import StateMismatchError

DOCS = [list(range(10 * k + 1, 10 * k + 8)) for k in range(41)]  # 41 documents of 7 tokens


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fingerprint")


@pytest.fixture(scope="module")
def store(tmp):
    return mmpack.build(tmp / "s", DOCS, shuffle_docs=1)


def _state_after(loader, batches: int) -> dict:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_every_view_has_a_stable_fingerprint_of_what_decides_its_samples(tmp, store):
    window = mmpack.WindowDataset(store, 8)
    packed = mmpack.PackedDataset(store, 16)
    subset = store.select(range(0, 40, 2))
    views = [window, packed, mmpack.WindowDataset(subset, 8), mmpack.Mixture([window], [1.0])]
    for view in views:
        assert isinstance(view.fingerprint, str) and len(view.fingerprint) == 32
        assert pickle.loads(pickle.dumps(view)).fingerprint == view.fingerprint
    reopened = mmpack.open(tmp / "s")
    assert mmpack.WindowDataset(reopened, 8).fingerprint == window.fingerprint
    assert mmpack.WindowDataset(store, 8, dtype="int32").fingerprint == window.fingerprint
    assert mmpack.PackedDataset(store, 16, cache=False).fingerprint == packed.fingerprint
    others = [
        mmpack.WindowDataset(store, 8, labels=True),
        mmpack.WindowDataset(store, 8, stride=4),
        mmpack.WindowDataset(store, 8, eot=0),
        mmpack.WindowDataset(subset, 8),
        mmpack.WindowDataset(mmpack.build(tmp / "s2", DOCS, shuffle_docs=2), 8),
    ]
    fingerprints = {v.fingerprint for v in [window, *others]}
    assert len(fingerprints) == len(others) + 1
    assert mmpack.PackedDataset(store, 16, label_shift="hf").fingerprint != packed.fingerprint
    mixes = [mmpack.Mixture([w, window], [0.5, 0.5], num_samples=20) for w in others[1:3]]
    assert mixes[0].fingerprint != mixes[1].fingerprint  # the sources' view parameters count


@pytest.mark.parametrize("other", ["labels", "shuffle_docs"])
def test_a_loader_state_of_another_view_of_the_same_length_is_refused(tmp, store, other):
    view = mmpack.WindowDataset(store, 8)
    if other == "labels":
        changed = mmpack.WindowDataset(store, 8, labels=True)
    else:  # the same documents built with another --shuffle-docs seed
        changed = mmpack.WindowDataset(mmpack.build(tmp / f"r{other}", DOCS, shuffle_docs=5), 8)
    assert len(changed) == len(view)
    state = _state_after(mmpack.torch.loader(view, 4), 2)
    resumed = mmpack.torch.loader(changed, 4)
    with pytest.raises(StateMismatchError) as e:
        resumed.load_state_dict(state)
    assert view.fingerprint in str(e.value) and changed.fingerprint in str(e.value)
    assert state["sampler"]["fingerprint"] == view.fingerprint
    mmpack.torch.loader(view, 4).load_state_dict(state)  # the same view loads it


def _mixture(store, seed: int = 1) -> mmpack.Mixture:
    a = mmpack.WindowDataset(store, 4)
    b = mmpack.WindowDataset(store, 4, stride=2)
    schedule = mmpack.Schedule([(0, [0.8, 0.2]), (200, [0.2, 0.8])], interpolate="linear")
    return mmpack.Mixture([a, b], schedule, num_samples=200, seed=seed)


def _sources(loader) -> list[int]:
    return [int(s) for batch in loader for s in batch["source"]]


def test_a_changed_mixture_resumes_a_state_taken_before_the_change(store):
    mix = _mixture(store)
    state = _state_after(mmpack.torch.loader(mix, 10), 3)  # 30 positions consumed
    for p in (30, 31, 100):
        changed = mix.with_schedule([0.0, 1.0], from_position=p)
        assert changed.fingerprint != mix.fingerprint
        assert changed.earlier_fingerprints == ((mix.fingerprint, p),)
        resumed = mmpack.torch.loader(changed, 10)
        resumed.load_state_dict(state)
        expected = changed.source_of_many(np.arange(30, 200))[0].tolist()
        assert _sources(resumed) == expected  # the rest, under the new schedule from p on
        assert expected[p - 30 :] == [1] * (200 - p)


def test_a_changed_mixture_refuses_a_state_past_the_change_or_of_another_mixture(store):
    mix = _mixture(store)
    state = _state_after(mmpack.torch.loader(mix, 10), 3)
    changed = mix.with_schedule([0.0, 1.0], from_position=29)
    with pytest.raises(StateMismatchError, match="stands at position 30, past the change") as e:
        mmpack.torch.loader(changed, 10).load_state_dict(state)
    assert "changed from at position 29" in str(e.value)
    other = mix.with_schedule([0.0, 1.0], from_position=100)
    state = _state_after(mmpack.torch.loader(_mixture(store, seed=2), 10), 1)  # another seed
    with pytest.raises(StateMismatchError, match="fingerprint="):
        mmpack.torch.loader(other, 10).load_state_dict(state)
    # a state of the changed mixture does not load into the mixture it was changed from
    later = _state_after(mmpack.torch.loader(other, 10), 1)
    with pytest.raises(StateMismatchError, match="fingerprint="):
        mmpack.torch.loader(_mixture(store), 10).load_state_dict(later)


def test_changes_chain_and_each_keeps_the_earliest_bound(store):
    mix = _mixture(store)
    first = mix.with_schedule([0.5, 0.5], from_position=40)
    second = first.with_schedule([0.0, 1.0], from_position=120)
    assert second.earlier_fingerprints == ((mix.fingerprint, 40), (first.fingerprint, 120))
    third = second.with_schedule([1.0, 0.0], from_position=20)
    assert [p for _, p in third.earlier_fingerprints] == [20, 20, 20]
    state = _state_after(mmpack.torch.loader(mix, 10), 4)  # 40 consumed
    mmpack.torch.loader(second, 10).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="past the change"):
        mmpack.torch.loader(third, 10).load_state_dict(state)


def test_a_state_read_in_another_order_does_not_cross_a_change(store):
    mix = _mixture(store)
    saved = ResumableSampler(mix, shuffle=False)
    saved.load_state_dict({**saved.state_dict(), "position": 10})
    state = saved.state_dict()
    changed = mix.with_schedule([0.0, 1.0], from_position=50)
    ResumableSampler(changed).load_state_dict(state)  # read in order, 10 <= 50: loads
    with pytest.raises(StateMismatchError, match="fingerprint"):  # fingerprint given: no lineage
        ResumableSampler(changed, fingerprint=changed.fingerprint).load_state_dict(state)


def test_the_sampler_takes_the_views_fingerprint_only_when_given_the_view(store):
    view = mmpack.WindowDataset(store, 8)
    assert ResumableSampler(view).fingerprint == view.fingerprint
    assert ResumableSampler(len(view)).fingerprint is None
    assert ResumableSampler(view, fingerprint="mine").fingerprint == "mine"
    assert ResumableSampler(list(range(5))).fingerprint is None  # a dataset without one


def test_stages_have_a_fingerprint_and_check_the_current_stages_view(store):
    a, b = mmpack.WindowDataset(store, 8), mmpack.WindowDataset(store, 8, labels=True)
    run = Stages([(8, a, 2), (8, a, 4)], seed=1)
    assert run.fingerprint == Stages([(8, a, 2), (8, a, 4)], seed=1).fingerprint
    other = Stages([(8, b, 2), (8, a, 4)], seed=1)
    assert other.fingerprint != run.fingerprint
    assert Stages([(8, a, 2), (8, a, 4)], seed=2).fingerprint != run.fingerprint
    it = iter(run)
    next(it)
    state = run.state_dict()
    with pytest.raises(StateMismatchError) as e:
        other.load_state_dict(state)
    assert a.fingerprint in str(e.value) and b.fingerprint in str(e.value)
