"""What a mixture realises: :class:`MixtureStats`, the return of ``Mixture.stats()``.

A frozen dataclass, like :class:`mmpack.views.plan.PackingStats` (the return of
``PackedDataset.stats()``), so the two ``stats()`` of the library have one shape: attributes, and
``as_dict()`` for a plain dict.  ``Mixture.stats()`` returned a dict before; reading it as one
(``stats["counts"]``, ``stats.keys()``, ``stats.items()``, ``stats.values()``, ``stats.get()``,
``"counts" in stats``, ``dict(stats)``) still works for one release, with a
``DeprecationWarning`` naming the attribute to use instead.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import ItemsView, KeysView, ValuesView
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

    # ---------------------------------------------- the dict interface, deprecated (one release)
    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        _deprecated(f"stats[{key!r}]", f"stats.{key}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        _deprecated("`key in stats`", "the attributes (or stats.as_dict())")
        return key in self._names()

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: read the attribute (``stats.counts``) or ``stats.as_dict().get(key)``."""
        _deprecated("stats.get(key)", "the attributes (or stats.as_dict().get(key))")
        return getattr(self, key) if key in self._names() else default

    def keys(self) -> KeysView[str]:
        """Deprecated: ``stats.as_dict().keys()``."""
        _deprecated("stats.keys()", "stats.as_dict().keys()")
        return self.as_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        """Deprecated: ``stats.as_dict().items()``."""
        _deprecated("stats.items()", "stats.as_dict().items()")
        return self.as_dict().items()

    def values(self) -> ValuesView[Any]:
        """Deprecated: ``stats.as_dict().values()``."""
        _deprecated("stats.values()", "stats.as_dict().values()")
        return self.as_dict().values()

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"Mixture.stats() returns a MixtureStats dataclass now; {old} reads it as the dict it "
        f"was and stops working in the next release: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )
