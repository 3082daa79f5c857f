"""Mixtures that keep their sources' locality: passes over source blocks, and the mixture's blocks.

A :class:`~mmpack.Mixture` built with ``block_bytes=B`` asks each source of
positive weight for ``source.block_bounds(B)`` (blocks of consecutive items that read one
contiguous byte span).  Pass ``p`` over source ``k`` (its occurrences ``p len_k .. (p + 1) len_k -
1``) visits the source's blocks in the order of ``Permutation(n_blocks_k, seed=(seed, k),
epoch=p)``, the items of each block in order: consecutive draws of a source read consecutive
items, and a source only partly used draws whole blocks chosen at random.

A *mixture block* is a run of consecutive mixture positions in which no source crosses the start
of one of its blocks: the mixture's bounds are the positions of every draw that starts a source
block (of every source, every pass), with 0 and ``len(mixture)``.  Positions are dealt to the
sources by the chairman sequence, so a run of positions holds consecutive draws of each source;
a mixture block therefore reads, in each source, one contiguous span inside one of that source's
blocks: at most ``K`` spans (one per source) of at most ``B`` bytes each, and about ``q_k`` of its
samples from source ``k``.  The sampler's block-window order over these bounds keeps every
source's reads local.

Cost: a pass's layout (the permuted blocks and their cumulative sizes, 16 bytes per block) is
built in O(n_blocks_k) when first needed and a few are cached; an item lookup is a binary search
in it.  The mixture's bounds take O(source blocks drawn) time and memory, plus the positions of
each source inside one period of the chairman sequence (at most the period, 8 bytes each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack._src.core.validation import check_block_bounds, check_positive_int
from mmpack._src.sampling.permutation import Permutation

__all__ = ["BlockPasses", "mixture_bounds"]

_LAYOUTS_KEPT = 64


class BlockPasses:
    """Occurrence -> item of the sources of a mixture built with ``block_bytes``.

    Parameters
    ----------
    sources : sequence of datasets
        Each source of positive quota has ``block_bounds(block_bytes)``.
    lengths, quotas : numpy.ndarray, int64, shape (K,)
    block_bytes : int
    seed : int
    """

    def __init__(
        self,
        sources: Sequence[Any],
        lengths: np.ndarray,
        quotas: np.ndarray,
        block_bytes: int,
        seed: int,
    ) -> None:
        self.block_bytes = check_positive_int(block_bytes, "block_bytes")
        self._seed = seed
        self.bounds: list[np.ndarray | None] = []
        for k, source in enumerate(sources):
            if quotas[k] == 0 or lengths[k] == 0:
                self.bounds.append(None)
                continue
            method = getattr(source, "block_bounds", None)
            if method is None:
                raise TypeError(
                    f"Mixture(block_bytes={block_bytes}) needs sources with block_bounds(); "
                    f"source {k} ({type(source).__name__}) has none"
                )
            name = f"sources[{k}].block_bounds({block_bytes})"
            self.bounds.append(check_block_bounds(method(block_bytes), int(lengths[k]), name))
        self._layouts: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_layouts"] = {}
        return state

    def layout(self, k: int, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Pass ``p`` over source ``k``: its blocks in visiting order (int64, (B_k,)) and the
        pass offset of each block's first item, then ``len_k`` (int64, (B_k + 1,))."""
        got = self._layouts.get((k, p))
        if got is None:
            bounds = self.bounds[k]
            assert bounds is not None
            nb = bounds.shape[0] - 1
            perm = Permutation(nb, seed=(self._seed, k), epoch=p)
            blocks = perm.map_unchecked(np.arange(nb, dtype=np.int64))
            cum = np.zeros(nb + 1, dtype=np.int64)
            np.cumsum(bounds[blocks + 1] - bounds[blocks], out=cum[1:])
            if len(self._layouts) >= _LAYOUTS_KEPT:
                self._layouts.clear()
            got = self._layouts[(k, p)] = (blocks, cum)
        return got

    def items(self, src: np.ndarray, occ: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Item numbers of draws ``occ`` (int64, (m,)) of sources ``src`` (int64, (m,))."""
        out = np.empty_like(occ)
        if occ.size == 0:
            return out
        length = lengths[src]
        passes = occ // length
        at = occ - passes * length
        key = np.stack([src, passes], axis=1)
        groups, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for g, (k, p) in enumerate(groups.tolist()):
            where = np.flatnonzero(inverse == g) if groups.shape[0] > 1 else slice(None)
            blocks, cum = self.layout(k, p)
            r = at[where]
            j = np.searchsorted(cum, r, side="right") - 1
            bounds = self.bounds[k]
            assert bounds is not None
            out[where] = bounds[blocks[j]] + (r - cum[j])
        return out


def mixture_bounds(
    passes: BlockPasses,
    lengths: np.ndarray,
    counts: np.ndarray,
    positions_of: Any,
    n: int,
) -> np.ndarray:
    """Bounds of the mixture's blocks (see the module docstring).

    Parameters
    ----------
    lengths, counts : numpy.ndarray, int64, shape (K,)
        Source lengths; draws of each source in the mixture.
    positions_of : callable
        ``positions_of(k, occ)``: mixture positions (int64) of draws ``occ`` of source ``k``.
    n : int
        Length of the mixture.

    Returns
    -------
    numpy.ndarray, int64, shape (n_blocks + 1,)
    """
    cuts = [np.array([0, n], dtype=np.int64)]
    for k, bounds in enumerate(passes.bounds):
        count = int(counts[k])
        if bounds is None or count == 0:
            continue
        length = int(lengths[k])
        for p in range(-(-count // length)):
            starts = passes.layout(k, p)[1][:-1] + p * length
            starts = starts[starts < count]
            cuts.append(positions_of(k, starts))
    return np.unique(np.concatenate(cuts))
