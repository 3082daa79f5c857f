"""Packed batches of torch tensors to per-row micro-batches (ModernBERT's ``split_packed_batch``).

The split of :func:`mmpack._src.streaming.microbatch.split_rows` (one micro-batch per row, a row
whose padding fraction exceeds ``padding_tolerance`` trimmed after its last real token, its
padding segment dropped from ``cu_seqlens``) over a batch of torch tensors, e.g. from
``DataLoader(packer, batch_size=None)`` or :func:`mmpack._src.torch.streaming.as_tensors`; each
trimmed micro-batch's ``cu_seqlens`` can be marked dynamic for ``torch.compile``, as
ModernBERT's packer does.  The token counts (:func:`~mmpack._src.streaming.microbatch.num_label_tokens`,
:func:`~mmpack._src.streaming.microbatch.num_sequences`) read tensors as they read numpy arrays.
Cost: O(rows) Python calls plus one pass over each row's attention mask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmpack._src.streaming.microbatch import split_rows

__all__ = ["split_packed_batch"]


def split_packed_batch(
    batch: Mapping[str, Any], padding_tolerance: float = 1.0, *, mark_dynamic: bool = False
) -> list[dict[str, Any]]:
    """One micro-batch per row of a packed batch of torch tensors.

    Parameters
    ----------
    batch : mapping
        ``input_ids``, ``attention_mask`` and ``targets`` (or ``None``) tensors of shape
        ``(rows, seqlen)``, ``cu_seqlens`` (one int32 tensor per row), ``max_seqlen`` (one int
        per row), optionally ``mask_prob`` (a tensor).
    padding_tolerance : float
        A row whose padding fraction is *greater* than this is trimmed after its last real
        token; the default 1.0 never trims.  In ``[0, 1]``.
    mark_dynamic : bool
        Mark each trimmed micro-batch's ``cu_seqlens`` as dynamic (``torch._dynamo``).

    Returns
    -------
    list of dict
        Per row: ``input_ids``, ``targets``, ``attention_mask`` of shape ``(n,)`` (views of the
        batch), ``cu_seqlens`` (ending at ``n``), ``max_seqlen``, and a clone of ``mask_prob``.
    """
    out = []
    for micro, trimmed in split_rows(batch, padding_tolerance, torch.clone):
        if trimmed and mark_dynamic:
            torch._dynamo.mark_dynamic(micro["cu_seqlens"], 0)
        out.append(micro)
    return out
