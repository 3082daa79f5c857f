"""Mixture weights that change along the run: :class:`Schedule`, a piecewise-constant or
piecewise-linear function of the mixture position (samples) or of the tokens consumed.

A schedule is a list of points ``(start, weights)``, starts strictly increasing from 0; each
weight vector is normalized.  ``interpolate="constant"`` holds a point's weights until the next
point; ``"linear"`` interpolates the normalized weights between two points and holds the last
point's weights after it.  How a :class:`~mmpack.Mixture` draws a
schedule, with its prefix bound against the schedule's exact integral and its cost, is
:mod:`mmpack._src.sampling.schedule_plan`; :meth:`Schedule.segments` gives it the stretches on which
every weight is linear.

``unit="tokens"``: starts are tokens consumed; the mixture converts the weights to samples with its
sources' tokens per sample (:mod:`mmpack._src.sampling.schedule_plan`).  Cost: O(points) for
everything here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack._src.core.validation import check_weights
from mmpack._src.sampling.weights import normalize_weights

__all__ = ["Schedule"]

_INTERPOLATE = ("constant", "linear")
_UNITS = ("samples", "tokens")


def _check_start(x: Any, i: int, previous: int | None) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"points[{i}] start must be an int, got {type(x).__name__} {x!r}")
    x = int(x)
    if previous is None and x != 0:
        raise ValueError(f"the first point must start at 0, got points[0] start {x}")
    if previous is not None and x <= previous:
        raise ValueError(
            f"starts must be strictly increasing, got points[{i}] start {x} after {previous}"
        )
    if x > 2**62:
        raise ValueError(f"points[{i}] start must be at most 2**62, got {x}")
    return x


class Schedule:
    """Mixture weights as a function of the position.

    Parameters
    ----------
    points : sequence of (int, sequence of float)
        ``(start, weights)`` pairs: starts strictly increasing from 0, weight vectors of one
        length ``K``, each finite, non-negative and not all zero.
    interpolate : {"constant", "linear"}, default "constant"
    unit : {"samples", "tokens"}, default "samples"
        What a start counts: mixture positions, or tokens consumed (see the module docstring).

    Raises
    ------
    TypeError, ValueError
        A point, a start or a weight that breaks the rules above, named.
    """

    def __init__(
        self,
        points: Sequence[tuple[int, Sequence[float]]],
        *,
        interpolate: str = "constant",
        unit: str = "samples",
    ) -> None:
        if interpolate not in _INTERPOLATE:
            raise ValueError(f"interpolate must be one of {_INTERPOLATE}, got {interpolate!r}")
        if unit not in _UNITS:
            raise ValueError(f"unit must be one of {_UNITS}, got {unit!r}")
        if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
            raise TypeError(
                f"points must be a non-empty sequence of (start, weights), got {points!r}"
            )
        starts: list[int] = []
        weights: list[np.ndarray] = []
        for i, point in enumerate(points):
            if not isinstance(point, (tuple, list)) or len(point) != 2:
                raise TypeError(f"points[{i}] must be a (start, weights) pair, got {point!r}")
            starts.append(_check_start(point[0], i, starts[-1] if starts else None))
            weights.append(check_weights(point[1], f"points[{i}] weights"))
            if weights[-1].size != weights[0].size:
                raise ValueError(
                    f"points[{i}] has {weights[-1].size} weights, points[0] has {weights[0].size}"
                )
        self._starts = tuple(starts)
        self._weights = tuple(normalize_weights(w) for w in weights)
        self._raw = tuple(tuple(float(v) for v in w) for w in weights)
        self.interpolate = interpolate
        self.unit = unit

    @property
    def num_sources(self) -> int:
        return int(self._weights[0].size)

    @property
    def starts(self) -> tuple[int, ...]:
        return self._starts

    def spec(self) -> tuple[Any, ...]:
        """Everything that defines the schedule, as plain values (for equality and digests)."""
        return (self.interpolate, self.unit, tuple(zip(self._starts, self._raw)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and other.spec() == self.spec()

    def __hash__(self) -> int:
        return hash(self.spec())

    def __repr__(self) -> str:
        pts = ", ".join(f"({s}, {list(w)})" for s, w in zip(self._starts, self._raw))
        return f"Schedule([{pts}], interpolate={self.interpolate!r}, unit={self.unit!r})"

    def weights_at(self, x: int) -> np.ndarray:
        """The normalized weights the schedule gives at position ``x >= 0``; float64, (K,)."""
        j = int(np.searchsorted(self._starts, x, side="right")) - 1
        w = self._weights[j]
        if self.interpolate == "linear" and j + 1 < len(self._starts):
            lo, hi = self._starts[j], self._starts[j + 1]
            w = w + (self._weights[j + 1] - w) * ((x - lo) / (hi - lo))
        return w

    def is_constant(self) -> bool:
        """Whether every position gets the same weights."""
        return all(np.array_equal(w, self._weights[0]) for w in self._weights)

    def segments(self, x0: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The schedule from ``x0 >= 0`` on, as stretches on which every weight is linear.

        Returns
        -------
        starts : list of int
            ``x0``, then the points after it; the last stretch has no end.
        weights : numpy.ndarray, float64, shape (n, K)
            Normalized weights at each start.
        slopes : numpy.ndarray, float64, shape (n, K)
            Change of each weight per unit of ``x`` on each stretch (0 for ``"constant"`` and
            for the last stretch).
        """
        first = int(np.searchsorted(self._starts, x0, side="right")) - 1
        starts = [x0, *self._starts[first + 1 :]]
        weights = np.stack([self.weights_at(x) for x in starts])
        slopes = np.zeros_like(weights)
        if self.interpolate == "linear":
            for j in range(len(starts) - 1):
                lo, hi = self._starts[first + j], self._starts[first + j + 1]
                slopes[j] = (self._weights[first + j + 1] - self._weights[first + j]) / (hi - lo)
        return starts, weights, slopes
