"""A plan file's chunks checked on first use: the XXH64 of each chunk of each array of a mapped
plan (:mod:`mmpack._src.packing.plan_file`), compared once, the first time a consumer reads a bin from
it (:class:`~mmpack._src.store.integrity.CheckedPages`, the rule of the store's offsets pages).  Cost:
one XXH64 per chunk (16 MiB, ~1.6 ms) once, then a bitmap lookup per page a read touches.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from mmpack._src.store.integrity import CheckedPages, stripe_digest
from mmpack.errors import FormatError

__all__ = ["PlanPages"]


_PIECE_ARRAYS = ("piece_ref", "piece_len")
_REGION_ARRAYS = ("region_bin", "region_doc", "region_split")


class PlanPages:
    """The chunks of a mapped plan file, each checked against its recorded XXH64 once, on first
    use (a :class:`~mmpack._src.store.integrity.CheckedPages` per array).  The constructor checks the
    region arrays whole (O(n_regions)) and the first and last chunk of the others (O(1)).  A
    bin's split entries are checked with its region's (the entries of one region of 2^25 tokens
    lie in one or two chunks).

    Parameters
    ----------
    path : pathlib.Path
        Named in error messages.
    arrays : dict of str to numpy.ndarray
        The mapped arrays of a plan file (:data:`mmpack._src.packing.plan_file.ARRAYS`), by name.
    digests : dict of str to list of int
        Each array's XXH64 per ``chunk_bytes`` (the last chunk short).
    chunk_bytes : int
        A positive multiple of 8.

    Raises
    ------
    FormatError
        A digest list of the wrong length, or a chunk checked now that fails its digest.
    """

    def __init__(
        self,
        path: Path,
        arrays: dict[str, np.ndarray],
        digests: dict[str, list[int]],
        chunk_bytes: int,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % 8:
            raise FormatError(f"{path}: plan chunk_bytes {chunk_bytes} is not a multiple of 8")
        self._path, self._arrays, self._digests = path, arrays, digests
        self._chunk = chunk_bytes
        self._pages = {}
        for name, arr in arrays.items():
            # the check holds the arrays, never this object: no cycle keeps the mapping alive
            check = partial(_check_chunk, path, name, arr, digests[name], chunk_bytes)
            pages = CheckedPages(arr.shape[0], chunk_bytes // arr.itemsize, check)
            if len(digests[name]) != pages.n_pages:
                raise FormatError(f"{path}: plan array {name!r} has the wrong number of digests")
            self._pages[name] = pages
        self._bins = self._pages["bin_ptr"]
        self._pieces = [self._pages[name] for name in _PIECE_ARRAYS]
        self._split = self._pages["split"]
        self._split_top = arrays["split"].shape[0] - 1
        self._n_pieces = arrays["piece_ref"].shape[0]
        for name in _REGION_ARRAYS:
            self._pages[name].check_all()
        for pages in self._pages.values():
            if pages.n_pages:
                pages.check_page(0)
                pages.check_page(pages.n_pages - 1)

    def all_checked(self) -> bool:
        return all(pages.all_checked() for pages in self._pages.values())

    def check_all(self) -> None:
        """Check every chunk not checked yet."""
        for pages in self._pages.values():
            pages.check_all()

    def check_bins(self, idx: np.ndarray) -> None:
        """Check (once) the chunks of ``bin_ptr[b : b + 2]`` and of bin ``b``'s pieces and split
        entries, for every bin ``b`` of ``idx`` (int64, shape (k,), in range)."""
        if not idx.size:
            return
        self._bins.check_ranges(idx, idx + 1)
        bin_ptr = self._arrays["bin_ptr"]
        lo = bin_ptr[idx]
        hi = np.minimum(bin_ptr[idx + 1], self._n_pieces) - 1
        for pages in self._pieces:
            pages.check_ranges(lo, hi)
        self._check_split(idx)

    def _check_split(self, idx: np.ndarray) -> None:
        """Check (once) the split entries of the regions of bins ``idx``."""
        if self._split.all_checked():
            return
        region_bin, region_split = self._arrays["region_bin"], self._arrays["region_split"]
        r = np.unique(np.searchsorted(region_bin, idx, side="right") - 1)
        r = r[(r >= 0) & (r < region_split.shape[0] - 1)]
        lo, hi = 2 * region_split[r], 2 * region_split[r + 1] - 1
        some = hi >= lo
        if some.any():
            self._split.check_ranges(lo[some], np.minimum(hi[some], self._split_top))


def _check_chunk(
    path: Path, name: str, arr: np.ndarray, digests: list[int], chunk_bytes: int, p: int
) -> None:
    """Check chunk ``p`` of plan array ``name`` against its XXH64 digest."""
    per = chunk_bytes // arr.itemsize
    got = stripe_digest(arr[p * per : (p + 1) * per])
    if got != digests[p]:
        lo = p * chunk_bytes
        hi = lo + arr[p * per : (p + 1) * per].nbytes
        raise FormatError(
            f"{path}: plan array {name!r} chunk {p} (bytes {lo}..{hi} of the array) "
            "fails its checksum (xxh64; damaged file)"
        )
