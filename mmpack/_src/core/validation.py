"""Argument checks shared by every public entry point: one wording for one mistake.

Each check raises the builtin a caller would expect (``TypeError`` for a wrong type,
``ValueError`` for a bad value, ``IndexError`` out of range) with a message naming the argument and
the value it got.  ``bool`` is refused wherever an integer is expected (``True`` is an ``int`` to
Python, never a meaningful index or length).

This module is the one place that bounds integers: every count, size, stride or id mmpack takes
ends up in int64 arithmetic (numpy, numba), where a Python int past 2**63 fails with numba's or
numpy's own error ("Python int too large to convert to C long").  :func:`check_int_range` and
:func:`check_positive_int` therefore always have an upper bound, :data:`_MAX_INT` (2**62, which
leaves int64 room for a sum or a doubling) unless the caller gives its own.
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from mmpack._src.core.constants import UINT64_LIMIT
from mmpack._src.core.options import DEFAULT_REGION_BINS

__all__ = [
    "EpochIndex",
    "check_block_bounds",
    "check_bool",
    "check_dtype",
    "check_in_range",
    "check_index",
    "check_indices",
    "check_int",
    "check_int_range",
    "check_positive_int",
    "check_probability",
    "check_region_tokens",
    "check_seed",
    "check_seed_parts",
    "check_token_id",
    "check_token_ids",
    "epoch_index_type",
    "index_epochs",
]


def _is_bool(value: Any) -> bool:
    """A bool, a numpy bool, or a 0-d array/tensor of bool dtype (``operator.index`` accepts
    ``torch.tensor(True)`` as 1)."""
    if isinstance(value, (bool, np.bool_)):
        return True
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def check_int(value: Any, name: str) -> int:
    """``value`` as a Python int; ``TypeError`` for a bool or a non-integer."""
    if _is_bool(value):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


_MAX_INT = 2**62
"""The largest integer argument accepted where no tighter bound is given."""


def check_int_range(value: Any, name: str, lo: int | None, hi: int | None = None) -> int:
    """:func:`check_int`, then ``ValueError`` unless ``lo <= value < hi``; without ``hi``,
    unless ``lo <= value <= _MAX_INT`` (2**62).  ``lo=None``: only the upper bound (for callers
    that check the lower one with a message of their own)."""
    v = check_int(value, name)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is None:
        if v > _MAX_INT:
            raise ValueError(f"{name} must be <= 2**62, got {v}")
    elif v >= hi:
        raise ValueError(f"{name} must be < {_power(hi)}, got {v}")
    return v


def check_in_range(value: Any, name: str, lo: int, hi: int, *, closed: bool = False) -> int:
    """:func:`check_int`, then ``ValueError`` unless ``lo <= value < hi`` (``<= hi`` when
    ``closed``), worded with the interval: ``n must be in [0, 2**62], got n=-1``."""
    v = check_int(value, name)
    if not (lo <= v <= hi if closed else lo <= v < hi):
        interval = f"[{_power(lo)}, {_power(hi)}{']' if closed else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {name}={v}")
    return v


def check_dtype(value: Any, name: str = "dtype") -> np.dtype:
    """``np.dtype(value)``; ``TypeError`` naming the value when numpy does not read it as one."""
    try:
        return np.dtype(value)
    except TypeError as exc:
        raise TypeError(f"{name}={value!r} is not a numpy dtype") from exc


def _power(v: int) -> str:
    return f"2**{v.bit_length() - 1}" if v > 1 << 16 and v & (v - 1) == 0 else str(v)


def check_positive_int(value: Any, name: str) -> int:
    """:func:`check_int`, then ``ValueError`` unless ``1 <= value <= 2**62``."""
    return check_int_range(value, name, 1)


def check_region_tokens(value: Any, seqlen: int) -> int | None:
    """``region_tokens`` of a packing plan: None (one region, the whole store), ``"auto"``
    (:data:`~mmpack._src.core.options.DEFAULT_REGION_BINS` ``* seqlen``, ``seqlen`` already checked)
    or an integer in ``[1, 2**62]``, as an int or None."""
    if value is None:
        return None
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(
                f"region_tokens must be an integer >= 1, 'auto' or None, got {value!r}"
            )
        return DEFAULT_REGION_BINS * int(seqlen)
    return check_int_range(value, "region_tokens", 1)


def check_token_id(value: Any, name: str) -> int:
    """A token id as written to int64 outputs (any int64 value, e.g. a negative pad id)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer token id, got {type(value).__name__} {value!r}")
    v = int(value)
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"{name}={v} does not fit in int64")
    return v


def check_token_ids(values: Any, name: str) -> tuple[int, ...]:
    """An iterable of token ids (:func:`check_token_id` each) as a tuple; ``TypeError`` for a
    string or a non-iterable."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be an iterable of integer token ids, got {values!r}")
    return tuple(check_token_id(t, f"{name} item") for t in values)


def check_probability(value: Any, name: str) -> float:
    """A real number in ``[0, 1]`` as a float; ``TypeError`` for a bool or a non-number."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number in [0, 1], got {type(value).__name__} {value!r}"
        )
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def check_seed(value: Any, name: str = "seed") -> int:
    """A key in ``[0, 2**64)`` (seeds and epochs)."""
    return check_int_range(value, name, 0, UINT64_LIMIT)


def check_seed_parts(value: Any, name: str = "seed") -> tuple[int, ...]:
    """The ints of a seed given as an int or a tuple of ints, each in ``[0, 2**64)``
    (:class:`~mmpack.Permutation`'s ``seed=``, a build's ``shuffle_docs=``);
    ``TypeError`` for a part that is not an integer, ``ValueError`` for one out of range, both
    naming ``name`` and the value."""
    parts = value if isinstance(value, tuple) else (value,)
    ints = tuple(check_int(s, name) for s in parts)
    for s in ints:
        if not 0 <= s < UINT64_LIMIT:
            raise ValueError(f"{name} must be made of ints in [0, 2**64), got {value!r}")
    return ints


def check_bool(value: Any, name: str) -> bool:
    """A bool (or numpy bool) as a bool; ``TypeError`` otherwise (``0`` and ``"no"`` are not)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_weights(weights: Any, name: str = "weights") -> np.ndarray:
    """Mixture weights: a non-empty 1-D sequence of finite, non-negative numbers, not all zero.

    Returns them as float64, shape (K,); ``TypeError`` (not numbers) or ``ValueError`` naming
    ``name`` and the value otherwise.
    """
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {weights!r}") from None
    if w.ndim != 1 or w.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence, got {weights!r} (shape {w.shape})"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"{name} must be finite and non-negative, got {w.tolist()}")
    if not np.any(w > 0):
        raise ValueError(f"{name} must not all be zero, got {w.tolist()}")
    return w


def check_block_bounds(bounds: Any, n: int, name: str = "block_bounds") -> np.ndarray:
    """Cuts of ``range(n)`` into blocks of consecutive ids: ``[0, b1, ..., n]``.

    Returns
    -------
    numpy.ndarray, int64, shape (n_blocks + 1,)
        A read-only copy; strictly increasing from 0 to ``n`` (``[0]`` alone for ``n = 0``).

    Raises
    ------
    TypeError
        Not a one-dimensional array of integers (bools refused).
    ValueError
        Empty, not starting at 0, not ending at ``n``, or not strictly increasing; the message
        names the first offending value and where it stands.
    """
    arr = np.asarray(bounds)
    if arr.ndim == 1 and arr.size == 0:
        raise ValueError(f"{name} must hold at least one value (0), got an empty array")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
        raise TypeError(
            f"{name} must be a one-dimensional integer array, got dtype {arr.dtype} "
            f"and shape {arr.shape}"
        )
    if arr.dtype == np.uint64 and int(arr.max()) >= _MAX_INT:
        raise ValueError(f"{name} holds {int(arr.max())}, past 2**62")
    out = np.array(arr, dtype=np.int64, copy=True)
    if int(out[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0]={int(out[0])}")
    if int(out[-1]) != n:
        raise ValueError(
            f"{name} must end at n={n} (the number of samples), got {name}[-1]={int(out[-1])}"
        )
    steps = np.diff(out)
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        j = int(bad[0]) + 1
        raise ValueError(
            f"{name} must be strictly increasing, got {name}[{j}]={int(out[j])} after "
            f"{name}[{j - 1}]={int(out[j - 1])}"
        )
    out.flags.writeable = False
    return out


def check_index(i: Any, n: int, what: str = "sample") -> int:
    """A single index into ``n`` items (negative counts from the end), as ``0 <= j < n``."""
    given = check_int(i, f"{what} index")
    j = given + n if given < 0 else given
    if not 0 <= j < n:
        raise IndexError(f"{what} index {given} is out of range for {n} {what}s")
    return j


def check_indices(indices: Any, n: int, what: str = "sample") -> np.ndarray:
    """A batch of indices into ``n`` items as int64, shape (k,), negatives resolved.

    A list or tuple holding a bool is refused like ``ds[True]`` (numpy would read ``[0, True]``
    as the integers ``[0, 1]``)."""
    if (
        isinstance(indices, (list, tuple))
        and not _plain_index_types(set(map(type, indices)))
        and any(map(_is_bool, indices))
    ):
        bad = next(i for i in indices if _is_bool(i))
        raise TypeError(f"{what} indices must be integers, got bool {bad!r} in {indices!r}")
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise TypeError(f"indices must be a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype == object:  # Python ints beyond int64, or mixed objects
        return np.array([check_index(i, n, what) for i in arr], dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.max() >= 2**63:
        raise IndexError(f"{what} index {int(arr.max())} is out of range for {n} {what}s")
    arr = arr.astype(np.int64)
    bad = (arr < -n) | (arr >= n)
    if bad.any():
        raise IndexError(f"{what} index {int(arr[np.argmax(bad)])} is out of range for {n} {what}s")
    return np.where(arr < 0, arr + n, arr)


class EpochIndex(int):
    """A sample index that carries the epoch it was drawn for: ``EpochIndex(value, epoch)``.

    :class:`mmpack.ResumableSampler` yields these: to any dataset an ``int``, to mmpack's
    views also the epoch of the sample (``PackedDataset`` keys its MLM corruption with it, a
    ``Mixture`` hands it on to its sources), so the epoch reaches DataLoader workers with the
    indices themselves: persistent workers never see a ``set_epoch`` called in the main process.
    Arithmetic gives plain ints; pickles as ``(value, epoch)``.

    Each epoch has its own subclass holding ``epoch`` as a class attribute, so an instance is as
    small as an ``int`` (no per-instance dict).
    """

    __slots__ = ()
    epoch: int

    def __new__(cls, value: int, epoch: int) -> EpochIndex:
        return epoch_index_type(epoch)(check_int(value, "index"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (EpochIndex, (int(self), self.epoch))

    def __repr__(self) -> str:
        return f"EpochIndex({int(self)}, epoch={self.epoch})"


@functools.lru_cache(maxsize=256)
def _epoch_type(epoch: int) -> type[EpochIndex]:
    # ``__new__`` is int's: ``cls(i)`` makes an index of this epoch without a check.
    return type(
        "EpochIndex",
        (EpochIndex,),
        {"__slots__": (), "epoch": epoch, "__new__": int.__new__, "__module__": __name__},
    )


def epoch_index_type(epoch: int) -> Callable[[int], EpochIndex]:
    """The subclass of :class:`EpochIndex` of ``epoch`` (``0 <= epoch < 2**64``):
    ``epoch_index_type(e)(i)`` makes index ``i`` of epoch ``e`` without a check (the sampler's
    path: about 0.35 us per index against 0.04 us for a plain int)."""
    if type(epoch) is not int or not 0 <= epoch < 2**64:
        epoch = check_int_range(epoch, "epoch", 0, 2**64)
    return _epoch_type(epoch)


def _plain_index_types(types: set[type]) -> bool:
    return all(t is int or issubclass(t, EpochIndex) for t in types)


def index_epochs(indices: Any, default: Any) -> Any:
    """The epoch of every index of a batch: that of each :class:`EpochIndex`, ``default`` for
    any other index.

    Returns
    -------
    int (or ``default``)
        When every index has the same epoch (the usual case: a batch comes from one epoch).
    list
        Otherwise, one epoch per index.
    """
    if not isinstance(indices, (list, tuple)):
        return getattr(indices, "epoch", default) if np.ndim(indices) == 0 else default
    # Each epoch has its own EpochIndex subclass: the distinct types of a batch (one set built
    # in C) decide its epochs, with no Python work per index in the usual one-epoch batch.
    types = set(map(type, indices))
    found = {getattr(t, "epoch", default) for t in types}
    if len(found) <= 1:
        return found.pop() if found else default
    return [getattr(i, "epoch", default) for i in indices]
