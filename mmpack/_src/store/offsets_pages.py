"""A store's offsets checked page by page on first use, and searched through the pages only.

:class:`OffsetsPages` is the store's one rule for its index (a :class:`CheckedPages` of pages
of ``block_bytes // 8`` entries, the offsets' checksum stripes): a page is made present (a
backend that fills its offsets lazily fetches the stripe and checks its CRC-32:
:meth:`~mmpack._src.store.backends.Backend.load_offsets`), then checked never to decrease,
across its edges with the neighbours already checked too, and with ``verify_reads`` against its
block digest.  Opening checks the ends and the first and last pages (O(1)); a read checks the
pages it uses, once (then one bitmap lookup per page); ``check_all`` checks the rest in one pass.
:class:`PagedOffsets` gives binary searches the offsets without the whole index: a search of
one value checks about ``log2(pages)`` pages (the pages' first entries, then one page).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.store.format import STRIPE_BYTES, StoreMeta
from mmpack._src.store.integrity import (
    CheckedPages,
    StripeChecker,
    _check_ends,
    _first_decrease,
    _raise_decrease,
)

__all__ = ["OffsetsPages", "PagedOffsets"]


class OffsetsPages:
    """The offsets of one store, checked page by page on first use (:class:`CheckedPages`).

    A page is one checksum block of the offsets (``meta.block_bytes // 8`` entries); checking
    page ``p`` first makes it present (``load``: a backend that fills its offsets lazily
    fetches the stripe and checks its CRC-32 there), then checks that its entries never
    decrease, also across its edge with each neighbour already checked (so all pages checked
    means the whole index never decreases), and, with ``blocks``, the page's block digest.  The
    constructor checks the ends and pages 0 and last (O(1) whatever the store's size);
    :meth:`check_entries` checks the pages a read uses (a bitmap lookup once they are
    checked); :meth:`search` finds entries checking only the pages it probes; :meth:`check_all`
    the rest.

    Parameters
    ----------
    path : Path
        Named in error messages.
    meta : StoreMeta
    offsets : numpy.ndarray, int64, shape (num_docs + 1,)
        The mapped offsets (not read beyond the pages checked).
    blocks : StripeChecker, optional
        Checks each page's block digest (``verify_reads``); None checks the structure only.
    load : callable, optional
        ``load(first, stop)`` makes pages ``[first, stop)`` present (the backend's
        :meth:`~mmpack._src.store.backends.Backend.load_offsets`); None: they all are.
    """

    def __init__(
        self,
        path: Path,
        meta: StoreMeta,
        offsets: np.ndarray,
        blocks: StripeChecker | None,
        load: Callable[[int, int], None] | None = None,
    ) -> None:
        self._path = path
        self._offsets = offsets
        self._blocks = blocks
        self._load = load
        page = max(1, getattr(meta, "block_bytes", STRIPE_BYTES) // 8)
        n_pages = -(-int(offsets.shape[0]) // page)
        if load is not None and offsets.shape == (meta.num_docs + 1,):
            load(0, 1)  # the ends' pages, before the ends are read
            load(n_pages - 1, n_pages)
        _check_ends(offsets, meta, path)
        # The check holds the arrays, never this object: no reference cycle keeps the mapping
        # alive past the store (a join of 10^4 parts maps 2 files a part).
        checked = np.zeros(n_pages, dtype=bool)
        check = functools.partial(_check_offsets_page, path, offsets, blocks, page, load, checked)
        self._pages = CheckedPages(offsets.shape[0], page, check, checked)
        self._pages.check_page(0)
        self._pages.check_page(self._pages.n_pages - 1)

    @property
    def page_entries(self) -> int:
        """Entries per page."""
        return self._pages.page_entries

    def all_checked(self) -> bool:
        return self._pages.all_checked()

    def check_entries(self, lo: int, hi: int) -> None:
        """Check (once) the pages holding entries ``[lo, hi]`` (ints, ``0 <= lo <= hi <=
        num_docs``): what a read of documents ``lo..hi-1`` uses."""
        self._pages.check_entries(lo, hi)

    def search(self, value: int, side: str = "left") -> int:
        """``numpy.searchsorted(offsets, value, side)`` for one int ``value``, checking (once)
        only the pages it probes: a binary search over the pages' first entries (about
        ``log2(pages)`` pages), then within the page found."""
        offsets, pages, step = self._offsets, self._pages, self._pages.page_entries
        lo, hi = 0, pages.n_pages - 1  # the answer lies in pages lo..hi (or is the end)
        while lo < hi:  # the last page whose first entry is before value (side)
            mid = (lo + hi + 1) // 2
            pages.check_page(mid)
            first = int(offsets[mid * step])
            if first < value or (side == "right" and first == value):
                lo = mid
            else:
                hi = mid - 1
        pages.check_page(lo)
        seg = offsets[lo * step : (lo + 1) * step]
        at = lo * step + int(np.searchsorted(seg, value, side=side))  # type: ignore[call-overload]
        if at == (lo + 1) * step and at < offsets.shape[0]:
            pages.check_page(lo + 1)  # the answer is the next page's first entry
        return at

    def check_all(self) -> None:
        """Check every page not checked yet (each one made present first; then one pass over
        the offsets, numba above 4M entries; with ``checksums``, each unchecked page's block
        digest)."""
        pages = self._pages
        if pages.all_checked():
            return
        if self._load is not None:
            self._load(0, pages.n_pages)
        _raise_decrease(self._offsets, _first_decrease(self._offsets), 0, self._path)
        if self._blocks is not None:
            for p in pages.unchecked():
                self._blocks.check_block("offsets", p)
        pages.mark_all()


def _check_offsets_page(
    path: Path,
    offsets: np.ndarray,
    blocks: StripeChecker | None,
    page: int,
    load: Callable[[int, int], None] | None,
    checked: np.ndarray,
    p: int,
) -> None:
    """Check page ``p`` of ``offsets`` (``page`` entries a page), made present first by
    ``load``: its entries never decrease, nor across its edge with a neighbour already
    ``checked``; with ``blocks``, its block digest."""
    if load is not None:
        load(p, p + 1)
    lo = p * page - (1 if p > 0 and checked[p - 1] else 0)
    hi = min(offsets.shape[0], (p + 1) * page)
    if p + 1 < checked.shape[0] and checked[p + 1]:
        hi += 1  # the next page's first entry: that edge is checked too
    seg = offsets[lo:hi]
    bad = np.flatnonzero(seg[1:] < seg[:-1])
    _raise_decrease(offsets, int(bad[0]) if bad.size else -1, lo, path)
    if blocks is not None:
        blocks.check_block("offsets", p)


class PagedOffsets:
    """A store's offsets for searches and slices that check the pages they read, once: what
    :meth:`~mmpack.TokenStore.paged_offsets` gives a binary search (``searchsorted`` of one
    value: :meth:`OffsetsPages.search`; an int index or a slice: its pages checked first)."""

    def __init__(self, pages: OffsetsPages, offsets: np.ndarray) -> None:
        self._pages, self._offsets = pages, offsets
        self.shape = offsets.shape

    def __len__(self) -> int:
        return int(self.shape[0])

    def searchsorted(self, value: Any, side: str = "left") -> int:
        return self._pages.search(int(value), side)

    def __getitem__(self, key: Any) -> Any:
        n = int(self.shape[0])
        if isinstance(key, slice):
            lo, hi, step = key.indices(n)
            if step == 1 and hi > lo:
                self._pages.check_entries(lo, hi - 1)
            elif hi > lo:
                self._pages.check_all()
        else:
            k = int(key) + (n if int(key) < 0 else 0)
            if 0 <= k < n:
                self._pages.check_entries(k, k)
        return self._offsets[key]
