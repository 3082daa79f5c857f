"""The keys of mmpack's keyed permutations: from a seed to the Feistel round keys.

A seed (an int, or a tuple of ints, each in ``[0, 2**64)``) is encoded injectively as uint32
words (its length, then two words per int); :class:`numpy.random.SeedSequence` of those words
draws :data:`ROUNDS` base keys (cached per seed); the round keys of an epoch are
``mix64(base_r ^ mix64(epoch + (r + 1) * 0x9E3779B97F4A7C15))`` (:func:`epoch_keys`, one
vectorised kernel call for many epochs).  :func:`feistel_width` gives the half width and mask of
the network over ``range(n)``.  The kernels that evaluate the permutation are
:mod:`mmpack._src.kernels.permutation`; :class:`mmpack.Permutation` and the
build's document order (:mod:`mmpack._src.store.doc_order`) both take their keys from here, so a
permutation is a pure function of ``(n, seed, epoch)`` in every layer.  Cost: one
``SeedSequence`` per new seed (cached), O(rounds) per epoch.
"""

from __future__ import annotations

import functools

import numpy as np

from mmpack._src.core.validation import check_seed_parts
from mmpack._src.kernels.permutation import derive_keys

__all__ = ["MAX_N", "ROUNDS", "SeedLike", "epoch_keys", "feistel_width", "seed_words"]

MAX_N = 2**62
"""Largest supported domain size."""

ROUNDS = 8
"""Feistel rounds (4 suffice for a pseudo-random permutation in theory; 8 leave a wide margin)."""

SeedLike = int | tuple[int, ...]


def seed_words(seed: SeedLike, name: str = "seed") -> tuple[int, ...]:
    """Encode a seed as uint32 words, injectively (a length, then 2 words per int).

    Raises
    ------
    TypeError
        A part of ``seed`` is not an integer (the message names ``name`` and the value).
    ValueError
        A part lies outside ``[0, 2**64)``.
    """
    ints = check_seed_parts(seed, name)
    words = [len(ints)]
    for s in ints:
        words += [s & 0xFFFFFFFF, s >> 32]
    return tuple(words)


@functools.lru_cache(maxsize=256)
def _base_keys(words: tuple[int, ...]) -> np.ndarray:
    keys = np.random.SeedSequence(list(words)).generate_state(ROUNDS, np.uint64)
    keys.flags.writeable = False
    return keys


def epoch_keys(seed: SeedLike, epochs: np.ndarray) -> np.ndarray:
    """Round keys of ``Permutation(n, seed=seed, epoch=e)`` for each ``e`` in ``epochs``.

    Parameters
    ----------
    epochs : numpy.ndarray, integer, shape (G,)
        Values in ``[0, 2**64)`` (not validated).

    Returns
    -------
    numpy.ndarray, uint64, shape (G, ROUNDS)
    """
    base = _base_keys(seed_words(seed))
    out = np.empty((len(epochs), ROUNDS), dtype=np.uint64)
    derive_keys(base, np.asarray(epochs).astype(np.uint64), out)
    return out


def feistel_width(n: int) -> tuple[np.uint64, np.uint64]:
    """``(half_bits, mask)`` of the network over ``range(n)``: the smallest even bit width
    holding ``n - 1`` (at least 2), halved, and ``2**half_bits - 1``; both uint64."""
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2) if n > 1 else 1
    return np.uint64(half_bits), np.uint64((1 << half_bits) - 1)
