"""The sources of a :class:`~mmpack.Mixture`: checked once, read once per batch,
their batches combined.

At construction every source must be random-access (:func:`source_length`) and the non-empty
ones must agree on the keys and shapes of their sample 0 (:func:`check_compatible_sources`; the
length of ``cu_seqlens`` varies from sample to sample and is not compared; a difference of
dtypes is a warning): one sample read per source.  A batch of positions, once located, is read
with one ``__getitems__`` call per source drawn (:func:`read_sources`), and when every source
answers with a :class:`~mmpack.store.SampleBatch` the parts are scattered into one batch
with a ``source`` column (:func:`scatter_batches`): O(rows * row width) copies, no Python work
per sample; the batch's provenance, when asked, is its sources' merged
(:func:`~mmpack._src.views.provenance.merged_provenance`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from mmpack._src.core.validation import EpochIndex
from mmpack._src.views.batch import SampleBatch
from mmpack._src.views.provenance import merged_provenance

__all__ = [
    "check_compatible_sources",
    "common_seqlen",
    "read_sources",
    "scatter_batches",
    "source_length",
]


def check_compatible_sources(sources: tuple[Any, ...], lengths: np.ndarray) -> None:
    """Raise ``ValueError`` unless the non-empty sources' samples 0 agree on keys and shapes;
    warn when their dtypes differ (the warning points at the caller's caller)."""
    ref_k, ref = None, None
    for k, source in enumerate(sources):
        if lengths[k] == 0:
            continue
        sig = _signature(source[0], k)
        if ref is None:
            ref_k, ref = k, sig
            continue
        shapes = {key: s for key, (s, _) in sig.items()}
        ref_shapes = {key: s for key, (s, _) in ref.items()}
        if shapes != ref_shapes:
            raise ValueError(
                f"sources {ref_k} and {k} have incompatible samples: source {ref_k} sample 0 has "
                f"keys/shapes {ref_shapes}, source {k} sample 0 has {shapes}"
            )
        dtypes = {key: str(d) for key, (_, d) in sig.items()}
        ref_dtypes = {key: str(d) for key, (_, d) in ref.items()}
        if dtypes != ref_dtypes:
            warnings.warn(
                f"sources {ref_k} and {k} return different dtypes ({ref_dtypes} vs {dtypes}); "
                "collating a batch will promote them",
                stacklevel=3,
            )


def common_seqlen(sources: Sequence[Any]) -> int | None:
    """The ``seqlen`` (tokens per sample) every source has, as an int; None unless all have the
    same positive int ``seqlen``."""
    each = [getattr(source, "seqlen", None) for source in sources]
    ints = [int(v) for v in each if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    if len(ints) == len(each) and len(set(ints)) == 1 and ints[0] > 0:
        return ints[0]
    return None


def read_sources(
    sources: Sequence[Any], src: np.ndarray, items: np.ndarray, epochs: Any
) -> list[tuple[int, np.ndarray, Any]]:
    """``(k, where, got)`` per source ``k`` drawn: the batch positions ``where`` it serves and
    what its ``__getitems__`` (once per batch) or ``__getitem__`` returned for its ``items``.
    ``epochs`` (None, one epoch, or one per position) goes on to the source as
    :class:`~mmpack.store.EpochIndex` items."""
    parts = []
    for k in np.unique(src).tolist():
        where = np.flatnonzero(src == k)
        source = sources[k]
        wanted = items[where].tolist()
        if isinstance(epochs, list):  # the epoch of each index goes on to its source
            wanted = [
                j if epochs[t] is None else EpochIndex(j, epochs[t])
                for j, t in zip(wanted, where.tolist())
            ]
        elif epochs is not None:
            wanted = [EpochIndex(j, epochs) for j in wanted]
        if hasattr(source, "__getitems__"):
            got = source.__getitems__(wanted)
        else:
            got = [source[j] for j in wanted]
        parts.append((k, where, got))
    return parts


def scatter_batches(
    parts: list[tuple[int, np.ndarray, SampleBatch]], n: int, src: np.ndarray
) -> SampleBatch:
    """One ``SampleBatch`` of ``n`` rows from per-source batches (rows ``where`` of each)."""
    first = parts[0][2]
    columns: dict[str, np.ndarray] = {}
    for name, col in first.columns.items():
        columns[name] = np.empty((n, *col.shape[1:]), dtype=col.dtype)
    width = max(got.cu_seqlens.shape[1] for _, _, got in parts)
    cu = np.zeros((n, width), dtype=np.int32)
    num_cuts = np.empty(n, dtype=np.int64)
    for _, where, got in parts:
        for name, col in got.columns.items():
            columns[name][where] = col
        cu[where, : got.cu_seqlens.shape[1]] = got.cu_seqlens
        num_cuts[where] = got.num_cuts
    columns["source"] = src.astype(np.int64)
    provenance = None
    if all(got.provenance_of is not None for _, _, got in parts):
        sources = [(k, where, got.provenance_pieces) for k, where, got in parts]
        provenance = partial(merged_provenance, sources, n)
    promised = tuple(k for k in first.from_first if all(k in g.from_first for _, _, g in parts))
    return SampleBatch(columns, cu, num_cuts, provenance, promised)


def source_length(source: Any, k: int) -> int:
    """``len(source)``; ``TypeError`` naming source ``k`` unless it is random-access."""
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            f"source {k} is a {type(source).__name__}, not a random-access dataset "
            "(it needs __len__ and __getitem__, like WindowDataset or PackedDataset)"
        )
    return len(source)


_VARIABLE_LENGTH = frozenset({"cu_seqlens"})
"""Keys whose length varies from sample to sample (one boundary per document in the sample):
only their number of dimensions is compared."""


def _signature(sample: Any, k: int) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
    """Key -> (fixed shape, dtype) of a sample; a variable-length key's dimensions are None."""
    if not isinstance(sample, dict):
        raise TypeError(
            f"source {k} returned a {type(sample).__name__} for sample 0; sources must return dicts"
        )
    sig = {}
    for key, v in sample.items():
        if key == "source":
            continue
        shape: tuple[int | None, ...] = np.shape(v)
        if key in _VARIABLE_LENGTH:
            shape = (None,) * len(shape)
        sig[key] = (shape, np.asarray(v).dtype)
    return sig
