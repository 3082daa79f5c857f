"""What the streaming packer counts: per part while it runs, and one frozen record for the reader.

Each part of :class:`~mmpack.StreamingPacker` keeps the counts of what it does
(:class:`AdmissionCounts`: the sequences read and what the ``long_docs`` policy did to them;
:class:`EmissionCounts`: the batches, rows, pieces and tokens emitted), reset at every epoch.
:meth:`StreamingPacker.stats` joins them into one :class:`StreamingStats`, a frozen dataclass
named like :class:`mmpack._src.packing.plan_stats.PackingStats` where the concepts agree (``n_docs``,
``n_pieces``, ``n_tokens``, ``padding_tokens``, ``efficiency``, ``n_split``...).  O(1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["AdmissionCounts", "COUNTER_FIELDS", "EmissionCounts", "StreamingStats"]


@dataclass
class AdmissionCounts:
    """What admission counted this epoch (owned and updated by
    :class:`~mmpack._src.streaming.admission.Admission` only)."""

    n_docs: int = 0
    """Source sequences admitted as pieces (read ahead of the batches included)."""
    n_empty: int = 0
    """Empty source sequences ignored."""
    n_split: int = 0
    """Sequences longer than a row cut into pieces (``long_docs="split"``)."""
    n_truncated: int = 0
    """Sequences longer than a row cut to one row (``long_docs="truncate"``)."""
    n_dropped: int = 0
    """Sequences longer than a row left out (``long_docs="drop"``)."""
    lost_tokens: int = 0
    """Tokens cut by ``"truncate"`` or left out by ``"drop"``."""


@dataclass
class EmissionCounts:
    """What the batch writer emitted this epoch (owned and updated by
    :class:`~mmpack._src.streaming.placement.Placement` only)."""

    n_batches: int = 0
    n_rows: int = 0
    """Rows of the emitted batches (each ``seqlen`` token slots)."""
    n_pieces: int = 0
    """Pieces placed in emitted batches (a split sequence counts once per piece)."""
    n_tokens: int = 0
    """Real tokens in emitted batches."""


COUNTER_FIELDS = tuple(
    f.name for cls in (AdmissionCounts, EmissionCounts) for f in dataclasses.fields(cls)
)
"""The names of every counter, as a state records them."""


@dataclass(frozen=True)
class StreamingStats:
    """What a :class:`~mmpack.StreamingPacker` did in its current (or last)
    epoch.  ``efficiency`` is ``n_tokens / (n_rows * seqlen)``, ``nan`` before the first batch;
    ``padding_tokens`` the token slots of the emitted rows that hold padding; ``n_held`` the
    pieces held now (deferred by the last batch plus read ahead); ``token_count`` the real tokens
    emitted across every epoch (what the schedules follow)."""

    seqlen: int
    epoch: int
    n_docs: int
    n_batches: int
    n_rows: int
    n_pieces: int
    n_tokens: int
    padding_tokens: int
    efficiency: float
    n_empty: int
    n_split: int
    n_truncated: int
    n_dropped: int
    lost_tokens: int
    n_held: int
    token_count: int

    @classmethod
    def of(
        cls,
        admission: AdmissionCounts,
        emission: EmissionCounts,
        *,
        seqlen: int,
        epoch: int,
        n_held: int,
        token_count: int,
    ) -> StreamingStats:
        """The record of the counts of both parts."""
        slots = emission.n_rows * seqlen
        return cls(
            **dataclasses.asdict(admission),
            **dataclasses.asdict(emission),
            seqlen=seqlen,
            epoch=epoch,
            padding_tokens=slots - emission.n_tokens,
            efficiency=emission.n_tokens / slots if slots else math.nan,
            n_held=n_held,
            token_count=token_count,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
