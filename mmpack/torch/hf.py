"""Feed a packed mmpack batch to a Hugging Face transformers model without cross-document attention.

A transformers model given only ``input_ids`` of a packed row attends across the documents of the
row (and restarts no position), so its loss is not the loss of the documents: on a tiny Llama the
issue measured 8.3291 against 8.3302 per document.  :func:`hf_inputs` turns a batch of
:func:`mmpack.torch.collate.collate` into the keyword arguments that make the packed forward equal
to one forward per document, for the attention implementation the model runs:

=====================  ======================================================================
``attn_implementation``  what it gets
=====================  ======================================================================
``flash_attention_*``  the batch flattened to one row ``(1, B * seqlen)``, ``position_ids``
                       restarting at every segment, and the varlen boundaries
                       ``cu_seq_lens_q/k`` (the batch ``cu_seqlens``) and ``max_length_q/k``.
                       transformers (5.x ``modeling_flash_attention_utils``) runs
                       ``flash_varlen_fn`` on them directly; without them it would infer the
                       same boundaries from ``position_ids`` (``_is_packed_sequence``: batch of
                       one row whose positions are not one increasing run) at a device sync per
                       layer.  No ``attention_mask``: a 2-D mask would switch it to un-padding.
``sdpa``               a 4-D boolean ``attention_mask`` ``(B, 1, seqlen, seqlen)``, True where a
                       query may attend (block-diagonal, causal within a document for a causal
                       LM); transformers passes a 4-D mask through unchanged.
``eager``              the same mask, additive: ``0`` where allowed, ``finfo(mask_dtype).min``
                       elsewhere (eager attention adds the mask to the scores).
``flex_attention``     a FlexAttention ``BlockMask`` (:func:`mmpack.torch.attention.flex_document_mask`).
=====================  ======================================================================

Every form also carries ``position_ids`` restarting at each document (rotary and absolute position
embeddings then see each document from position 0).  Labels: the batch carries the samples'
labels as ``targets`` (so that the batch itself never gives a transformers model a loss: see
:mod:`mmpack.torch.collate`).  mmpack's causal views shift labels already (``label_shift="next"``:
``labels[t]`` is token ``t + 1``, ``-100`` at each document's end); transformers' causal-LM loss
shifts ``labels`` again, unless ``shift_labels`` is given, so the helper passes them as
``shift_labels`` (and as ``labels``, which turns the loss on).  With ``label_shift="hf"`` views,
or for a masked LM (``causal=False``), they pass as ``labels``.
Padding is a segment of its own (attends to itself, labels ``-100``): it changes no real token.

Caveat: a model that mixes attention kinds per layer (ModernBERT's sliding-window layers) gets the
same 4-D mask in every layer, i.e. no window: fine while documents are shorter than the window.

Cost: the dense masks are ``B * seqlen**2`` bools (bytes) or floats; the flash form is free (views
of the batch tensors); the BlockMask is ``O(B * (seqlen / 128)**2)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmpack.torch.attention import batched_block_causal_mask, flex_document_mask
from mmpack.torch.collate import TARGETS

__all__ = ["ATTN_IMPLEMENTATIONS", "hf_inputs"]

ATTN_IMPLEMENTATIONS: tuple[str, ...] = (
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
    "sdpa",
)
"""The ``attn_implementation`` names :func:`hf_inputs` accepts (those of transformers)."""

_LABEL_SHIFTS = ("next", "hf")


def hf_inputs(
    batch: Mapping[str, Any],
    attn_implementation: str,
    *,
    causal: bool = True,
    label_shift: str = "next",
    mask_dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` of a transformers causal-LM or masked-LM model.

    Parameters
    ----------
    batch : mapping
        A batch of :func:`mmpack.torch.collate.collate`: ``input_ids`` and ``position_ids``
        (int, shape (B, seqlen)), ``cu_seqlens_rows`` (B row boundaries), and for the flash
        forms the batch-wide ``cu_seqlens`` (int32) and ``max_seqlen`` (``collate(varlen=True)``,
        the default); ``targets`` (B, seqlen), the samples' labels, become the model's labels
        when present.
    attn_implementation : str
        The model's ``config._attn_implementation``: one of :data:`ATTN_IMPLEMENTATIONS`.
    causal : bool, default True
        Causal LM (block-causal masks) or masked LM (block-diagonal, bidirectional masks).
    label_shift : {"next", "hf"}, default "next"
        How the batch's causal labels are aligned (the views' ``label_shift``); ignored when
        ``causal=False``.
    mask_dtype : torch.dtype, default torch.float32
        Dtype of the additive mask for ``eager`` (the model's compute dtype).
    device : torch.device or str, optional
        Where the tensors go (default: where ``input_ids`` is).

    Returns
    -------
    dict
        ``input_ids``, ``position_ids`` (int64) and, when the batch has ``targets``, ``labels``
        (and ``shift_labels`` for ``label_shift="next"`` causal batches), plus per
        implementation: ``attention_mask`` (sdpa: bool (B, 1, seqlen, seqlen); eager:
        ``mask_dtype``, same shape;
        flex_attention: BlockMask) or, for flash, everything flattened to shape
        (1, B * seqlen) with ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int32) and ``max_length_q``,
        ``max_length_k`` (int).

    Raises
    ------
    ValueError
        Unknown ``attn_implementation`` or ``label_shift``, a batch lacking a needed key, or
        one with ``labels`` instead of ``targets`` (not a collate batch).
    """
    flash = _check_request(batch, attn_implementation, label_shift)
    input_ids = torch.as_tensor(batch["input_ids"])
    if input_ids.ndim != 2:
        raise ValueError(
            f"batch['input_ids'] must have shape (B, seqlen), got {tuple(input_ids.shape)}"
        )
    device = input_ids.device if device is None else torch.device(device)
    out = _token_inputs(batch, input_ids, causal=causal, label_shift=label_shift, device=device)
    if flash:
        return _flash_inputs(out, batch, device)
    seqlen = input_ids.shape[1]
    out["attention_mask"] = _attention_mask(
        batch["cu_seqlens_rows"], seqlen, attn_implementation, causal, mask_dtype, device
    )
    return out


def _check_request(batch: Mapping[str, Any], attn_implementation: str, label_shift: str) -> bool:
    """Refuse an unknown implementation or label shift, or a batch lacking what the
    implementation needs; whether it is a flash (varlen) implementation."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={attn_implementation!r} is not supported; choose one of {ATTN_IMPLEMENTATIONS}"
        )
    if label_shift not in _LABEL_SHIFTS:
        raise ValueError(
            f"label_shift={label_shift!r} is not supported; choose one of {_LABEL_SHIFTS}"
        )
    flash = attn_implementation.startswith("flash_attention")
    needed = ["input_ids", "position_ids", "cu_seqlens_rows"] + (
        ["cu_seqlens", "max_seqlen"] if flash else []
    )
    if "labels" in batch and TARGETS not in batch:
        raise ValueError(
            f"batch has 'labels' but no {TARGETS!r}: hf_inputs takes a batch of "
            f"mmpack.torch.collate.collate, which carries the samples' labels as {TARGETS!r}"
        )
    missing = [key for key in needed if key not in batch]
    if missing:
        raise ValueError(
            f"batch lacks {missing}, needed for attn_implementation={attn_implementation!r}; "
            "build it with mmpack.torch.collate.collate(samples, varlen=True)"
        )
    return flash


def _token_inputs(
    batch: Mapping[str, Any],
    input_ids: torch.Tensor,
    *,
    causal: bool,
    label_shift: str,
    device: torch.device,
) -> dict[str, Any]:
    """``input_ids``, ``position_ids`` (int64) and the labels on ``device``: ``labels`` and, for
    labels already shifted to the next token, ``shift_labels`` (so the loss does not shift)."""
    out: dict[str, Any] = {
        "input_ids": input_ids.to(device),
        "position_ids": torch.as_tensor(batch["position_ids"]).to(device=device, dtype=torch.int64),
    }
    if batch.get(TARGETS) is not None:
        labels = torch.as_tensor(batch[TARGETS]).to(device=device, dtype=torch.int64)
        out["labels"] = labels
        if causal and label_shift == "next":
            out["shift_labels"] = labels  # already aligned: the loss must not shift again
    return out


def _flash_inputs(
    out: dict[str, Any], batch: Mapping[str, Any], device: torch.device
) -> dict[str, Any]:
    """The flash form: every per-token input flattened to ``(1, B * seqlen)`` plus the varlen
    boundaries ``cu_seq_lens_q/k`` (int32) and ``max_length_q/k``."""
    tokens = out["input_ids"].numel()  # B * seqlen
    for key in ("input_ids", "position_ids", "labels", "shift_labels"):
        if key in out:
            out[key] = out[key].reshape(1, tokens)
    cu = torch.as_tensor(batch["cu_seqlens"]).to(device=device, dtype=torch.int32)
    max_len = int(batch["max_seqlen"])
    out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len)
    return out


def _attention_mask(
    rows: Any,
    seqlen: int,
    attn_implementation: str,
    causal: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> Any:
    """The ``attention_mask`` of a non-flash implementation: a BlockMask (flex_attention), a
    boolean (sdpa) or an additive ``dtype`` (eager) mask of shape ``(B, 1, seqlen, seqlen)``."""
    if attn_implementation == "flex_attention":
        return flex_document_mask(rows, seqlen, causal=causal, device=device)
    allowed = batched_block_causal_mask(rows, seqlen, causal=causal, device=device)
    if attn_implementation == "sdpa":
        return allowed
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)  # eager: additive
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
