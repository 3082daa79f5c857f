"""A view that orders itself is read in its own order: a mixture whose weights follow a schedule
puts position ``p`` at step ``p``, so ``mmpack.torch.loader``, ``ResumableSampler(view)`` and
``Stages`` deal its positions to the ranks without permuting them, and refuse ``shuffle=True``
(or ``"blocks"``) for it; a mixture of constant weights is shuffled as any view.

Run: ``pytest tests/core/test_sample_order.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpack
import mmpack.torch
from mmpack import ResumableSampler, Stages

N = 400  # samples of the mixture


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("order")
    a = mmpack.build(tmp / "a", [np.arange(4 * N)], dtype="uint16")
    b = mmpack.build(tmp / "b", [np.arange(4 * N) + 5000], dtype="uint16")
    return [mmpack.WindowDataset(s, 4, eot=None) for s in (a, b)]


def _anneal(sources) -> mmpack.Mixture:
    """Source 1 goes from 30% at the first position to 90% at the last."""
    schedule = mmpack.Schedule([(0, [0.7, 0.3]), (N, [0.1, 0.9])], interpolate="linear")
    return mmpack.Mixture(sources, schedule, num_samples=N, seed=3)


def test_the_loader_reads_a_scheduled_mixture_in_its_order(sources):
    mix = _anneal(sources)
    loader = mmpack.torch.loader(mix, 20)
    steps = [batch["source"].float().mean().item() for batch in loader]
    # each step trains at the schedule's weight there, not at the average (~0.6) throughout
    assert steps[0] < 0.4 and steps[-1] > 0.8
    expected = mix.source_of_many(np.arange(N))[0].reshape(-1, 20).mean(axis=1)
    assert np.allclose(steps, expected)
    assert mix.ordered and loader.sampler.shuffle is False


def test_ranks_share_a_scheduled_mixture_in_its_order(sources):
    mix = _anneal(sources)
    for rank in (0, 1):
        loader = mmpack.torch.loader(mix, 10, rank=rank, world_size=2)
        assert list(loader.sampler) == list(range(rank, N, 2))


@pytest.mark.parametrize("shuffle", [True, "blocks"])
def test_an_explicit_shuffle_of_a_scheduled_mixture_is_refused(sources, shuffle):
    mix = _anneal(sources)
    for make in (
        lambda: mmpack.torch.loader(mix, 10, shuffle=shuffle),
        lambda: ResumableSampler(mix, shuffle=shuffle),
        lambda: Stages([(40, mix, 4)], shuffle=shuffle),
    ):
        with pytest.raises(ValueError, match="shuffle=False") as e:
            make()
        assert f"shuffle={shuffle!r}" in str(e.value) and "Mixture" in str(e.value)


def test_a_changed_mixture_orders_itself(sources):
    mix = mmpack.Mixture(sources, [0.5, 0.5], num_samples=N)
    assert not mix.ordered
    changed = mix.with_schedule([0.1, 0.9], from_position=100)
    assert changed.ordered and ResumableSampler(changed).shuffle is False


def test_a_constant_mixture_is_shuffled_as_before(sources):
    mix = mmpack.Mixture(sources, [0.5, 0.5], num_samples=N, seed=1)
    constant = mmpack.Mixture(sources, mmpack.Schedule([(0, [0.5, 0.5])]), num_samples=N, seed=1)
    for m in (mix, constant):
        assert not m.ordered
        loader = mmpack.torch.loader(m, 10, seed=4)
        assert loader.sampler.shuffle is True
        assert list(loader.sampler) == list(ResumableSampler(N, seed=4))
    assert list(mmpack.torch.loader(mix, 10, shuffle=False).sampler) == list(range(N))


def test_a_sampler_given_the_mixture_reads_it_in_order(sources):
    mix = _anneal(sources)
    assert list(ResumableSampler(mix)) == list(range(N))
    assert ResumableSampler(mix, shuffle=False).shuffle is False
    # given only a length, the sampler knows nothing of the order: it shuffles (documented)
    assert ResumableSampler(len(mix)).shuffle is True


def test_stages_read_a_scheduled_mixture_in_its_order(sources):
    mix = _anneal(sources)
    stages = Stages([(8, sources[0], 4), (N, mix, 10)], seed=2)
    batches = list(stages)
    assert [s.shuffle for s in stages._samplers] == [True, False]  # the window view: shuffled
    later = [int(i) for batch in batches[2:] for s, i in batch if s == 1]
    assert later == list(range(N))


def test_check_shuffle_rule():
    from mmpack._src.core.sample_order import check_shuffle

    class Ordered:
        ordered = True

    assert check_shuffle(None) is True and check_shuffle(None, Ordered()) is False
    assert check_shuffle(False, Ordered()) is False and check_shuffle("blocks") == "blocks"
    with pytest.raises(TypeError, match="got str 'yes'"):
        check_shuffle("yes")
    with pytest.raises(ValueError, match="shuffle=False"):
        check_shuffle(True, Ordered())
