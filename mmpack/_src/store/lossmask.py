"""Per-token loss masks: what a document with a mask is, the mask rule, and the checks that tie a
store to its mask store.

A document with a loss mask is a dict ``{"input_ids": tokens, "loss_mask": mask}``: ``mask`` is a
1-D sequence of as many values as ``tokens`` has, each 0 (the token is not a target: no loss is
taken where it is predicted) or 1 (a target); bools, integers of any dtype, lists, numpy arrays
and torch tensors are accepted.  A dict without ``"loss_mask"`` is a document without one.  A
store holds a mask for all of its documents or for none (:func:`mix_error` words the refusal).
:func:`split_document` checks one document dict and returns its tokens and its mask as
``uint8``: O(n) numpy, one pass for the range check.

The mask is stored as a second store (:data:`~mmpack._src.store.format.LOSS_MASK_STORE`, ``uint8``
tokens, the same offsets) whose fingerprint the store's record names;
:func:`check_mask_store` checks an opened mask store against its store from their metadata
alone (fingerprint, counts, the offsets' block checksums): no token is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.store.tokens import as_token_array, tensor_values
from mmpack.errors import FormatError

__all__ = ["as_loss_mask", "check_mask_store", "mix_error", "split_document"]

_DOC_KEYS = ("input_ids", "loss_mask")
"""The keys a document dict may hold."""
MASK_DTYPE = np.dtype("<u1")


def split_document(doc: dict[Any, Any], j: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The tokens and loss mask of document ``j`` given as a dict.

    Parameters
    ----------
    doc : dict
        ``{"input_ids": tokens}`` or ``{"input_ids": tokens, "loss_mask": mask}``.
    j : int
        The document's index, named in errors.

    Returns
    -------
    tokens : numpy.ndarray
        1-D integers (see :func:`~mmpack._src.store.tokens.as_token_array`).
    mask : numpy.ndarray or None
        ``uint8``, shape ``tokens.shape``, values 0 or 1; None when ``doc`` has no mask.

    Raises
    ------
    ValueError
        A key other than :data:`_DOC_KEYS`, no ``"input_ids"``, or a bad mask (see
        :func:`as_loss_mask`).
    """
    extra = [k for k in doc if k not in _DOC_KEYS]
    if extra or "input_ids" not in doc:
        what = f"has keys {sorted(extra, key=str)!r}" if extra else "has no 'input_ids'"
        raise ValueError(
            f"document {j} {what}; a document given as a dict holds 'input_ids' and, "
            "optionally, 'loss_mask'"
        )
    tokens = as_token_array(doc["input_ids"], j)
    if "loss_mask" not in doc:
        return tokens, None
    return tokens, as_loss_mask(doc["loss_mask"], tokens.shape[0], j)


def as_loss_mask(mask: Any, n: int, j: int) -> np.ndarray:
    """Loss mask of document ``j`` (``n`` tokens) as ``uint8`` 0/1, shape (n,).

    Raises
    ------
    TypeError
        A string, a scalar or a nested sequence.
    ValueError
        Another length than ``n``, or a value other than 0/1 (the message names its position).
    """
    if isinstance(mask, (str, bytes, bytearray)) or mask is None:
        raise TypeError(
            f"document {j}: loss_mask is {type(mask).__name__}; it must be a 1-D sequence of "
            "0/1 values, one per token"
        )
    if hasattr(mask, "detach") and hasattr(mask, "cpu"):  # a torch tensor
        mask = tensor_values(mask, j)
    arr = np.asarray(mask)
    if arr.ndim != 1:
        raise TypeError(
            f"document {j}: loss_mask has shape {arr.shape}; it must be 1-D, one value per token"
        )
    if arr.shape[0] != n:
        raise ValueError(
            f"document {j}: loss_mask has {arr.shape[0]} values but input_ids has {n} tokens; "
            "they must have the same length"
        )
    if arr.dtype == np.bool_:
        return arr.astype(MASK_DTYPE)
    if n and arr.dtype.kind not in "iu":
        raise ValueError(
            f"document {j}: loss_mask holds {arr.dtype} values (e.g. {arr[0].item()!r}); "
            "it holds 0 (not a target) or 1 (a target), as integers or bools"
        )
    if n:
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            p = int(np.argmax(bad))
            raise ValueError(
                f"document {j}: loss_mask[{p}] is {arr[p].item()!r}; a loss mask holds 0 "
                "(not a target) or 1 (a target)"
            )
    return arr.astype(MASK_DTYPE)


def mix_error(j: int, has_mask: bool, before: int) -> ValueError:
    """The error for document ``j`` that has a loss mask (``has_mask``) while the ``before``
    documents before it have none, or the other way round."""
    if has_mask:
        earlier = "document 0 before it has" if before == 1 else f"documents 0 to {before - 1} have"
        return ValueError(
            f"document {j} has a loss_mask but {earlier} none; give every document of a "
            "store a loss_mask, or none"
        )
    return ValueError(
        f"document {j} has no loss_mask but the documents before it have one; give every "
        "document of a store a loss_mask, or none"
    )


def check_mask_store(store: Any, mask: Any, fingerprint: str) -> None:
    """:class:`FormatError` unless ``mask`` (an opened store) is the loss mask store that
    ``store``'s record names: its fingerprint is ``fingerprint``, its tokens ``uint8``, its
    document and token counts and its offsets' block checksums ``store``'s."""
    ours, theirs = store._meta, mask._meta
    problem = None
    if mask.fingerprint != fingerprint:
        problem = f"has fingerprint {mask.fingerprint}, the store names {fingerprint}"
    elif mask.dtype != MASK_DTYPE:
        problem = f"holds {mask.dtype} tokens, not uint8"
    elif (len(mask), mask.num_tokens) != (len(store), store.num_tokens):
        problem = (
            f"holds {len(mask)} documents and {mask.num_tokens} tokens, the store "
            f"{len(store)} and {store.num_tokens}"
        )
    elif getattr(ours, "offsets_crc32", ()) != getattr(theirs, "offsets_crc32", ()):
        problem = "has other document offsets than the store"
    if problem is not None:
        raise FormatError(
            f"{store.location}: its loss mask store {problem}: the store is damaged; rebuild it"
        )
