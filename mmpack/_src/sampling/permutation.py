"""O(1)-memory keyed permutations of ``range(n)`` for any ``n`` up to ``2**62``.

:class:`Permutation` is a bijection of ``range(n)`` computed on the fly, never materialised: a
balanced Feistel network over the smallest even number of bits that holds ``n - 1`` (at least 2),
:data:`~mmpack._src.core.permutation_keys.ROUNDS` rounds whose round function is splitmix64's finalizer applied to ``half ^ round_key``,
and cycle-walking to stay inside ``range(n)`` (see :mod:`mmpack._src.kernels.permutation`).  The round
keys of a seed are drawn from :class:`numpy.random.SeedSequence` (once per seed, cached), and those
of an epoch are ``mix64(base_r ^ mix64(epoch + (r + 1) * 0x9E3779B97F4A7C15))`` (so many epochs'
keys can be derived in one vectorised call; :mod:`mmpack._src.core.permutation_keys` owns them): a permutation is a pure
function of ``(n, seed, epoch)``, identical on every machine and in every process.

Cost: O(1) memory (eight 64-bit keys); one index costs ``ROUNDS`` mixes per encryption and fewer
than 4 encryptions on average (the Feistel domain is smaller than ``4 n``): 8-43M indices/s
through the vectorised :meth:`Permutation.map` in ``python -m benchmarks sampler`` (n = 10**11
and 10**6).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mmpack._src.core.permutation_keys import (
    MAX_N,
    SeedLike,
    epoch_keys,
    feistel_width,
    seed_words,
)
from mmpack._src.core.validation import check_in_range, check_int
from mmpack._src.kernels.permutation import (
    invert,
    invert_many,
    permute,
    permute_many,
    permute_many_keyed,
)

__all__ = ["Permutation"]

_CHUNK = 8192


class Permutation:
    """A keyed pseudo-random bijection of ``range(n)``, evaluated in O(1) memory.

    Parameters
    ----------
    n : int
        Size of the domain, ``0 <= n <= 2**62``.
    seed : int or tuple of int, default 0
        Key material; each int in ``[0, 2**64)``.  Tuples let callers derive independent streams,
        e.g. ``(seed, source_index)``.
    epoch : int, default 0
        Selects one of the ``2**64`` permutations of a seed, ``0 <= epoch < 2**64``.

    Notes
    -----
    ``perm[i]`` is the image of ``i``; ``perm.inverse(j)`` its preimage.  ``perm.map(idx)`` evaluates
    a whole int64 array at once.  The object pickles as its three parameters.
    """

    def __init__(self, n: int, *, seed: SeedLike = 0, epoch: int = 0) -> None:
        n = check_in_range(n, "n", 0, MAX_N, closed=True)
        epoch = check_in_range(epoch, "epoch", 0, 2**64)
        seed_words(seed)  # checked before anything else is computed
        self._n = n
        self._seed = seed
        self._epoch = epoch
        self._half_bits, self._mask = feistel_width(n)
        self._keys = epoch_keys(seed, np.array([epoch], dtype=np.uint64))[0]

    @property
    def n(self) -> int:
        """Size of the domain."""
        return self._n

    @property
    def seed(self) -> SeedLike:
        """The key material given at construction (``seed=``)."""
        return self._seed

    @property
    def epoch(self) -> int:
        """The epoch given at construction."""
        return self._epoch

    @property
    def half_bits(self) -> int:
        """Width of one Feistel half; the network permutes ``range(4 ** half_bits)``."""
        return int(self._half_bits)

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"Permutation(n={self._n}, seed={self._seed!r}, epoch={self._epoch})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Permutation):
            return NotImplemented
        return (self._n, self._keys.tobytes()) == (other._n, other._keys.tobytes())

    def __hash__(self) -> int:
        return hash((self._n, self._keys.tobytes()))

    def __reduce__(self):
        return (_rebuild, (self._n, self._seed, self._epoch))

    def _index(self, i: object, what: str) -> int:
        i = check_int(i, what)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"{what} {i} out of range for a permutation of n={self._n}")
        return i

    def __getitem__(self, i: int) -> int:
        """Image of ``i`` (negative ``i`` counts from the end)."""
        i = self._index(i, "index")
        if self._n == 1:
            return 0
        return int(permute(i, self._n, self._half_bits, self._mask, self._keys))

    def inverse(self, j: int) -> int:
        """Preimage of ``j``: the ``i`` with ``perm[i] == j`` (negative ``j`` counts from the end)."""
        j = self._index(j, "value")
        if self._n == 1:
            return 0
        return int(invert(j, self._n, self._half_bits, self._mask, self._keys))

    def _check_array(self, idx: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(idx)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{what} must be an integer array, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self._n):
            raise IndexError(
                f"{what} must lie in [0, {self._n}), got values in [{int(arr.min())}, {int(arr.max())}]"
            )
        return arr

    def map(self, idx: np.ndarray) -> np.ndarray:
        """Images of an array of indices.

        Parameters
        ----------
        idx : numpy.ndarray, any integer dtype, any shape
            Values in ``[0, n)`` (no negative indexing here).

        Returns
        -------
        numpy.ndarray, int64, same shape as ``idx``
        """
        arr = self._check_array(idx, "idx")
        return self.map_unchecked(arr)

    def inverse_map(self, values: np.ndarray) -> np.ndarray:
        """Preimages of an array of values; int64 array of the same shape (see :meth:`map`)."""
        arr = self._check_array(values, "values")
        out = np.empty_like(arr)
        if self._n == 1:
            out[...] = 0
        elif arr.size:
            invert_many(
                arr.reshape(-1), out.reshape(-1), self._n, self._half_bits, self._mask, self._keys
            )
        return out

    def map_unchecked(self, arr: np.ndarray) -> np.ndarray:
        """:meth:`map` without the argument check, for hot paths (the sampler, ``Mixture``)
        whose callers guarantee a C-contiguous int64 array with values in ``[0, n)``."""
        out = np.empty_like(arr)
        if self._n == 1:
            out[...] = 0
        elif arr.size:
            permute_many(
                arr.reshape(-1), out.reshape(-1), self._n, self._half_bits, self._mask, self._keys
            )
        return out

    def map_keyed(self, idx: np.ndarray, which: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Images of ``idx[i]`` under the permutation of this ``n`` whose round keys are
        ``keys[which[i]]``: many epochs of one seed in one kernel call.

        Parameters
        ----------
        idx, which : numpy.ndarray, int64, shape (m,)
            Values in ``[0, n)``; rows of ``keys`` (both guaranteed by the caller).
        keys : numpy.ndarray, uint64, shape (G, ROUNDS)
            From :func:`mmpack._src.core.permutation_keys.epoch_keys`.

        Returns
        -------
        numpy.ndarray, int64, shape (m,)
        """
        out = np.empty_like(idx)
        if self._n == 1:
            out[...] = 0
        elif idx.size:
            permute_many_keyed(idx, which, out, self._n, self._half_bits, self._mask, keys)
        return out

    def __iter__(self) -> Iterator[int]:
        """Yield ``perm[0], perm[1], ...`` (computed in vectorised chunks)."""
        for start in range(0, self._n, _CHUNK):
            stop = min(start + _CHUNK, self._n)
            yield from self.map_unchecked(np.arange(start, stop, dtype=np.int64)).tolist()


def _rebuild(n: int, seed: SeedLike, epoch: int) -> Permutation:
    return Permutation(n, seed=seed, epoch=epoch)
