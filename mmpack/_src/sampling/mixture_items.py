"""Occurrence -> item of the sources of a :class:`~mmpack.Mixture` (without
``block_bytes``): occurrence ``o`` of source ``k`` is item
``Permutation(len_k, seed=(seed, k), epoch=o // len_k)[o % len_k]``, every pass its own keyed
permutation.  Cost: O(m) per batch of ``m`` draws, one kernel call per source and batch (also
when the batch spans several passes: their round keys are derived at once); a few permutations
are cached.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.core.permutation_keys import epoch_keys
from mmpack._src.sampling.permutation import Permutation

__all__ = ["SourcePasses"]

_PERM_CACHE = 64


class SourcePasses:
    """The keyed passes over a mixture's sources.

    Parameters
    ----------
    lengths : numpy.ndarray, int64, shape (K,)
    seed : int
    """

    def __init__(self, lengths: np.ndarray, seed: int) -> None:
        self._lengths = lengths
        self._seed = seed
        self._perms: dict[tuple[int, int], Permutation] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_lengths": self._lengths, "_seed": self._seed, "_perms": {}}

    def permutation(self, k: int, rep: int) -> Permutation:
        """The permutation of pass ``rep`` over source ``k``."""
        perm = self._perms.get((k, rep))
        if perm is None:
            if len(self._perms) >= _PERM_CACHE:
                self._perms.clear()
            perm = self._perms[(k, rep)] = Permutation(
                int(self._lengths[k]), seed=(self._seed, k), epoch=rep
            )
        return perm

    def items(self, src: np.ndarray, occ: np.ndarray) -> np.ndarray:
        """Item numbers of draws ``occ`` of sources ``src`` (int64 arrays of shape (m,))."""
        lengths = self._lengths[src]
        rep = occ // lengths
        pos = occ - rep * lengths
        out = np.empty_like(occ)
        if occ.size == 0:
            return out
        for k in np.unique(src).tolist():
            where = np.flatnonzero(src == k)
            reps, at = rep[where], pos[where]
            first, last = int(reps.min()), int(reps.max())
            if first == last:  # the usual case: the batch stays inside one pass over source k
                out[where] = self.permutation(k, first).map_unchecked(at)
                continue
            # several passes: derive every pass's round keys at once, one kernel call
            passes, inverse = np.unique(reps, return_inverse=True)
            keys = epoch_keys((self._seed, k), passes)
            perm = self.permutation(k, first)
            out[where] = perm.map_keyed(at, inverse.reshape(-1).astype(np.int64), keys)
        return out
