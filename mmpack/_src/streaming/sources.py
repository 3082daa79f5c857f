"""What the streaming packer reads: source formats, and how sequences become pieces.

A source is an iterable of sequences, an iterable of incoming batches (lists of sequences, 2-D
arrays, or dicts whose ``input_ids`` is one of those, as in ModernBERT's packer), or a
random-access source of sequences (a :class:`mmpack.TokenStore`, read through ``read_ranges``; a
view, a list, a map-style dataset).  :func:`source_kind` tells them apart and
:func:`detect_format` tells sequences from batches by peeking at the nesting depth of the first
``PEEK`` elements.  Sequences are admitted as *pieces* of at most a row (:func:`piece_counts` and
:func:`pieces_of` apply the ``long_docs`` policy); how an incoming batch becomes tokens (the
build's token rule, one pass per incoming batch) is :mod:`mmpack._src.streaming.incoming`.  All of it
is O(1) per element, O(pieces) per admission.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from mmpack._src.core.options import SourceFormat
from mmpack._src.streaming.incoming import tokens_of

__all__ = [
    "PEEK",
    "batch_items",
    "detect_format",
    "piece_counts",
    "pieces_of",
    "propagate_epoch",
    "source_kind",
]

PEEK = 64
"""Elements of a source looked at to tell sequences from incoming batches."""


def _is_scalar(x: Any) -> bool:
    """A token-like scalar (an int, and also a float or bool, which are then refused as tokens
    with a clear message rather than taken for sequences)."""
    if isinstance(x, (int, float, np.number, np.bool_)):
        return True
    return getattr(x, "ndim", None) == 0


def _nesting(x: Any) -> int | None:
    """1 for a sequence of tokens, 2 for a batch of sequences, None when it cannot tell (empty)."""
    if isinstance(x, (str, bytes)):
        raise TypeError(f"the source yielded text ({type(x).__name__}); it must yield token ids")
    if isinstance(x, Mapping):
        if "input_ids" not in x:
            raise TypeError(
                f"the source yielded a mapping without 'input_ids' (keys {sorted(x)[:8]})"
            )
        return _nesting(x["input_ids"])
    ndim = getattr(x, "ndim", None)
    if ndim is not None and hasattr(x, "shape"):
        if ndim in (1, 2):
            return ndim
        raise TypeError(f"the source yielded a {ndim}-D array; expected 1-D (a sequence) or 2-D")
    if isinstance(x, (list, tuple)):
        if len(x) == 0:
            return None
        return 1 if _is_scalar(x[0]) else 2
    raise TypeError(
        f"the source yielded {type(x).__name__}; expected a sequence of token ids (list, numpy "
        "array, torch tensor, dict with 'input_ids') or a batch (list) of them"
    )


def detect_format(elements: Iterable[Any]) -> str:
    for x in elements:
        n = _nesting(x)
        if n is not None:
            return "sequences" if n == 1 else "batches"
    return "sequences"


def _is_indexable(source: Any) -> bool:
    if isinstance(source, (str, bytes, Mapping)):
        return False
    if any(c.__name__ == "IterableDataset" for c in type(source).__mro__):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def _is_store_like(source: Any) -> bool:
    offsets = getattr(source, "offsets", None)
    return (
        callable(getattr(source, "read_ranges", None))
        and isinstance(offsets, np.ndarray)
        and offsets.ndim == 1
        and offsets.shape[0] == len(source) + 1
    )


def batch_items(batch: Any) -> list[Any]:
    """The sequences of an incoming batch: a list, a 2-D array, or a dict whose ``input_ids``
    is one of those (with ``loss_mask``, one of those too: each sequence becomes a document
    ``{"input_ids", "loss_mask"}``)."""
    if isinstance(batch, Mapping):
        if "loss_mask" in batch:
            tokens, masks = batch_items(batch["input_ids"]), batch_items(batch["loss_mask"])
            if len(tokens) != len(masks):
                raise ValueError(
                    f"an incoming batch has {len(tokens)} sequences in 'input_ids' but "
                    f"{len(masks)} in 'loss_mask'; give one loss mask per sequence"
                )
            return [{"input_ids": t, "loss_mask": m} for t, m in zip(tokens, masks)]
        batch = tokens_of(batch)
    if getattr(batch, "ndim", None) == 2 or isinstance(batch, (list, tuple)):
        return list(batch)
    raise TypeError(
        f"an incoming batch must be a list of sequences, a 2-D array or a dict whose "
        f"'input_ids' is one of those; got {type(batch).__name__}"
    )


def piece_counts(lens: np.ndarray, head_off: int, row_len: int, policy: str) -> np.ndarray:
    """Pieces each document of lengths ``lens`` yields under ``policy`` (int64, same shape); the
    first document's pieces start at token ``head_off`` (its earlier pieces were admitted)."""
    if policy == "split":
        rest = lens.copy()
        if rest.size:
            rest[0] -= head_off
        return -(-rest // row_len)
    n_pieces = (lens > 0).astype(np.int64)
    if policy == "drop":
        n_pieces[lens > row_len] = 0
    return n_pieces


def pieces_of(
    lens: np.ndarray, head_off: int, n_pieces: np.ndarray, row_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``n_pieces[j]`` pieces of each document (those of the first from ``head_off``):
    (document index, offset in it, length), int64.  O(pieces), whatever the documents' lengths."""
    doc = np.repeat(np.arange(lens.shape[0], dtype=np.int64), n_pieces)
    first = np.cumsum(n_pieces) - n_pieces
    k = np.arange(doc.shape[0], dtype=np.int64) - first[doc]
    off = k * row_len
    if head_off:
        off[doc == 0] += head_off
    plen = np.minimum(lens[doc] - off, row_len)
    return doc, off, plen


def source_kind(source: Any, source_format: str, peek: int = PEEK) -> tuple[bool, bool]:
    """``(indexed, store_like)``: whether ``source`` is read by index as sequences (a
    random-access source, its format given or detected from its first elements), and whether it
    is read through ``read_ranges`` (a TokenStore-like source); ``peek`` elements at most are
    looked at to detect the format."""
    if source_format != SourceFormat.BATCHES and _is_indexable(source):
        fmt = source_format
        if fmt == SourceFormat.AUTO:
            seq = cast("Sequence[Any]", source)  # _is_indexable: __len__ and __getitem__
            fmt = detect_format(seq[j] for j in range(min(len(seq), peek)))
        indexed = fmt == SourceFormat.SEQUENCES
        return indexed, indexed and _is_store_like(source)
    if not isinstance(source, Iterable):
        raise TypeError(f"source must be iterable, got {type(source).__name__}")
    return False, False


def propagate_epoch(source: Any, epoch: int) -> None:
    """Tell the source, a DataLoader's sampler or batch sampler, which epoch starts."""
    seen: list[Any] = []
    candidates = [
        source,
        getattr(source, "sampler", None),
        getattr(source, "batch_sampler", None),
        getattr(getattr(source, "batch_sampler", None), "sampler", None),
    ]
    for obj in candidates:
        if obj is None or any(obj is s for s in seen):
            continue
        seen.append(obj)
        set_epoch = getattr(obj, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
