"""What a :class:`~mmpack.Mixture`'s ``weights`` become: quotas of a period
(a weight vector, or a schedule of constant weights), or the plan of a schedule
(:mod:`mmpack._src.sampling.schedule_plan`); a schedule change from a position on; the digest of a
source for :attr:`Mixture.fingerprint <mmpack.Mixture.fingerprint>`.

A ``unit="tokens"`` schedule is converted to samples with each source's ``seqlen`` (tokens per
sample; see :mod:`mmpack._src.sampling.schedule_plan`).  Cost: O(segments * K).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack._src.core.fingerprints import config_fingerprint
from mmpack._src.sampling.mixture_blocks import BlockPasses
from mmpack._src.sampling.mixture_items import SourcePasses
from mmpack._src.sampling.schedule import Schedule
from mmpack._src.sampling.schedule_plan import ChairmanPrefix, SchedulePlan, build_regime
from mmpack._src.sampling.weights import quantize_weights

__all__ = [
    "changed_mixture",
    "mixture_fingerprint",
    "resolve_weights",
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


def _check_sources(schedule: Schedule, sources: Sequence[Any]) -> np.ndarray | None:
    """The sources' tokens per sample for a ``unit="tokens"`` schedule (else None)."""
    if schedule.num_sources != len(sources):
        raise ValueError(
            f"the schedule has {schedule.num_sources} weights but there are {len(sources)} sources"
        )
    return tokens_per_sample(sources) if schedule.unit == "tokens" else None


def resolve_weights(
    weights: Any, sources: Sequence[Any]
) -> tuple[np.ndarray, int, SchedulePlan | None]:
    """``(quotas, period, plan)`` of a mixture's ``weights``: the plan is None for a weight vector
    and for a schedule of constant weights (drawn as that weight vector, in samples); otherwise
    quotas and period are the quantized weights at position 0."""
    if not isinstance(weights, Schedule):
        quotas, period = quantize_weights(weights)
        if quotas.size != len(sources):
            raise ValueError(
                f"weights has {quotas.size} entries but there are {len(sources)} sources"
            )
        return quotas, period, None
    per = _check_sources(weights, sources)
    if weights.is_constant():
        w = weights.weights_at(0)
        quotas, period = quantize_weights(w if per is None else w / per)
        return quotas, period, None
    zero = np.zeros(len(sources), np.int64)
    plan = SchedulePlan([build_regime(weights, 0, 0, zero, per)])
    quotas, period = quantize_weights(plan.weights_at(0))
    return quotas, period, plan


def _changed_plan(mixture: Any, schedule: Schedule, p: int) -> SchedulePlan:
    """The regimes of ``mixture`` before position ``p``, then ``schedule`` from ``p`` on, entered
    with the counts at ``p`` (on its axis: ``p``, or the tokens those counts hold)."""
    per = _check_sources(schedule, mixture.sources)
    counts = mixture.counts(p)
    x0 = p if per is None else int((counts * per).sum())
    regime = build_regime(schedule, p, x0, counts, per)
    old = mixture._plan
    if p == 0:
        return SchedulePlan([regime])
    if old is None:
        prefix = ChairmanPrefix(mixture.quotas, mixture.period, p)
        return SchedulePlan([regime], prefix)
    if p <= old.split_start:
        assert old.prefix is not None
        prefix = ChairmanPrefix(old.prefix.quotas, old.prefix.period, p)
        return SchedulePlan([regime], prefix)
    return SchedulePlan([*old.truncated(p), regime], old.prefix)


def _source_digest(source: Any, length: int) -> tuple[Any, ...]:
    """What identifies a source's samples: its own ``fingerprint`` (every mmpack view has one),
    else its type, length, ``seqlen`` and store fingerprint."""
    own = getattr(source, "fingerprint", None)
    if isinstance(own, str):
        return (type(source).__qualname__, length, own)
    store = getattr(source, "store", None)
    return (
        type(source).__qualname__,
        length,
        getattr(source, "seqlen", None),
        getattr(store, "fingerprint", None),
    )


def changed_mixture(mixture: Any, schedule: Schedule, p: int, num_samples: int | None) -> Any:
    """``mixture.with_schedule(schedule, from_position=p, num_samples=num_samples)``: a copy of
    the mixture whose plan is :func:`_changed_plan` (a mixture of one source keeps its constant
    weights: a schedule changes none of its positions, only its history)."""
    out = copy.copy(mixture)
    if len(mixture.sources) == 1:  # every position is the one source's, whatever the weights
        _check_sources(schedule, mixture.sources)
    else:
        out._plan = _changed_plan(mixture, schedule, p)
        out._quotas, out._period = quantize_weights(out._plan.weights_at(0))
    out._history = (*mixture._history, (p, schedule.spec()))
    # Samples before p are the mixture's, and before min(p, q) those of each it was changed from.
    earlier = [(f, min(q, p)) for f, q in mixture.earlier_fingerprints]
    out._earlier = (*earlier, (mixture.fingerprint, p))
    out._passes = SourcePasses(mixture._lengths, mixture.seed)
    if mixture._blocks is not None:
        drawn = (out._quotas > 0 if out._plan is None else out._plan.positive).astype(np.int64)
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
    :class:`~mmpack.Mixture` holds (see its ``fingerprint``)."""
    sources = [_source_digest(s, int(n)) for s, n in zip(mixture.sources, mixture._lengths)]
    block_bytes = None if mixture._blocks is None else mixture._blocks.block_bytes
    return config_fingerprint(
        "Mixture", sources, mixture.schedule, mixture.seed, len(mixture), block_bytes
    )
