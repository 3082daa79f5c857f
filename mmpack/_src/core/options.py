"""Every option that takes one of a few names, as a ``StrEnum``: one list of choices, one
docstring per choice, one error message for a wrong one (:func:`parse_option`).

Members compare equal to their strings (``Mode.MLM == "mlm"``), so plain strings keep working
everywhere an option is taken.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

__all__ = [
    "Backend",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_REGION_BINS",
    "LabelShift",
    "LongDocs",
    "MegatronSplit",
    "Mode",
    "PackingAlgorithm",
    "SourceFormat",
    "StrEnum",
    "parse_option",
]

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """``enum.StrEnum`` of Python 3.11."""

        def __str__(self) -> str:
            return str(self.value)


E = TypeVar("E", bound=StrEnum)


class LongDocs(StrEnum):
    """What happens to a document longer than a row (packed view, streaming packer)."""

    SPLIT = "split"
    """Cut into row-sized pieces, every token kept (the remainder is packed like any document)."""
    TRUNCATE = "truncate"
    """Keep the first row's worth of tokens; the rest is lost (and counted)."""
    DROP = "drop"
    """Leave the document out (counted)."""


class PackingAlgorithm(StrEnum):
    """How a packing plan places documents into bins."""

    BFD = "bfd"
    """Best-fit decreasing over the whole store, or over each region (fewest bins; the
    default)."""
    ONLINE = "online"
    """Best fit in store order over a window of ``lookahead`` open bins (keeps data order)."""
    NEXTFIT = "nextfit"
    """Online best fit with one open bin."""


DEFAULT_LOOKAHEAD = 1024
"""Open bins of ``PackingAlgorithm.ONLINE`` unless told otherwise."""

DEFAULT_REGION_BINS = 8192
"""Bins per region of a plan packed per region with ``region_tokens="auto"``: regions of
``DEFAULT_REGION_BINS * seqlen`` tokens, a region holding about 8192 samples whatever the row
length.  A region packed on its own fills ``ceil(slots / seqlen)`` bins at best; its edges are
moved to nearby document boundaries where that ceiling wastes about the room best fit needs for
the gaps it leaves, measured on a few regions packed alone (:mod:`mmpack._src.packing.region_cuts`):
a few hundred slots whatever the region's size, so a region costs a fraction of a bin more than
its share of the whole-store best fit and larger regions cost less a bin.  8192 bins keep every
corpus of ``python -m benchmarks regions`` within its 0.01% target (2048 did not: 0.021% for
longer documents at seqlen 2048), for four times the span of the store a region, hence a block
of the block order, reads; the figures are in ``docs/benchmarks.md`` (Plans per region)."""


class Mode(StrEnum):
    """The training objective a packed sample is prepared for."""

    CAUSAL = "causal"
    """Next-token labels that never cross a document boundary."""
    MLM = "mlm"
    """BERT-style 80/10/10 masking; labels hold the original tokens at selected positions."""


class LabelShift(StrEnum):
    """Where causal labels sit relative to their inputs."""

    NEXT = "next"
    """``labels[t] = input_ids[t + 1]`` (the model does not shift)."""
    HF = "hf"
    """``labels = input_ids`` (Hugging Face models shift inside)."""


class SourceFormat(StrEnum):
    """What the elements of a streaming packer's source are."""

    AUTO = "auto"
    """Told apart from the first non-empty element (a sequence starts with a scalar)."""
    SEQUENCES = "sequences"
    """Each element is one sequence of token ids."""
    BATCHES = "batches"
    """Each element is a batch of sequences."""


class Backend(StrEnum):
    """Where a local store's arrays live."""

    MEMMAP = "memmap"
    """Raw little-endian files, memory-mapped (the default)."""
    ZARR = "zarr"
    """A Zarr v3 group (compressed chunks)."""


class MegatronSplit(StrEnum):
    """Which of megatron-core's three dataset splits (its ``Split`` enum) an order reproduces."""

    TRAIN = "train"
    """The first part of the ``split`` string (``969`` of ``"969,30,1"``)."""
    VALID = "valid"
    """The second part; the only split that may keep a last, partial sample."""
    TEST = "test"
    """The third part."""


def parse_option(cls: type[E], value: Any, name: str) -> E:
    """``value`` (a member or its string) as a member of ``cls``; ``ValueError`` naming the
    argument, the value and the choices (sorted) otherwise."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    choices = tuple(sorted(m.value for m in cls))
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")
