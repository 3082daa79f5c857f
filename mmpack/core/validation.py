"""Argument checks shared by every public entry point: one wording for one mistake.

Each check raises the builtin a caller would expect (``TypeError`` for a wrong type,
``ValueError`` for a bad value, ``IndexError`` out of range) with a message naming the argument and
the value it got.  ``bool`` is refused wherever an integer is expected (``True`` is an ``int`` to
Python, never a meaningful index or length).

This module is the one place that bounds integers: every count, size, stride or id mmpack takes
ends up in int64 arithmetic (numpy, numba), where a Python int past 2**63 fails with numba's or
numpy's own error ("Python int too large to convert to C long").  :func:`check_int_range` and
:func:`check_positive_int` therefore always have an upper bound, :data:`MAX_INT` (2**62, which
leaves int64 room for a sum or a doubling) unless the caller gives its own.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = [
    "MAX_INT",
    "check_index",
    "check_indices",
    "check_int",
    "check_int_range",
    "check_positive_int",
    "check_token_id",
]


def check_int(value: Any, name: str) -> int:
    """``value`` as a Python int; ``TypeError`` for a bool or a non-integer."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


MAX_INT = 2**62
"""The largest integer argument accepted where no tighter bound is given."""


def check_int_range(value: Any, name: str, lo: int | None, hi: int | None = None) -> int:
    """:func:`check_int`, then ``ValueError`` unless ``lo <= value < hi``; without ``hi``,
    unless ``lo <= value <= MAX_INT`` (2**62).  ``lo=None``: only the upper bound (for callers
    that check the lower one with a message of their own)."""
    v = check_int(value, name)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is None:
        if v > MAX_INT:
            raise ValueError(f"{name} must be <= 2**62, got {v}")
    elif v >= hi:
        raise ValueError(f"{name} must be < {_power(hi)}, got {v}")
    return v


def _power(v: int) -> str:
    return f"2**{v.bit_length() - 1}" if v > 1 << 16 and v & (v - 1) == 0 else str(v)


def check_positive_int(value: Any, name: str) -> int:
    """:func:`check_int`, then ``ValueError`` unless ``1 <= value <= 2**62``."""
    return check_int_range(value, name, 1)


def check_token_id(value: Any, name: str) -> int:
    """A token id as written to int64 outputs (any int64 value, e.g. a negative pad id)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer token id, got {type(value).__name__} {value!r}")
    v = int(value)
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"{name}={v} does not fit in int64")
    return v


def check_index(i: Any, n: int, what: str = "sample") -> int:
    """A single index into ``n`` items (negative counts from the end), as ``0 <= j < n``."""
    given = check_int(i, f"{what} index")
    j = given + n if given < 0 else given
    if not 0 <= j < n:
        raise IndexError(f"{what} index {given} is out of range for {n} {what}s")
    return j


def check_indices(indices: Any, n: int, what: str = "sample") -> np.ndarray:
    """A batch of indices into ``n`` items as int64, shape (k,), negatives resolved."""
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
