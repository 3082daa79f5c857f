"""What a mixture realises: :class:`MixtureStats`, the return of ``Mixture.stats()``.

A frozen dataclass, like :class:`mmpack.views.plan_stats.PackingStats` (``PackedDataset.stats()``) and
:class:`mmpack.views.window_stats.WindowStats` (``WindowDataset.stats()``), so every ``stats()``
of the library has one shape: attributes, and ``as_dict()`` for a plain dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MixtureStats"]


@dataclass(frozen=True, eq=False)
class MixtureStats:
    """Realised composition of a whole mixture (``K`` sources).

    Attributes
    ----------
    num_samples : int
        Samples in the mixture.
    period : int
        Length of the source-assignment cycle.
    weights : numpy.ndarray, float64, shape (K,)
        Effective weights (quantized to ``quotas / period``).
    requested_weights : numpy.ndarray, float64, shape (K,)
        The weights as given, normalized.
    counts : numpy.ndarray, int64, shape (K,)
        Samples drawn from each source over the whole mixture.
    proportions : numpy.ndarray, float64, shape (K,)
        ``counts / num_samples`` (zeros for an empty mixture).
    max_prefix_error : float
        The largest ``|count_k(n) - n q_k|`` over every prefix ``n <= num_samples`` and source
        ``k`` (exact: the sequence is periodic, so one period covers every prefix).
    error_bound : float
        ``1 - 1 / (2 K' - 2)`` for ``K'`` sources of positive weight (0 for one).
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
