"""What a :class:`~mmpack.sampling.mixture.Mixture`'s ``weights`` become: quotas of a period
(a weight vector, or a schedule of one constant piece), or the runs of a schedule
(:mod:`mmpack.sampling.schedule_plan`); a schedule change from a position on; the digest of a
source for :attr:`Mixture.fingerprint <mmpack.sampling.mixture.Mixture.fingerprint>`.

A ``unit="tokens"`` schedule is converted to samples with each source's ``seqlen`` (tokens per
sample; see :mod:`mmpack.sampling.schedule`).  Cost: O(pieces * K) plus the plan's tables.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack.sampling.mixture_blocks import BlockPasses
from mmpack.sampling.mixture_items import SourcePasses
from mmpack.sampling.schedule import Schedule, token_pieces_to_samples
from mmpack.sampling.schedule_plan import SchedulePlan, plan_pieces
from mmpack.sampling.weights import quantize_weights

__all__ = [
    "changed_mixture",
    "changed_plan",
    "mixture_fingerprint",
    "resolve_weights",
    "source_digest",
]


def tokens_per_sample(sources: Sequence[Any]) -> np.ndarray:
    """Each source's ``seqlen`` (int64, (K,)); ``TypeError`` naming a source without one."""
    out = []
    for k, source in enumerate(sources):
        seqlen = getattr(source, "seqlen", None)
        if isinstance(seqlen, bool) or not isinstance(seqlen, (int, np.integer)) or seqlen < 1:
            raise TypeError(
                f'a unit="tokens" schedule needs sources with a positive int seqlen (tokens per '
                f"sample); source {k} ({type(source).__name__}) has seqlen={seqlen!r}"
            )
        out.append(int(seqlen))
    return np.array(out, dtype=np.int64)


def _sample_pieces(
    schedule: Schedule, sources: Sequence[Any], origin: tuple[int, int]
) -> tuple[list[int], np.ndarray]:
    """The schedule's pieces in samples, cut at ``origin = (sample, token)``."""
    if schedule.num_sources != len(sources):
        raise ValueError(
            f"the schedule has {schedule.num_sources} weights but there are {len(sources)} sources"
        )
    starts, weights = schedule.pieces()
    if schedule.unit == "tokens":
        return token_pieces_to_samples(starts, weights, tokens_per_sample(sources), origin)
    p = origin[0]
    first = max(int(np.searchsorted(starts, p, side="right")) - 1, 0)
    return [p, *starts[first + 1 :]], weights[first:]


def resolve_weights(
    weights: Any, sources: Sequence[Any]
) -> tuple[np.ndarray, int, SchedulePlan | None]:
    """``(quotas, period, plan)`` of a mixture's ``weights``: the plan is None for a weight vector
    and for a schedule of one constant piece; otherwise quotas and period are its first run's."""
    if not isinstance(weights, Schedule):
        quotas, period = quantize_weights(weights)
        if quotas.size != len(sources):
            raise ValueError(
                f"weights has {quotas.size} entries but there are {len(sources)} sources"
            )
        return quotas, period, None
    starts, rows = _sample_pieces(weights, sources, (0, 0))
    if len(starts) == 1:
        quotas, period = quantize_weights(rows[0])
        return quotas, period, None
    plan = SchedulePlan(plan_pieces(starts, rows))
    return plan.quotas[0].copy(), int(plan.periods[0]), plan


def changed_plan(mixture: Any, schedule: Schedule, p: int) -> SchedulePlan:
    """The runs of ``mixture`` before position ``p``, then those of ``schedule`` from ``p`` on."""
    counts = mixture.counts(p)
    token = 0
    if schedule.unit == "tokens":
        token = int((counts * tokens_per_sample(mixture.sources)).sum())
    starts, rows = _sample_pieces(schedule, mixture.sources, (p, token))
    if p == 0:
        return SchedulePlan(plan_pieces(starts, rows))
    old = mixture._plan
    if old is None:
        zero = np.zeros(len(mixture.sources))
        prefix = [(0, mixture.quotas, mixture.period, 0, zero, mixture.weights)]
    else:
        prefix = old.truncated(p)
    return SchedulePlan(plan_pieces(starts, rows, prefix, counts))


def source_digest(source: Any, length: int) -> tuple[Any, ...]:
    """What identifies a source's samples: its type, length, ``seqlen`` and store fingerprint."""
    store = getattr(source, "store", None)
    return (
        type(source).__qualname__,
        length,
        getattr(source, "seqlen", None),
        getattr(store, "fingerprint", None),
    )


def changed_mixture(mixture: Any, schedule: Schedule, p: int, num_samples: int | None) -> Any:
    """``mixture.with_schedule(schedule, from_position=p, num_samples=num_samples)``: a copy of
    the mixture whose plan is :func:`changed_plan`."""
    out = copy.copy(mixture)
    out._plan = changed_plan(mixture, schedule, p)
    out._quotas, out._period = out._plan.quotas[0].copy(), int(out._plan.periods[0])
    out._history = (*mixture._history, (p, schedule.spec()))
    out._passes = SourcePasses(mixture._lengths, mixture.seed)
    if mixture._blocks is not None:
        drawn = out._plan.positive.astype(np.int64)
        out._blocks = BlockPasses(
            mixture.sources, mixture._lengths, drawn, mixture._blocks.block_bytes, mixture.seed
        )
    if num_samples is None and mixture._explicit_length:
        num_samples = len(mixture)
    out._explicit_length = num_samples is not None
    out._num_samples = out._check_length(num_samples)
    return out


def mixture_fingerprint(mixture: Any) -> str:
    """Hex digest (32 characters) of what decides which sample each position of a
    :class:`~mmpack.sampling.mixture.Mixture` holds (see its ``fingerprint``)."""
    sources = [source_digest(s, int(n)) for s, n in zip(mixture.sources, mixture._lengths)]
    block_bytes = None if mixture._blocks is None else mixture._blocks.block_bytes
    parts = (sources, mixture.schedule, mixture.seed, len(mixture), block_bytes)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]
