"""Attention masks for packed rows: each document attends only within itself.

A packed row of ``seqlen`` tokens holds several documents, delimited by its ``cu_seqlens``
(``0, end of segment 0, ..., seqlen``; the last segment may be padding): a query at ``q`` may see
a key at ``kv`` only when both lie in the same segment (and, when causal, ``q >= kv``).  Worked
example, ``cu_seqlens = [0, 2, 5]``, causal (1 = may attend)::

    document_ids = [0, 0, 1, 1, 1]        block_causal_mask =  1 . . . .
                                                               1 1 . . .
                                                               . . 1 . .
                                                               . . 1 1 .
                                                               . . 1 1 1

Three forms of the same mask: :func:`block_causal_mask` / :func:`batched_block_causal_mask`,
dense boolean masks (True = may attend, SDPA's ``attn_mask``; ``O(seqlen**2)`` memory per row);
:func:`flex_document_mask`, a FlexAttention ``BlockMask`` from :func:`document_mask_mod`
(``O(seqlen**2 / 128**2)`` memory, the kernel skipping blocks no query may see); and
FlashAttention's varlen form, which needs no mask (the batch-wide ``cu_seqlens`` of
:func:`mmpack.torch.collate`).  A padding segment attends among itself; the diagonal is
always True, so no row is empty and SDPA never produces NaN.

Cost: :func:`document_ids` is one ``repeat_interleave`` (``O(seqlen)``); a dense mask is one
broadcast comparison (``O(seqlen**2)``), on the ``device`` given (default: ``cu_seqlens``'s).
The boundaries are checked by :mod:`mmpack._src.torch.boundaries` (the rule ``collate`` applies).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mmpack._src.torch.boundaries import check_row, check_rows, is_one_row

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

__all__ = [
    "batched_block_causal_mask",
    "batched_document_ids",
    "block_causal_mask",
    "document_ids",
    "document_mask_mod",
    "flex_document_mask",
]


def document_ids(
    cu_seqlens: torch.Tensor | np.ndarray | Sequence[int],
    seqlen: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Segment index of every position of one row.

    Parameters
    ----------
    cu_seqlens : torch.Tensor, numpy.ndarray or sequence of int, shape (n + 1,)
        Non-decreasing boundaries from 0 to ``seqlen`` (repeated values, i.e. empty segments,
        are allowed).
    seqlen : int
        Row length.
    device : torch.device or str, optional
        Device of the result; default: that of ``cu_seqlens`` if it is a tensor, else CPU.

    Returns
    -------
    torch.Tensor, int64, shape (seqlen,)
        ``ids[p] = i`` where ``cu_seqlens[i] <= p < cu_seqlens[i + 1]``.
    """
    cu = check_row(cu_seqlens, seqlen, "cu_seqlens", device)
    lengths = cu[1:] - cu[:-1]
    segments = torch.arange(lengths.shape[0], device=cu.device)
    return torch.repeat_interleave(segments, lengths, output_size=seqlen)


def batched_document_ids(
    cu_seqlens_rows: Sequence[torch.Tensor | np.ndarray | Sequence[int]] | torch.Tensor,
    seqlen: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """:func:`document_ids` of every row of a batch.

    Parameters
    ----------
    cu_seqlens_rows : sequence of B 1-D boundaries, or torch.Tensor of shape (B, n + 1)
        Each row's boundaries (e.g. ``batch["cu_seqlens_rows"]`` from
        :func:`mmpack.torch.collate`); rows may hold different numbers of segments.
    seqlen : int
        Row length.
    device : torch.device or str, optional
        Device of the result (default: that of the first row if a tensor, else CPU).

    Returns
    -------
    torch.Tensor, int64, shape (B, seqlen)
    """
    flat, row_start = check_rows(cu_seqlens_rows, seqlen, device)
    n_rows = row_start.shape[0]
    # One repeat_interleave over the whole batch: segment k of the concatenated boundaries,
    # minus the index where its row starts, is its index within the row.
    lengths = flat[1:] - flat[:-1]
    lengths[row_start[1:] - 1] = 0  # the step from one row's end to the next row's 0
    segment = torch.arange(lengths.shape[0], device=flat.device)
    ids = torch.repeat_interleave(segment, lengths, output_size=n_rows * seqlen)
    ids = ids.view(n_rows, seqlen)
    return ids - row_start.view(-1, 1)


def block_causal_mask(
    cu_seqlens: torch.Tensor | np.ndarray | Sequence[int],
    seqlen: int,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Dense attention mask of one packed row: same segment and, when causal, ``q >= kv``.

    Parameters
    ----------
    cu_seqlens : torch.Tensor, numpy.ndarray or sequence of int, shape (n + 1,)
        The row's boundaries, as for :func:`document_ids`.
    seqlen : int
        Row length.
    causal : bool
        Lower-triangular within each segment (decoder); False gives the block-diagonal mask of
        bidirectional attention within each document (encoder, e.g. MLM).
    device : torch.device or str, optional
        As for :func:`document_ids`.

    Returns
    -------
    torch.Tensor, bool, shape (seqlen, seqlen)
        ``mask[q, kv]`` is True where query ``q`` may attend to key ``kv`` (SDPA's boolean
        ``attn_mask`` convention).  The diagonal is always True.
    """
    ids = document_ids(cu_seqlens, seqlen, device=device)
    return _mask_from_ids(ids, causal)


def batched_block_causal_mask(
    cu_seqlens_rows: Sequence[torch.Tensor | np.ndarray | Sequence[int]] | torch.Tensor,
    seqlen: int,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """:func:`block_causal_mask` of every row, shaped to broadcast over attention heads.

    Parameters
    ----------
    cu_seqlens_rows : sequence of B 1-D boundaries, or torch.Tensor of shape (B, n + 1)
        As for :func:`batched_document_ids`.
    seqlen : int
        Row length.
    causal : bool
        As for :func:`block_causal_mask`.
    device : torch.device or str, optional
        As for :func:`batched_document_ids`.

    Returns
    -------
    torch.Tensor, bool, shape (B, 1, seqlen, seqlen)
        Pass as ``attn_mask`` to ``scaled_dot_product_attention`` with ``q, k, v`` of shape
        ``(B, heads, seqlen, head_dim)``.
    """
    ids = batched_document_ids(cu_seqlens_rows, seqlen, device=device)
    return _mask_from_ids(ids, causal).unsqueeze(1)


def document_mask_mod(
    doc_ids: torch.Tensor, *, causal: bool = True
) -> Callable[[Any, Any, Any, Any], Any]:
    """FlexAttention ``mask_mod`` of packed documents.

    Parameters
    ----------
    doc_ids : torch.Tensor, integer, shape (B, seqlen)
        Segment index per position (:func:`batched_document_ids`), on the device attention runs
        on.  With ``B = 1`` the one row serves every batch index (the mask broadcasts).
    causal : bool
        Also require ``q_idx >= kv_idx``.

    Returns
    -------
    callable
        ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``: True where ``doc_ids[b, q_idx] ==
        doc_ids[b, kv_idx]`` (and ``q_idx >= kv_idx`` when causal).  Combine it with others
        through ``torch.nn.attention.flex_attention.and_masks`` (e.g. a sliding window).
    """
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.ndim != 2:
        raise ValueError(
            "doc_ids must be a 2-D (B, seqlen) tensor of segment indices, got "
            f"{type(doc_ids).__name__} with shape {getattr(doc_ids, 'shape', None)}"
        )
    if doc_ids.shape[0] == 1:
        row = doc_ids[0]  # one row broadcasts: the batch index is never used

        def same_document(b, q_idx, kv_idx):
            return row[q_idx] == row[kv_idx]

    else:

        def same_document(b, q_idx, kv_idx):
            return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    if causal:

        def mask_mod(b, h, q_idx, kv_idx):
            return same_document(b, q_idx, kv_idx) & (q_idx >= kv_idx)

    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return same_document(b, q_idx, kv_idx)

    return mask_mod


def flex_document_mask(
    cu_seqlens_rows: Sequence[torch.Tensor | np.ndarray | Sequence[int]] | torch.Tensor,
    seqlen: int,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
    block_size: int = 128,
) -> BlockMask:
    """FlexAttention ``BlockMask`` of a packed batch (documents attend only within themselves).

    Parameters
    ----------
    cu_seqlens_rows : sequence of B 1-D boundaries, torch.Tensor of shape (B, n + 1), or one
        1-D row
        Each row's boundaries (``batch["cu_seqlens_rows"]``).  A single 1-D row gives a mask with
        ``B = 1`` that broadcasts over any batch size.
    seqlen : int
        Row length (query and key length).
    causal : bool
        As for :func:`block_causal_mask`.
    device : torch.device or str, optional
        Where the mask is built and used (default: that of the first row if a tensor, else
        CPU).  Build it on the device attention runs on.
    block_size : int
        FlexAttention's sparse block size.

    Returns
    -------
    torch.nn.attention.flex_attention.BlockMask
        Shape ``(B, 1, seqlen, seqlen)``, heads broadcast; for
        ``flex_attention(q, k, v, block_mask=...)`` with ``q, k, v`` of shape
        ``(B, heads, seqlen, head_dim)``.  Its ``mask_mod`` is :func:`document_mask_mod` over
        the document ids padded with ``-1`` to a multiple of ``lcm(block_size, 128)``, so that
        kernels which evaluate it on whole blocks past ``seqlen`` never index out of bounds.

    Raises
    ------
    ImportError
        This torch has no ``torch.nn.attention.flex_attention`` (it arrived in torch 2.5).
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as exc:
        raise ImportError(
            f"flex_document_mask needs torch.nn.attention.flex_attention (torch >= 2.5); this "
            f"torch is {torch.__version__}. Use batched_block_causal_mask with "
            "scaled_dot_product_attention, or the varlen cu_seqlens, instead"
        ) from exc
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, (int, np.integer))
        or (block_size < 1)
    ):
        raise ValueError(f"block_size={block_size!r} is not accepted; give a positive int")
    if is_one_row(cu_seqlens_rows):
        cu_seqlens_rows = [cu_seqlens_rows]  # type: ignore[list-item]
    ids = batched_document_ids(cu_seqlens_rows, seqlen, device=device)
    # Kernels evaluate mask_mod on whole blocks, so a row whose length is no multiple of the
    # block size is read past its end (pytorch#137801); pad the ids so such reads stay in
    # bounds.  -1 is no segment: padded positions match only each other, and flex_attention
    # masks out positions >= seqlen itself.
    unit = math.lcm(int(block_size), 128)
    padded = -(-seqlen // unit) * unit
    ids = torch.nn.functional.pad(ids, (0, padded - seqlen), value=-1)
    mask_mod = document_mask_mod(ids, causal=causal)
    return create_block_mask(
        mask_mod,
        ids.shape[0],
        None,
        seqlen,
        seqlen,
        device=ids.device,
        BLOCK_SIZE=int(block_size),
    )


def _mask_from_ids(ids: torch.Tensor, causal: bool) -> torch.Tensor:
    """``(..., S)`` segment ids -> ``(..., S, S)`` bool mask."""
    mask = ids.unsqueeze(-1) == ids.unsqueeze(-2)
    if causal:
        n = ids.shape[-1]
        mask &= torch.ones(n, n, dtype=torch.bool, device=ids.device).tril_()
    return mask
