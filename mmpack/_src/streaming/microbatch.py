"""Packed batches to per-row micro-batches, and the counts a trainer logs about them.

A packed batch (from :class:`~mmpack.StreamingPacker`) already holds one
micro-batch's worth of tokens per row, so :func:`split_packed_batch` returns one micro-batch per
row (as ModernBERT's ``split_packed_batch`` does).  A row whose padding fraction exceeds
``padding_tolerance`` is trimmed to its last real token and the padding segment is dropped from
its ``cu_seqlens``, which saves the attention and MLP work on that padding at the price of a
dynamic shape.  :func:`split_rows` is the same split over arrays of any kind with numpy's
indexing (:func:`mmpack._src.torch.microbatch.split_packed_batch` splits torch tensors with it).

:func:`num_label_tokens` counts the tokens that take a loss (ModernBERT's
``get_num_tokens_in_packed_batch``); :func:`num_sequences` counts sequences from ``cu_seqlens``
(``get_num_samples_in_packed_batch``), without the padding segments ModernBERT's packer also
counts unless ``count_padding=True``; both read any array with numpy's operators.

Cost: O(rows) Python calls plus one pass over each row's attention mask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mmpack._src.core.constants import IGNORE_INDEX

__all__ = ["num_label_tokens", "num_sequences", "split_packed_batch", "split_rows"]


def _count_nonzero(x: Any) -> int:
    return int((x != 0).sum())


def split_packed_batch(
    batch: Mapping[str, Any], padding_tolerance: float = 1.0
) -> list[dict[str, Any]]:
    """One micro-batch per row of a packed batch of numpy arrays.

    Parameters
    ----------
    batch : mapping
        ``input_ids``, ``attention_mask`` and ``targets`` (the labels, or ``None``) of shape
        ``(rows, seqlen)``, ``cu_seqlens`` (one int32 array per row), ``max_seqlen`` (one int
        per row), optionally ``mask_prob``.
    padding_tolerance : float
        A row whose padding fraction (padding tokens / row length) is *greater* than this is
        trimmed after its last real token; the default 1.0 never trims.  In ``[0, 1]``.

    Returns
    -------
    list of dict
        Per row: ``input_ids``, ``targets``, ``attention_mask`` of shape ``(n,)`` (``n`` =
        ``seqlen``, or the real tokens of a trimmed row; views of the batch), ``cu_seqlens``
        (ending at ``n``), ``max_seqlen`` (recomputed for a trimmed row), and a copy of
        ``mask_prob`` if present.
    """
    return [micro for micro, _ in split_rows(batch, padding_tolerance, np.copy)]


def split_rows(
    batch: Mapping[str, Any], padding_tolerance: float, copy: Callable[[Any], Any]
) -> list[tuple[dict[str, Any], bool]]:
    """:func:`split_packed_batch` over arrays of any kind with numpy's indexing and operators:
    per row, the micro-batch and whether it was trimmed; ``copy(mask_prob)`` gives each
    micro-batch its own ``mask_prob``."""
    if not 0.0 <= padding_tolerance <= 1.0:
        raise ValueError(f"padding_tolerance must be in [0, 1], got {padding_tolerance!r}")
    for key in ("input_ids", "attention_mask", "cu_seqlens", "max_seqlen"):
        if key not in batch:
            raise KeyError(f"a packed batch needs {key!r}; got keys {sorted(batch)}")
    ids, attention, labels = batch["input_ids"], batch["attention_mask"], batch.get("targets")
    n_rows, row_len = ids.shape
    if len(batch["cu_seqlens"]) != n_rows or len(batch["max_seqlen"]) != n_rows:
        raise ValueError(
            f"cu_seqlens and max_seqlen need one entry per row ({n_rows}), got "
            f"{len(batch['cu_seqlens'])} and {len(batch['max_seqlen'])}"
        )
    out = []
    for r in range(n_rows):
        mask = attention[r]
        cu = batch["cu_seqlens"][r]
        real = _count_nonzero(mask)
        trimmed = 1.0 - real / row_len > padding_tolerance
        # Pieces fill each row from column 0, so a trimmed row's real tokens are [0, real).
        n = real if trimmed else row_len
        if trimmed:
            cu = cu[:-1]
            longest = int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0
        else:
            longest = int(batch["max_seqlen"][r])
        micro: dict[str, Any] = {
            "input_ids": ids[r, :n],
            "targets": None if labels is None else labels[r, :n],
            "attention_mask": mask[:n],
            "cu_seqlens": cu,
            "max_seqlen": longest,
        }
        if "mask_prob" in batch:
            micro["mask_prob"] = copy(batch["mask_prob"])
        out.append((micro, trimmed))
    return out


def num_label_tokens(batch: Mapping[str, Any], ignore_index: int = IGNORE_INDEX) -> int:
    """Number of label positions that are not ``ignore_index`` (tokens that take a loss).

    ``batch["targets"]`` (the labels: a packer's, or a ``collate`` batch's) is an array/tensor or
    a list of them (e.g. split micro-batches' targets).
    """
    labels = batch.get("targets") if isinstance(batch, Mapping) else None
    if labels is None:
        raise TypeError("the batch has no targets (a packer with mode=None); nothing to count")
    if isinstance(labels, (list, tuple)):
        return sum(int((x != ignore_index).sum()) for x in labels)
    if hasattr(labels, "shape"):
        return int((labels != ignore_index).sum())
    raise TypeError(
        f"targets must be an array, a tensor or a list of them, got {type(labels).__name__}"
    )


def num_sequences(batch: Mapping[str, Any], *, count_padding: bool = False) -> int:
    """Number of sequences (pieces) in a packed batch or micro-batch, from ``cu_seqlens``.

    Parameters
    ----------
    batch : mapping
        ``cu_seqlens`` is one array (a micro-batch) or a list of arrays (one per row); unless
        ``count_padding``, ``attention_mask`` (same rows) tells which rows end with padding.
    count_padding : bool
        Count each row's padding segment as a sequence too, as ModernBERT's packer does.
    """
    cu = batch["cu_seqlens"]
    rows = list(cu) if isinstance(cu, (list, tuple)) else [cu]
    total = sum(len(x) - 1 for x in rows)
    if count_padding:
        return total
    if "attention_mask" not in batch:
        raise KeyError(
            "num_sequences needs 'attention_mask' to tell padding segments apart "
            "(or pass count_padding=True)"
        )
    mask = batch["attention_mask"]
    masks = [mask] if mask.ndim == 1 else [mask[r] for r in range(mask.shape[0])]
    if len(masks) != len(rows):
        raise ValueError(f"{len(rows)} cu_seqlens for {len(masks)} attention-mask rows")
    for c, m in zip(rows, masks):
        if len(c) > 1 and int(c[-1]) > _count_nonzero(m):
            total -= 1
    return total
