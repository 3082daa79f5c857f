"""How an incoming batch of sequences becomes tokens: checked by the build's token rule, joined.

:func:`flat_sequences` (what the streaming packer uses, through :func:`flat_documents`, which
also takes the loss masks of documents ``{"input_ids", "loss_mask"}``) checks an incoming batch by
the rule of :func:`mmpack.build` (:func:`mmpack._src.store.tokens.as_token_array`, one function for
both) in one pass each over its dtypes, lengths and ndims, and joins it into one 1-D integer
array, a *chunk* (:mod:`mmpack._src.streaming.pieces`): one ``b"".join`` of the arrays' bytes when
they share one native dtype and are contiguous, else one ``np.concatenate`` into their common
dtype; lists of Python ints are converted by one ``np.fromiter``; anything else sequence by
sequence by the build's rule.  Cost: O(tokens), a few tenths of a microsecond a numpy sequence
(``python -m benchmarks.bench_streaming_floor``).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

__all__ = ["flat_documents", "flat_sequences", "refuse_wide_ids", "tokens_of"]


def tokens_of(item: Any) -> Any:
    return item["input_ids"] if isinstance(item, Mapping) else item


def _plain(item: Any) -> bool:
    """Tokens numpy can be trusted with as they are: a 1-D integer numpy array (lists go through
    the one-pass check of :func:`_int_lists_flat` or the build's exact rule)."""
    return type(item) is np.ndarray and item.ndim == 1 and item.dtype.kind in "iu"


_ndim = operator.attrgetter("ndim")
_dtype = operator.attrgetter("dtype")


def _hides_bools(items: list[Any], flat: np.ndarray, lens: np.ndarray) -> bool:
    """Whether a bool is among the elements of lists ``items`` (converted to ``flat``): only an
    element converted to 0 or 1 can be one, so only those are looked at (all of them, by one
    pass over the element types, when they are many)."""
    cand = np.flatnonzero(flat.view(np.uint64) <= 1)
    if not cand.size:
        return False
    if 8 * cand.size > flat.size:
        return bool in set(map(type, itertools.chain.from_iterable(items)))
    ends = np.cumsum(lens)
    doc = np.searchsorted(ends, cand, side="right")
    at = cand - (ends[doc] - lens[doc])
    return any(type(items[d][q]) is bool for d, q in zip(doc.tolist(), at.tolist()))


def _int_lists_flat(items: list[Any], lens: np.ndarray) -> np.ndarray | None:
    """Lists/tuples of Python ints converted in one pass into one int64 array (the lists one
    after the other), or None when some element is not an int (or is a bool, or does not fit
    int64).

    ``sum`` adds exact ints in C and turns float, numpy scalars or anything else into another
    type (or raises): an ``int`` total means every element is an int or a bool; the bools
    (converted to 0/1) are then looked for among the 0s and 1s only.  Cost: ``sum`` ~5 ns and
    ``np.fromiter`` ~15 ns a token, against ~25 ns for one ``np.array`` per list."""
    try:
        if type(sum(map(sum, items))) is not int:
            return None
        flat = np.fromiter(itertools.chain.from_iterable(items), np.int64, int(lens.sum()))
    except (TypeError, ValueError, OverflowError):
        return None
    if _hides_bools(items, flat, lens):
        return None
    return flat


def _concat_ints(arrays: list[np.ndarray]) -> np.ndarray:
    """1-D integer arrays one after the other in one integer array (their common dtype).

    int64 with uint64 (which numpy promotes to float64) gives int64: a uint64 id ``>= 2**63``
    among them is refused here (``ValueError`` naming it), as the packer refuses it when alone.
    """
    if not arrays:
        return np.empty(0, dtype=np.int64)
    flat = np.concatenate(arrays)
    if flat.dtype.kind in "iu":
        return flat if flat.dtype.isnative else flat.astype(flat.dtype.newbyteorder("="))
    refuse_wide_ids(arrays)
    return np.concatenate(arrays, dtype=np.int64, casting="unsafe")


def refuse_wide_ids(arrays: list[np.ndarray]) -> None:
    """``ValueError`` naming the uint64 id ``>= 2**63`` among ``arrays``, if any (the packer's
    rows are int64)."""
    for a in arrays:
        if a.dtype == np.uint64 and a.size and int(a.max()) > 2**63 - 1:
            raise ValueError(
                f"source sequences must hold token ids < 2**63 (they are returned as int64), "
                f"got {int(a.max())}"
            )


def _checked(items: list[Any]) -> tuple[list[Any], str]:
    """``items`` with dicts replaced by their ``input_ids``, and ``"arrays"`` when all are 1-D
    integer numpy arrays, ``"lists"`` when all are lists/tuples, else ``""``."""
    kinds = set(map(type, items))
    if any(issubclass(t, Mapping) for t in kinds):
        items = [tokens_of(x) for x in items]
        kinds = set(map(type, items))
    if kinds == {np.ndarray}:
        return items, "arrays"
    if kinds and kinds <= {list, tuple}:
        return items, "lists"
    return items, ""


def _exact(items: list[Any], first: int) -> list[np.ndarray]:
    """Every item by the build's exact token rule (sequence ``first + j`` named in errors)."""
    from mmpack._src.store.tokens import as_token_array  # the one token rule (the build's)

    return [x if _plain(x) else as_token_array(x, first + j) for j, x in enumerate(items)]


def _integer_dtypes(items: list[Any]) -> set[np.dtype] | None:
    """The dtypes of ``items`` when each has an integer numpy dtype (arrays, mostly), else
    None (lists, dicts, tensors...; or no item): one pass, no pass over the types first."""
    if not items:
        return None
    try:
        dtypes = set(map(_dtype, items))
    except AttributeError:
        return None
    if all(isinstance(d, np.dtype) and d.kind in "iu" for d in dtypes):
        return dtypes
    return None


def _joined_arrays(
    items: list[np.ndarray],
    dtypes: set[np.dtype],
    spare: Callable[[np.dtype, int], np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Numpy arrays ``items`` joined into one 1-D array of their common integer dtype
    (``spare(dtype, n)``'s when given) and their lengths; None when one of them is not 1-D or
    not of an integer dtype (the exact rule then names it).  One pass each over the dtypes,
    the lengths and (with one dtype) the ndims, then ``b"".join`` of the arrays' bytes (with one
    native dtype and every array contiguous: ~0.1 us an array and the copy, against ~0.2 us for
    ``np.concatenate``) or one ``np.concatenate`` into a 1-D array of the native common dtype,
    which refuses any array that is not 1-D (a 0-d array has no length).  ``dtypes``: their
    integer dtypes (:func:`_integer_dtypes`)."""
    try:
        lens = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    except TypeError:  # a 0-d array
        return None
    dtype = np.result_type(*dtypes)
    if dtype.kind not in "iu":  # int64 with uint64 (numpy's float64)
        if sum(map(_ndim, items)) != len(items):
            return None
        return _concat_ints(items), lens
    native = all(d.isnative for d in dtypes)  # (result_type's is native whatever theirs)
    if len(dtypes) == 1 and native and sum(map(_ndim, items)) == len(items):
        try:  # one dtype, all 1-D: the bytes one after the other (2x np.concatenate's speed)
            return np.frombuffer(b"".join(cast("list[Any]", items)), dtype=dtype), lens
        except (TypeError, ValueError, BufferError):  # a non-contiguous array
            pass
    dtype = dtype.newbyteorder("=")  # result_type's is native already: to be sure
    total = int(lens.sum())
    out = np.empty(total, dtype=dtype) if spare is None else spare(dtype, total)
    try:
        np.concatenate(items, out=out)
    except ValueError:  # not all 1-D
        return None
    return out, lens


def flat_sequences(
    items: list[Any], first: int = 0, spare: Callable[[np.dtype, int], np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of ``items`` one after the other in one 1-D integer array, and the lengths.

    Every sequence obeys the token rule of :func:`mmpack.build` (the same function checks both):
    1-D, integer ids (integral floats are converted, bools, fractions, strings and negative ids
    refused with a ``TypeError``/``ValueError`` naming source sequence ``first + j``), in one
    pass per incoming batch: 1-D integer arrays are checked by one pass each over their
    dtypes, lengths and ndims and joined (their common dtype; ~0.2 us an array with the copy,
    :func:`_joined_arrays`); lists of Python ints by one ``np.fromiter`` (int64); anything else
    is converted sequence by sequence by the build's rule, then joined.  ``spare(dtype, n)``,
    when given, provides the array that 1-D integer arrays of one common integer dtype are
    joined into (e.g. a reused buffer)."""
    return _flat(items, first, spare, _integer_dtypes(items))


def _flat(
    items: list[Any],
    first: int,
    spare: Callable[[np.dtype, int], np.ndarray] | None,
    dtypes: set[np.dtype] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`flat_sequences` of ``items`` whose integer dtypes are ``dtypes``
    (:func:`_integer_dtypes`)."""
    n = len(items)
    kind = ""
    if dtypes is None:
        items, kind = _checked(items)
        if kind == "arrays":
            dtypes = _integer_dtypes(items)
    if dtypes is not None:
        joined = _joined_arrays(items, dtypes, spare)
        if joined is not None:
            return joined
    elif kind == "lists":
        lens = np.fromiter(map(len, items), dtype=np.int64, count=n)
        flat = _int_lists_flat(items, lens)
        if flat is not None:
            return flat, lens
    arrays = _exact(items, first)
    lens = np.fromiter(map(len, arrays), dtype=np.int64, count=n)
    return _concat_ints(arrays), lens


def flat_documents(
    items: list[Any], first: int = 0, spare: Callable[[np.dtype, int], np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`flat_sequences` of documents that may carry loss masks, and their masks.

    A document ``{"input_ids": tokens, "loss_mask": mask}`` carries a per-token loss mask (the
    rule of :func:`mmpack._src.store.lossmask.as_loss_mask`, document ``first + j`` named in its
    errors); either every item of ``items`` carries one or none does (``ValueError`` naming the
    first that differs from the first item, :func:`mmpack._src.store.lossmask.mix_error`).

    Returns
    -------
    tokens, lens : numpy.ndarray
        As :func:`flat_sequences`.
    mask : numpy.ndarray, uint8, shape tokens.shape, or None
        The documents' masks one after the other (0: not a target, 1: a target); None when no
        item carries one.  Cost: nothing more for numpy arrays, one pass over the types for
        other items, and for masked documents the build's rule document by document.
    """
    dtypes = _integer_dtypes(items)
    if dtypes is not None or not _carry_masks(items, first):
        return (*_flat(items, first, spare, dtypes), None)
    from mmpack._src.store.lossmask import as_loss_mask  # the build's mask rule

    tokens = _exact([x["input_ids"] for x in items], first)
    masks = [as_loss_mask(x["loss_mask"], t.shape[0], first + j) for j, (x, t) in
             enumerate(zip(items, tokens))]  # fmt: skip
    flat, lens = flat_sequences(tokens, first, spare)
    mask = np.concatenate(masks) if masks else np.empty(0, dtype=np.uint8)
    return flat, lens, mask


def _carry_masks(items: list[Any], first: int) -> bool:
    """Whether the items (not all numpy arrays) are documents with a ``loss_mask``; a
    ``ValueError`` when some are and some are not."""
    if not any(issubclass(t, Mapping) for t in set(map(type, items))):
        return False
    flags = [isinstance(x, Mapping) and "loss_mask" in x for x in items]
    if flags[0] == flags[-1] and all(f == flags[0] for f in flags):
        return flags[0]
    from mmpack._src.store.lossmask import mix_error

    j = flags.index(not flags[0])
    raise mix_error(first + j, flags[j], first + j)
