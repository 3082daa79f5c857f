"""Keyed pseudo-random permutations of ``range(n)``: a balanced Feistel network plus cycle-walking.

The domain is ``2 * half_bits`` bits wide (the smallest even width holding ``n - 1``, at least 2),
split into two ``half_bits`` halves.  One round maps ``(left, right)`` to
``(right, left ^ F(right, key_r))`` with ``F(x, k) = splitmix64_finalizer(x ^ k) & mask``, a bijective
64-bit mixer truncated to the half width; any number of rounds is a bijection of the domain.
Cycle-walking (re-encrypting while the value is ``>= n``) restricts it to a bijection of
``range(n)``.  Since the domain is less than ``4 n`` the walk takes fewer than 4 encryptions on
average.

Cost: ``rounds`` multiply-xorshift mixes per encryption, O(1) memory.  Everything is unsigned 64-bit
arithmetic (``n <= 2**62``).  The callers validate ``n``, ``half_bits``, ``mask``, ``keys`` and that
every index lies in ``range(n)``; the kernels never check.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = [
    "derive_keys",
    "invert",
    "invert_many",
    "mix64",
    "permute",
    "permute_many",
    "permute_many_keyed",
]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64's finalizer: a bijection of uint64 with full avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit
def derive_keys(base: np.ndarray, epochs: np.ndarray, out: np.ndarray) -> None:
    """Round keys of several epochs: ``out[g, r] = mix64(base[r] ^ mix64(epochs[g] + (r + 1) * golden))``.

    ``base``: uint64 (rounds,); ``epochs``: uint64 (G,); ``out``: uint64 (G, rounds).  Distinct
    epochs get distinct keys in every round (both mixes are bijections).
    """
    for g in range(epochs.size):
        for r in range(base.size):
            out[g, r] = mix64(base[r] ^ mix64(epochs[g] + np.uint64(r + 1) * _GOLDEN))


@njit
def _encrypt(x: np.uint64, half_bits: np.uint64, mask: np.uint64, keys: np.ndarray) -> np.uint64:
    left = x >> half_bits
    right = x & mask
    for r in range(keys.size):
        f = mix64(right ^ keys[r]) & mask
        left, right = right, left ^ f
    return (left << half_bits) | right


@njit
def _decrypt(y: np.uint64, half_bits: np.uint64, mask: np.uint64, keys: np.ndarray) -> np.uint64:
    left = y >> half_bits
    right = y & mask
    for r in range(keys.size - 1, -1, -1):
        f = mix64(left ^ keys[r]) & mask
        left, right = right ^ f, left
    return (left << half_bits) | right


@njit
def permute(i: int, n: int, half_bits: np.uint64, mask: np.uint64, keys: np.ndarray) -> np.int64:
    """Image of ``i`` (int64 in ``range(n)``) under the keyed permutation; returns int64.

    ``half_bits`` and ``mask = 2**half_bits - 1`` are uint64, ``keys`` is uint64 of shape (rounds,).
    """
    bound = np.uint64(n)
    x = _encrypt(np.uint64(i), half_bits, mask, keys)
    while x >= bound:
        x = _encrypt(x, half_bits, mask, keys)
    return np.int64(x)


@njit
def invert(j: int, n: int, half_bits: np.uint64, mask: np.uint64, keys: np.ndarray) -> np.int64:
    """Preimage of ``j`` (int64 in ``range(n)``): ``permute(invert(j)) == j``; returns int64."""
    bound = np.uint64(n)
    x = _decrypt(np.uint64(j), half_bits, mask, keys)
    while x >= bound:
        x = _decrypt(x, half_bits, mask, keys)
    return np.int64(x)


@njit
def permute_many(
    idx: np.ndarray,
    out: np.ndarray,
    n: int,
    half_bits: np.uint64,
    mask: np.uint64,
    keys: np.ndarray,
) -> None:
    """``out[t] = permute(idx[t])`` for int64 arrays ``idx`` and ``out`` of the same shape (m,)."""
    bound = np.uint64(n)
    for t in range(idx.size):
        x = _encrypt(np.uint64(idx[t]), half_bits, mask, keys)
        while x >= bound:
            x = _encrypt(x, half_bits, mask, keys)
        out[t] = np.int64(x)


@njit
def invert_many(
    idx: np.ndarray,
    out: np.ndarray,
    n: int,
    half_bits: np.uint64,
    mask: np.uint64,
    keys: np.ndarray,
) -> None:
    """``out[t] = invert(idx[t])`` for int64 arrays ``idx`` and ``out`` of the same shape (m,)."""
    bound = np.uint64(n)
    for t in range(idx.size):
        x = _decrypt(np.uint64(idx[t]), half_bits, mask, keys)
        while x >= bound:
            x = _decrypt(x, half_bits, mask, keys)
        out[t] = np.int64(x)


@njit
def permute_many_keyed(
    idx: np.ndarray,
    group: np.ndarray,
    out: np.ndarray,
    n: int,
    half_bits: np.uint64,
    mask: np.uint64,
    keys: np.ndarray,
) -> None:
    """``out[t] = permute(idx[t])`` under the round keys ``keys[group[t]]``.

    ``idx``, ``group``, ``out``: int64 (m,); ``keys``: uint64 (G, rounds), ``0 <= group < G``.
    """
    bound = np.uint64(n)
    for t in range(idx.size):
        row = keys[group[t]]
        x = _encrypt(np.uint64(idx[t]), half_bits, mask, row)
        while x >= bound:
            x = _encrypt(x, half_bits, mask, row)
        out[t] = np.int64(x)
