"""A packing plan's statistics (:class:`PackingStats`): counts that add up over regions and the
ratios derived from them, so the statistics of a plan joined from parts are those of one plan
over all its regions (:func:`merge_stats`).  O(1) per plan or part.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mmpack._src.kernels.plan_items import (
    ST_DROPPED,
    ST_EMPTY,
    ST_LONG,
    ST_LOST_TOKENS,
    ST_SPLIT,
    ST_TOKENS,
    ST_TRUNCATED,
)

__all__ = ["COUNTED", "PackingStats", "merge_stats", "stats_of"]


@dataclass(frozen=True)
class PackingStats:
    """What a plan achieved.  Tokens count the eot tokens placed; ``lower_bound_bins`` is
    ``ceil(n_tokens / seqlen)``, the fewest bins any packing of the placed tokens could use
    (over all regions together); ``n_regions`` counts the regions packed (1 for the whole
    store, 0 without documents)."""

    seqlen: int
    n_docs: int
    n_bins: int
    n_pieces: int
    n_tokens: int
    padding_tokens: int
    efficiency: float
    lower_bound_bins: int
    excess_bins: float
    n_empty: int
    n_long: int
    n_split: int
    n_truncated: int
    n_dropped: int
    lost_tokens: int
    frac_long: float
    frac_split: float
    n_regions: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


COUNTED = {
    "n_tokens": ST_TOKENS,
    "n_empty": ST_EMPTY,
    "n_long": ST_LONG,
    "n_split": ST_SPLIT,
    "n_truncated": ST_TRUNCATED,
    "n_dropped": ST_DROPPED,
    "lost_tokens": ST_LOST_TOKENS,
}
"""The statistics that are counts of ``item_sizes``, and their slots."""

_SUMMED = ("n_docs", "n_bins", "n_pieces", *COUNTED, "n_regions")
"""The statistics that add up over regions; the others derive from them."""


def merge_stats(parts: list[PackingStats], seqlen: int) -> PackingStats:
    """The statistics of a plan joined from parts (consecutive regions): counts added, the
    ratios and the lower bound recomputed from the sums (equal to those of one plan built
    over all the regions)."""
    return stats_of({name: sum(getattr(s, name) for s in parts) for name in _SUMMED}, seqlen)


def stats_of(sums: dict[str, int], seqlen: int) -> PackingStats:
    """The statistics of a plan from its counts (:data:`_SUMMED`): the lower bound, padding,
    efficiency and fractions derived."""
    tokens, n_bins, n_docs = sums["n_tokens"], sums["n_bins"], sums["n_docs"]
    lower = -(-tokens // seqlen)
    return PackingStats(
        **{name: sums[name] for name in _SUMMED},
        seqlen=seqlen,
        padding_tokens=n_bins * seqlen - tokens,
        efficiency=tokens / (n_bins * seqlen) if n_bins else 1.0,
        lower_bound_bins=lower,
        excess_bins=n_bins / lower - 1.0 if lower else 0.0,
        frac_long=sums["n_long"] / n_docs if n_docs else 0.0,
        frac_split=sums["n_split"] / n_docs if n_docs else 0.0,
    )
