"""Stacking the fields of per-sample dicts into batch tensors, for :mod:`mmpack._src.torch.collate`.

:func:`stack_tokens` turns one per-token field (``input_ids``, ``labels``...: 1-D integer arrays
of one length) into a ``(B, seqlen)`` tensor with one ``np.stack`` into a fresh array and one
zero-copy ``torch.from_numpy``; the shapes are checked on the set of shapes first, so the common
case costs no Python loop over samples.  :func:`pad_tokens` right-pads such a tensor
(``position_ids`` continue counting from 0 in the pad, other fields take a fill value).
:func:`stack_extra` stacks any other field when its values are same-shape numbers, arrays or
tensors, and keeps the list of values otherwise.

Cost: one copy of the field's ``B * seqlen`` values (8 bytes each in int64, 4 in int32).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["pad_tokens", "stack_extra", "stack_tokens"]

_TORCH_NATIVE = tuple(np.dtype(d) for d in ("bool", "float16", "float32", "float64"))


def stack_tokens(
    samples: Sequence[Mapping[str, Any]],
    key: str,
    seqlen: int | None,
    dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, int]:
    """Stack one per-token field of every sample: one copy, one ``from_numpy``.

    Parameters
    ----------
    samples : sequence of B mappings
        Each holds ``key``: a 1-D integer array.
    key : str
        The field.
    seqlen : int or None
        The row length the batch has so far (None: take the first sample's).
    dtype : torch.int64 or torch.int32
        Dtype of the result.

    Returns
    -------
    tensor : torch.Tensor, ``dtype``, shape (B, seqlen)
    seqlen : int

    Raises
    ------
    TypeError
        A non-integer field.
    ValueError
        A field that is not 1-D, or whose length differs from the batch's.
    """
    arrays = [np.asarray(s[key]) for s in samples]
    dtypes = {a.dtype for a in arrays}
    shapes = {a.shape for a in arrays}
    if any(d.kind not in "iub" for d in dtypes):
        b = next(i for i, a in enumerate(arrays) if a.dtype.kind not in "iub")
        raise TypeError(
            f"samples[{b}][{key!r}] has dtype {arrays[b].dtype}; per-token fields must be integers"
        )
    if seqlen is None and len(shapes) == 1:
        shape = next(iter(shapes))
        seqlen = shape[0] if len(shape) == 1 else None
    if len(shapes) != 1 or shapes != {(seqlen,)}:
        for b, a in enumerate(arrays):
            if a.ndim != 1:
                raise ValueError(f"samples[{b}][{key!r}] has shape {a.shape}; expected (seqlen,)")
            if seqlen is None:
                seqlen = a.shape[0]
            if a.shape[0] != seqlen:
                raise ValueError(
                    f"samples[{b}][{key!r}] has length {a.shape[0]} but the batch's rows have "
                    f"length {seqlen}; every row of a batch must have the same seqlen"
                )
    stacked = np.stack(
        arrays, dtype=np.int64 if dtype == torch.int64 else np.int32, casting="unsafe"
    )
    assert seqlen is not None  # set from the rows above (np.stack refuses an empty batch)
    return torch.from_numpy(stacked), int(seqlen)


def pad_tokens(t: torch.Tensor, new_len: int, key: str, value: int) -> torch.Tensor:
    """``t`` (shape ``(B, seqlen)``) right-padded to ``(B, new_len)``: ``position_ids`` count on
    from 0 in the pad, any other field takes ``value``."""
    n, seqlen = t.shape
    out = torch.empty((n, new_len), dtype=t.dtype)
    out[:, :seqlen] = t
    if key == "position_ids":
        out[:, seqlen:] = torch.arange(new_len - seqlen, dtype=t.dtype)
    else:
        out[:, seqlen:] = value
    return out


def stack_extra(values: list[Any]) -> Any:
    """``values`` (one per sample) stacked into a ``(B, ...)`` tensor when they are same-shape
    numbers, arrays or tensors (integers become int64; floats and bools keep a dtype torch
    has); otherwise the list as it is."""
    if all(isinstance(v, torch.Tensor) for v in values):
        if all(v.shape == values[0].shape and v.dtype == values[0].dtype for v in values):
            t = torch.stack(values)
            if not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool:
                t = t.to(torch.int64)
            return t
        return values
    if not all(isinstance(v, (np.ndarray, np.generic, int, float, bool)) for v in values):
        return values
    arrays = [np.asarray(v) for v in values]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays):
        return values
    kinds = {a.dtype.kind for a in arrays}
    if kinds <= {"i", "u"}:
        return torch.from_numpy(np.stack(arrays, dtype=np.int64, casting="unsafe"))
    if kinds == {"f"} or kinds == {"b"}:
        stacked = np.stack(arrays)
        if stacked.dtype in _TORCH_NATIVE:
            return torch.from_numpy(stacked)
    return values
