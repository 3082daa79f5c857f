"""The token rule: what a document is and which token ids a store accepts, shared by
:func:`mmpack.build` and the streaming packer's sources.

A document is a 1-D sequence of integer token ids in ``[0, 2**63)`` (every view returns int64):
lists, tuples, numpy arrays or torch tensors; strings, nested sequences, bools, non-integer floats
and values that numpy would silently misread (``[1, True]``, ``[2**64 - 1, 1]``) are refused with a
message naming the document, position and value.  :func:`as_token_array` converts one document
(O(n), numpy; element-by-element Python only for the sequences numpy would misread).  The writer
takes chunks of numpy arrays as one flat buffer (:mod:`mmpack._src.store.gather`) and chunks of lists
of Python ints with one ``np.concatenate`` (:func:`plain_lengths`, :func:`concat_plain`); the
token rule is then checked by the build's one pass (:mod:`mmpack._src.store.tokenfile`), and
:func:`validate_tokens` names the first bad token of the refused document.  Anything else goes
document by document through :func:`as_token_array`.  Measured with the writer
(``python -m benchmarks store``, see :mod:`mmpack._src.store.writer`).
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np

__all__ = [
    "CHUNK_DOCS",
    "MAX_TOKEN",
    "as_token_array",
    "checked_lengths",
    "concat_docs",
    "concat_plain",
    "plain_lengths",
    "snapshot_doc",
    "tensor_values",
    "validate_tokens",
]

# Token ids must fit int64, the dtype every view returns (no vocabulary comes close).
MAX_TOKEN = 2**63 - 1


def as_token_array(doc: Any, j: int) -> np.ndarray:
    """Document ``j`` as a 1-D integer numpy array, checked against the token rule.

    Parameters
    ----------
    doc : list, tuple, numpy.ndarray or torch.Tensor
        A 1-D sequence of token ids.  Integral floats are converted; lists holding bools or
        huge ints are checked value by value (numpy would misread them).
    j : int
        The document's index, named in errors.

    Returns
    -------
    numpy.ndarray
        1-D, integer dtype (the input's own for integer arrays, else int64 or uint64); may share
        memory with ``doc``.  Values beyond ``MAX_TOKEN`` or a fixed store dtype are refused
        later by :func:`validate_tokens`.

    Raises
    ------
    TypeError
        A string, a scalar or a nested sequence.
    ValueError
        A negative, non-integer or non-numeric token (the message names its position).
    """
    if isinstance(doc, (str, bytes, bytearray)):
        raise TypeError(
            f"document {j} is a {type(doc).__name__}; documents are sequences of token ids "
            "(tokenize text first, e.g. with mmpack.ingest.ingest)"
        )
    if hasattr(doc, "detach") and hasattr(doc, "cpu"):  # a torch tensor
        doc = tensor_values(doc, j)
    try:
        arr = np.asarray(doc)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"document {j}: cannot read it as integers ({exc})") from None
    if arr.ndim != 1:
        if arr.ndim == 0:
            raise TypeError(
                f"document {j} is {type(doc).__name__} {_short_repr(doc)}; each document must be "
                "a 1-D sequence of token ids"
            )
        raise TypeError(
            f"document {j} has shape {arr.shape}; each document must be a 1-D sequence of token ids"
        )
    kind = arr.dtype.kind
    if isinstance(doc, (list, tuple)) and arr.size:
        # numpy reads [1, True] as int64 and [2**64 - 1, 1] as (rounded) float64: check exactly.
        types = set(map(type, doc))
        if bool in types or np.bool_ in types or (kind in "fO" and types - {float, np.float64}):
            return _exact_tokens(doc, j)
    if kind in "iu":
        return arr
    if arr.size == 0:
        return arr.astype(np.int64)
    if kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0) | (arr >= 2.0**63)
        if bad.any():
            p = int(np.argmax(bad))
            v = arr[p].item()
            if not np.isfinite(v) or v != np.floor(v):
                what = "non-integer"
            else:
                what = "negative" if v < 0 else "too large"
            raise ValueError(
                f"document {j} has a {what} token {v!r} at position {p}; "
                "tokens must be integers in [0, 2**63)"
            )
        return arr.astype(np.uint64)
    if kind == "O":
        return _exact_tokens(arr, j)
    raise ValueError(
        f"document {j} holds {arr.dtype} values (e.g. {arr[0].item()!r}); tokens must be integers"
    )


def tensor_values(doc: Any, j: int) -> np.ndarray:
    """The values of tensor document ``j`` as a numpy array (detached from autograd, copied to
    the CPU); ``ValueError`` for a tensor without data (``meta``), ``TypeError`` for one whose
    values torch cannot give (the message names the document)."""
    if getattr(doc, "is_meta", False):
        raise ValueError(
            f"document {j} is a tensor on the 'meta' device, which holds no values; "
            "documents need their token ids"
        )
    try:
        return np.asarray(doc.detach().cpu().numpy())
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        raise TypeError(f"document {j}: cannot read the tensor's values ({exc})") from None


def _exact_tokens(values: Any, j: int) -> np.ndarray:
    """Document ``j`` from a sequence of Python/numpy scalars, checked one by one (slow path for
    sequences numpy would misread: bools, mixed huge ints, objects)."""
    out = np.empty(len(values), dtype=np.uint64)
    for p, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, np.integer, float, np.floating)
        ):
            raise ValueError(
                f"document {j} has a non-integer token {_short_repr(v)} "
                f"({type(v).__name__}) at position {p}; tokens must be integers"
            )
        if isinstance(v, (float, np.floating)) and not (np.isfinite(v) and v == np.floor(v)):
            raise ValueError(
                f"document {j} has a non-integer token {v!r} at position {p}; "
                "tokens must be integers"
            )
        iv = int(v)
        if iv < 0:
            raise ValueError(f"document {j} has a negative token {iv} at position {p}")
        if iv > MAX_TOKEN:
            raise ValueError(
                f"document {j} has a token {iv} at position {p} that does not fit in int64 "
                "(token ids must be < 2**63: every view returns int64)"
            )
        out[p] = iv
    return out


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Documents taken per chunk by the writer's fast path.
CHUNK_DOCS = 1024


def snapshot_doc(doc: Any) -> Any:
    """A copy of a mutable document, taken the moment the source yields it: a source that
    refills one output buffer (an array, a tensor, a list, or any object exporting a buffer:
    ``memoryview``, ctypes arrays...) and yields it, or a view of it, again must not change the
    documents already taken.  Immutable documents (``bytes``, ``str``, tuples, numpy scalars)
    and tensors without data (``meta``) are returned as they are; so is an object numpy cannot
    read (the writer refuses it as it would refuse the original).  O(n): one copy."""
    t = type(doc)
    if t is np.ndarray or t is list:
        return doc.copy()
    if t is dict:  # a document with a loss mask: each value as it is now
        return {k: snapshot_doc(v) for k, v in doc.items()}
    if t is tuple or t is bytes or t is str or isinstance(doc, np.generic):
        return doc
    if isinstance(doc, array.array):  # a reused array.array: its slice is a copy
        return doc[:]
    if hasattr(doc, "detach") and hasattr(doc, "cpu"):  # a torch tensor: shares its storage
        return doc if getattr(doc, "is_meta", False) else doc.detach().cpu().clone()
    if isinstance(doc, np.ndarray):  # subclasses (np.memmap)
        return np.array(doc)
    if isinstance(doc, list):
        return list(doc)
    if isinstance(doc, bytearray):  # refused by the writer, under its own name
        return bytearray(doc)
    try:
        with memoryview(doc) as view:
            return np.array(view)  # a copy with the view's item type and shape
    except (TypeError, ValueError, NotImplementedError):  # not a buffer, or one numpy cannot read
        return doc


def plain_lengths(chunk: list[Any]) -> np.ndarray | None:
    """The lengths of the chunk's documents if they are plain sequences whose conversion numpy
    can be trusted with (arrays, tensors, lists/tuples of Python ints), else None."""
    element_types: set[type] = set()
    for d in chunk:
        t = type(d)
        if t is list or t is tuple:
            element_types.update(map(type, d))  # numpy would read True as 1: only ints pass
        elif t is str or t is bytes or t is bytearray:
            return None
    if element_types - {int}:
        return None
    try:
        return np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
    except TypeError:  # a scalar document
        return None


def concat_plain(docs: list[Any], total: int) -> np.ndarray | None:
    """One ``np.concatenate`` of unchecked documents, or None unless that gives exactly the
    ``total`` tokens as 1-D signed or narrow unsigned integers (uint64 mixed with int64 would go
    through float64)."""
    try:
        flat = np.concatenate(docs)
    except (TypeError, ValueError, OverflowError, RuntimeError, NotImplementedError):
        return None  # e.g. a tensor numpy cannot read: the writer's checks name the document
    if (
        flat.ndim != 1
        or flat.size != total
        or flat.dtype.kind not in "iu"
        or flat.dtype == np.uint64
    ):
        return None
    return flat


def concat_docs(
    entries: list[np.ndarray], lengths: np.ndarray, first_doc: int, has_u64: bool
) -> np.ndarray:
    """Concatenate the buffered entries (documents or flat chunks of documents) without numpy's
    int64 + uint64 -> float64 promotion."""
    if not entries:
        return np.empty(0, dtype=np.int64)
    if has_u64:
        ends = np.cumsum(lengths)
        base = 0
        for e in entries:
            if e.dtype.kind == "i" and e.size and e.min() < 0:
                p = base + int(np.argmin(e))
                d = int(np.searchsorted(ends, p, side="right"))
                pos = p - (int(ends[d - 1]) if d else 0)
                raise ValueError(
                    f"document {first_doc + d} has a negative token {int(e.min())} at position {pos}"
                )
            base += e.size
        return np.concatenate(entries, dtype=np.uint64, casting="unsafe")  # negatives refused above
    return np.concatenate(entries)


def validate_tokens(
    flat: np.ndarray, lengths: np.ndarray, first_doc: int, fixed: np.dtype | None
) -> None:
    """Raise naming the first document whose tokens are negative, >= 2**63 or exceed ``fixed``."""
    limit = MAX_TOKEN if fixed is None else min(MAX_TOKEN, int(np.iinfo(fixed).max))
    bad = None
    if flat.dtype.kind == "i" and flat.min() < 0:
        bad = flat < 0
    elif int(flat.max()) > limit:
        bad = flat > np.array(limit, dtype=flat.dtype) if flat.dtype.kind == "u" else flat > limit
    if bad is None:
        return
    p = int(np.argmax(bad))
    ends = np.cumsum(lengths)
    d = int(np.searchsorted(ends, p, side="right"))
    pos = p - (int(ends[d - 1]) if d else 0)
    value = int(flat[p])
    if value < 0:
        raise ValueError(f"document {first_doc + d} has a negative token {value} at position {pos}")
    if value > MAX_TOKEN:
        raise ValueError(
            f"document {first_doc + d} has a token {value} at position {pos} that does not fit "
            "in int64 (token ids must be < 2**63: every view returns int64)"
        )
    assert fixed is not None  # without a fixed dtype, only the two cases above are bad
    raise ValueError(
        f"document {first_doc + d} has token {value} at position {pos}, which does not fit "
        f"dtype={fixed.name} (max {np.iinfo(fixed).max}); pass a wider dtype or dtype=None"
    )


def checked_lengths(lengths: np.ndarray, n_tokens: int) -> np.ndarray:
    """``lengths`` as int64 after exact checks: each in ``[0, n_tokens]`` and summing to
    ``n_tokens`` without wraparound (a uint64 ``[2**64 - 1, 2]`` sums to 1 in numpy)."""
    if lengths.size == 0:
        if n_tokens:
            raise ValueError(f"tokens holds {n_tokens} items but lengths is empty")
        return np.empty(0, dtype=np.int64)
    if lengths.dtype.kind == "i" and int(lengths.min()) < 0:
        j = int(np.argmin(lengths))
        raise ValueError(f"lengths must be non-negative; lengths[{j}] is {int(lengths[j])}")
    if int(lengths.max()) > n_tokens:
        j = int(np.argmax(lengths))
        raise ValueError(
            f"lengths[{j}] is {int(lengths[j])} but tokens holds only {n_tokens} items"
        )
    out = lengths.astype(np.int64)
    # Every term is in [0, n_tokens]: a sum past 2**63 would wrap negative, so compare the
    # running sums (never decreasing) and their total exactly.
    ends = np.cumsum(out)
    if int(ends[-1]) != n_tokens or (ends.size > 1 and bool(np.any(ends[1:] < ends[:-1]))):
        total = sum(int(v) for v in lengths) if lengths.size <= 1 << 16 else "more"
        raise ValueError(f"tokens holds {n_tokens} items but lengths sum to {total}")
    return out
