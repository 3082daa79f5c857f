"""What a mixture realises: :class:`MixtureStats`, the return of ``Mixture.stats()``.

A frozen dataclass, like :class:`mmpack._src.packing.plan_stats.PackingStats` (``PackedDataset.stats()``) and
:class:`mmpack._src.views.window_stats.WindowStats` (``WindowDataset.stats()``), so every ``stats()``
of the library has one shape: attributes, and ``as_dict()`` for a plain dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.kernels.mixture import max_prefix_error

__all__ = ["MixtureStats", "period_error"]


@dataclass(frozen=True, eq=False)
class MixtureStats:
    """Realised composition of a whole mixture (``K`` sources).

    Attributes
    ----------
    num_samples : int
        Samples in the mixture.
    period : int
        Length of the source-assignment cycle (with a schedule: that of its weights at position
        0, quantized).
    weights : numpy.ndarray, float64, shape (K,)
        Effective weights (quantized to ``quotas / period``; with a schedule, at position 0).
    requested_weights : numpy.ndarray, float64, shape (K,)
        The weights as given, normalized.
    counts : numpy.ndarray, int64, shape (K,)
        Samples drawn from each source over the whole mixture.
    proportions : numpy.ndarray, float64, shape (K,)
        ``counts / num_samples`` (zeros for an empty mixture).
    max_prefix_error : float
        The largest ``|count_k(n) - n q_k|`` over every prefix ``n <= num_samples`` and source
        ``k`` (exact: the sequence is periodic, so one period covers every prefix).  With a
        schedule: against the schedule's integral, over the first 4096 positions of each
        schedule change (:meth:`SchedulePlan.max_prefix_error
        <mmpack._src.sampling.schedule_plan.SchedulePlan.max_prefix_error>`).
    error_bound : float
        ``1 - 1 / (2 K' - 2)`` for ``K'`` sources of positive weight (0 for one); with a
        schedule, the plan's bound over every prefix (:mod:`mmpack._src.sampling.schedule_plan`).
    epochs : numpy.ndarray, float64, shape (K,)
        Expected passes over each source, ``counts / len``.
    repeats : numpy.ndarray, int64, shape (K,)
        Completed passes over each source (``Mixture.repeats()``).
    """

    num_samples: int
    period: int
    weights: np.ndarray
    requested_weights: np.ndarray
    counts: np.ndarray
    proportions: np.ndarray
    max_prefix_error: float
    error_bound: float
    epochs: np.ndarray
    repeats: np.ndarray

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (the arrays themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def of(cls, mixture: Any, requested: np.ndarray, worst: float, bound: float) -> MixtureStats:
        """The stats of ``mixture`` (a :class:`~mmpack.Mixture`) given its
        requested weights and its prefix error and bound."""
        n = len(mixture)
        counts = mixture.counts()
        lengths = np.array([len(s) for s in mixture.sources], dtype=np.int64)
        return cls(
            num_samples=n,
            period=mixture.period,
            weights=mixture.weights,
            requested_weights=requested,
            counts=counts,
            proportions=counts / n if n else np.zeros(counts.size),
            max_prefix_error=worst,
            error_bound=bound,
            epochs=counts / np.maximum(lengths, 1),
            repeats=mixture.repeats(),
        )


def period_error(quotas: np.ndarray, period: int, seq: np.ndarray, n: int) -> tuple[float, float]:
    """``(max_prefix_error, error_bound)`` of a constant mixture of ``n`` samples (in samples)."""
    limit = min(n, period)
    got = max_prefix_error(quotas, period, seq, limit) if limit else 0
    k_pos = int((quotas > 0).sum())
    return int(got) / period, 1.0 - 1.0 / (2 * k_pos - 2) if k_pos > 1 else 0.0
