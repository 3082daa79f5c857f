"""Feed a packed mmpack batch to a Hugging Face transformers model without cross-document attention.

A transformers model given only ``input_ids`` of a packed row attends across the documents of
the row (and restarts no position).  :func:`hf_inputs` turns a batch of
:func:`mmpack.torch.collate` into the keyword arguments that make the packed forward
equal to one forward per document, for the model's attention implementation:
``flash_attention_*`` gets the batch flattened to one row ``(1, B * seqlen)`` with the varlen
boundaries ``cu_seq_lens_q/k`` and ``max_length_q/k`` (no ``attention_mask``, which would switch
it to un-padding); ``sdpa`` a 4-D boolean block-diagonal (causal within a document)
``attention_mask`` ``(B, 1, seqlen, seqlen)``; ``eager`` the same mask, additive
(``finfo(mask_dtype).min`` where not allowed); ``flex_attention`` a FlexAttention ``BlockMask``
(:func:`mmpack.torch.flex_document_mask`).  Every form carries ``position_ids``
restarting at each document.  Labels: mmpack's causal views shift them already, so they pass as
``shift_labels`` (and ``labels``, which turns the loss on); ``label_shift="hf"`` views and masked
LMs pass them as ``labels``.  Padding is a segment of its own with labels ``-100``.  Caveat: a
model with sliding-window layers gets the same mask in every layer (no window).

:class:`DataCollator` is ``transformers.Trainer``'s ``data_collator``: the same inputs without a
dense mask where it runs; the mask is made where the model runs: by transformers itself for
causal LMs (``create_causal_mask`` finds the documents where ``position_ids`` restart; the batch
carries ``use_cache=False`` so that detection runs, and the rows' positions are checked to
restart at their ``cu_seqlens``), by a forward pre-hook installed on a masked LM (it pops
``cu_seqlens_rows`` and passes hf_inputs' mask, built on the device of ``input_ids``).  Cost:
dense masks ``B * seqlen**2``; the flash form free (views); a BlockMask ``O(B * (seqlen/128)**2)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack._src.torch.attention import batched_block_causal_mask, flex_document_mask
from mmpack._src.torch.boundaries import flat_boundaries, position_boundaries
from mmpack._src.torch.collate import TARGETS, Collator

__all__ = ["ATTN_IMPLEMENTATIONS", "DataCollator", "hf_inputs"]

ATTN_IMPLEMENTATIONS: tuple[str, ...] = (
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
    "sdpa",
)
"""The ``attn_implementation`` names :func:`hf_inputs` accepts (those of transformers)."""

_LABEL_SHIFTS = ("next", "hf")
_ROWS = "cu_seqlens_rows"


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
        A batch of :func:`mmpack.torch.collate`: ``input_ids`` and ``position_ids``
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
    flash = _check_names(attn_implementation, label_shift)
    needed = ["input_ids", "position_ids", "cu_seqlens_rows"] + (
        ["cu_seqlens", "max_seqlen"] if flash else []
    )
    if "labels" in batch and TARGETS not in batch:
        raise ValueError(
            f"batch has 'labels' but no {TARGETS!r}: hf_inputs takes a batch of "
            f"mmpack.torch.collate, which carries the samples' labels as {TARGETS!r}"
        )
    missing = [key for key in needed if key not in batch]
    if missing:
        raise ValueError(
            f"batch lacks {missing}, needed for attn_implementation={attn_implementation!r}; "
            "build it with mmpack.torch.collate(samples, varlen=True)"
        )
    return flash


def _check_names(attn_implementation: str, label_shift: str) -> bool:
    """Refuse an unknown implementation or label shift; whether it is a flash implementation."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={attn_implementation!r} is not supported; choose one of {ATTN_IMPLEMENTATIONS}"
        )
    if label_shift not in _LABEL_SHIFTS:
        raise ValueError(
            f"label_shift={label_shift!r} is not supported; choose one of {_LABEL_SHIFTS}"
        )
    return attn_implementation.startswith("flash_attention")


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
    # A context-parallel batch's tokens lie at the padded boundaries (mmpack._src.torch.cp_batch).
    cu = batch["cu_seqlens_padded"] if "cu_seqlens_padded" in batch else batch["cu_seqlens"]
    cu = torch.as_tensor(cu).to(device=device, dtype=torch.int32)
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


_CP_KEYS = ("cu_seqlens", "cu_seqlens_padded", "loss_mask", "cp_indices")


class DataCollator:
    """The ``data_collator`` of ``transformers.Trainer`` for mmpack's views (see the module doc).

    ``model(**collator(samples))`` gives the loss ``model(**hf_inputs(collate(samples), ...))``
    gives, the per-document loss; the batch holds no dense mask (it is built on the model's
    device in the process that runs the model), so it is cheap to make in a DataLoader worker.

    Parameters
    ----------
    attn_implementation : str
        The model's ``config._attn_implementation``: one of :data:`ATTN_IMPLEMENTATIONS`.
    causal : bool, default True
        Causal LM, or masked LM (``causal=False``, e.g. BERT): then ``model`` is needed, except
        for the flash implementations.
    label_shift : {"next", "hf"}, default "next"
        As for :func:`hf_inputs`.
    model : torch.nn.Module, optional
        The model the batches feed.  Checked against ``attn_implementation``; for a masked LM
        (non-flash) the collator installs on it the forward pre-hook that turns the batch's
        ``cu_seqlens_rows`` into hf_inputs' ``attention_mask`` (in the model's dtype, on the
        device of ``input_ids``).  The collator keeps no reference to it.
    pad_to_multiple_of, pad_id, ignore_index
        As for :class:`mmpack.torch.Collator`.
    cp_size, cp_rank, pad_cu_seqlens
        As for :func:`mmpack.torch.collate`, with a flash ``attn_implementation`` only:
        the flat form of the context-parallel batch, ``cu_seq_lens_q/k`` its padded boundaries
        (what attention over the padded tokens takes), plus ``cu_seqlens``,
        ``cu_seqlens_padded``, ``loss_mask`` and ``cp_indices`` (``cp_rank=None``) as
        collate gives them.  A rank's share (``cp_rank``) needs a model whose attention runs
        context parallelism itself (ring attention over the group, e.g. TransformerEngine's);
        transformers' own flash attention sees only the share.

    Returns (``__call__``)
    ----------------------
    dict
        ``input_ids``, ``position_ids`` (int64, (B, seqlen)), ``labels`` (and ``shift_labels``
        for causal ``label_shift="next"``), plus: causal, non-flash: ``use_cache=False``; masked
        LM, non-flash: ``cu_seqlens_rows`` (tuple of B int32 tensors); flash: hf_inputs' flat
        form ((1, B * seqlen) tensors, ``cu_seq_lens_q/k``, ``max_length_q/k``).

    Raises
    ------
    ValueError
        Unknown ``attn_implementation`` or ``label_shift``; a masked LM without ``model``; a
        model whose implementation is another; context-parallel options or
        ``pad_cu_seqlens`` with an implementation that is not flash; (``__call__``) a causal batch whose positions do
        not restart exactly at its rows' ``cu_seqlens`` (transformers would see other documents).
    """

    def __init__(
        self,
        attn_implementation: str,
        *,
        causal: bool = True,
        label_shift: str = "next",
        model: torch.nn.Module | None = None,
        pad_to_multiple_of: int | None = None,
        pad_id: int = 0,
        ignore_index: int = IGNORE_INDEX,
        cp_size: int | None = None,
        cp_rank: int | None = None,
        pad_cu_seqlens: bool = False,
    ) -> None:
        self._flash = _check_names(attn_implementation, label_shift)
        self.attn_implementation = attn_implementation
        self.causal = bool(causal)
        self.label_shift = label_shift
        if not self._flash and (cp_size is not None or cp_rank is not None or pad_cu_seqlens):
            raise ValueError(
                f"cp_size={cp_size!r}, cp_rank={cp_rank!r} and pad_cu_seqlens={pad_cu_seqlens!r} "
                f"lay out varlen boundaries: they need a flash attn_implementation, not "
                f"{attn_implementation!r}"
            )
        self._collator = Collator(
            pad_to_multiple_of=pad_to_multiple_of,
            pad_id=pad_id,
            ignore_index=ignore_index,
            cp_size=cp_size,
            cp_rank=cp_rank,
            pad_cu_seqlens=pad_cu_seqlens,
        )
        if model is not None:
            _check_model(model, attn_implementation)
        if not self.causal and not self._flash:
            if model is None:
                raise ValueError(
                    f"DataCollator({attn_implementation!r}, causal=False) needs model=: a masked "
                    "LM's block-diagonal mask is built on the model's device by a hook the "
                    "collator installs on it (transformers' encoder masks ignore positions)"
                )
            model.register_forward_pre_hook(_EncoderMask(attn_implementation), with_kwargs=True)

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = self._collator(samples)
        if self._flash:
            out = hf_inputs(
                batch, self.attn_implementation, causal=self.causal, label_shift=self.label_shift
            )
            if "cu_seqlens_padded" in batch:  # a context-parallel batch's boundaries and masks
                out.update((key, batch[key]) for key in _CP_KEYS if key in batch)
            return out
        input_ids = batch["input_ids"]
        out = _token_inputs(
            batch,
            input_ids,
            causal=self.causal,
            label_shift=self.label_shift,
            device=input_ids.device,
        )
        if self.causal:
            _check_restarts(batch)
            out["use_cache"] = False  # else an empty cache turns transformers' detection off
        else:
            out[_ROWS] = batch[_ROWS]
        return out

    def __repr__(self) -> str:
        return (
            f"DataCollator({self.attn_implementation!r}, causal={self.causal}, "
            f"label_shift={self.label_shift!r})"
        )


def _check_model(model: torch.nn.Module, attn_implementation: str) -> None:
    """Refuse a model whose (known) attention implementation is not ``attn_implementation``."""
    config = getattr(model, "config", None)
    theirs = getattr(config, "_attn_implementation", None)
    if theirs in ATTN_IMPLEMENTATIONS and theirs != attn_implementation:
        raise ValueError(
            f"the model runs attn_implementation={theirs!r} but the collator was made for "
            f"{attn_implementation!r}; give DataCollator(model.config._attn_implementation, ...)"
        )


def _check_restarts(batch: Mapping[str, Any]) -> None:
    """Refuse a batch whose documents, read from restarting positions as transformers reads
    them, are not its ``cu_seqlens`` segments (``O(B * seqlen)``)."""
    positions = batch["position_ids"].numpy()
    seqlen = positions.shape[1]
    read = flat_boundaries(*position_boundaries(positions), seqlen)
    given = batch["cu_seqlens"].numpy()
    if read.shape != given.shape or not np.array_equal(read, given):
        row = int(np.setxor1d(read, given)[0]) // seqlen
        raise ValueError(
            f"row {row} of the batch has position_ids that do not restart exactly at its "
            f"cu_seqlens {batch[_ROWS][row].tolist()}; transformers finds a causal LM's "
            "documents where positions restart, so give samples whose positions restart at "
            "every document (as mmpack's views number them)"
        )


class _EncoderMask:
    """Forward pre-hook: the batch's ``cu_seqlens_rows`` become hf_inputs' bidirectional mask,
    built on the device of ``input_ids`` in the model's dtype (eager's additive mask)."""

    def __init__(self, attn_implementation: str) -> None:
        self.attn_implementation = attn_implementation

    def __call__(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        rows = kwargs.pop(_ROWS, None)
        if rows is None:
            return None  # not a DataCollator batch
        input_ids = kwargs.get("input_ids")
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
            raise ValueError(
                f"a DataCollator batch with {_ROWS!r} needs its (B, seqlen) 'input_ids' tensor "
                "to build the mask from; got a call without it"
            )
        dtype = getattr(module, "dtype", torch.float32)
        kwargs["attention_mask"] = _attention_mask(
            rows, input_ids.shape[1], self.attn_implementation, False, dtype, input_ids.device
        )
        return args, kwargs
