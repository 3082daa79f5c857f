"""Specification of :mod:`mmpack._src.sampling.mixture_stats`: ``Mixture.stats()`` holds every
field of :class:`MixtureStats` (a frozen dataclass with ``as_dict()``, not a dict).

Run: ``.venv/bin/python -m pytest tests/sampling/test_mixture_stats.py -q``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _mixture_sources import FakeSource

from mmpack import Mixture
from mmpack._src.sampling.mixture import MixtureStats


def test_stats_fields():
    mixture = Mixture(
        [FakeSource(100, k) for k in range(3)], [0.999, 0.0005, 0.0005], num_samples=5000
    )
    stats = mixture.stats()
    assert stats.num_samples == 5000 and stats.period == 2000
    assert abs(stats.proportions - stats.weights).max() < 1 / 5000 * 1.5
    assert 0 < stats.max_prefix_error <= stats.error_bound == 0.75
    np.testing.assert_allclose(stats.requested_weights, [0.999, 0.0005, 0.0005])
    np.testing.assert_array_equal(stats.repeats, mixture.repeats())
    assert isinstance(stats, MixtureStats)
    assert list(stats.as_dict()) == [
        "num_samples",
        "period",
        "weights",
        "requested_weights",
        "counts",
        "proportions",
        "max_prefix_error",
        "error_bound",
        "epochs",
        "repeats",
    ]  # the keys of the dict it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.period = 1  # type: ignore[misc]


def test_stats_is_a_dataclass_not_a_dict():
    """``Mixture.stats()`` has the one shape of every ``stats()``: attributes and ``as_dict()``;
    the dict reads it once also offered (with a DeprecationWarning) are gone."""
    stats = Mixture([FakeSource(10, k) for k in range(2)], [0.5, 0.5], num_samples=40).stats()
    assert stats.as_dict()["period"] == stats.period
    for read in (
        lambda: stats["counts"],
        lambda: stats.keys(),
        lambda: stats.get("counts"),
        lambda: "counts" in stats,
        lambda: dict(stats),
    ):
        with pytest.raises((TypeError, AttributeError)):
            read()
