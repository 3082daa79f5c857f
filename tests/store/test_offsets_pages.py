"""A store's offsets pages (mmpack._src.store.offsets_pages): each page made present, then
checked, once, on first use; searches and slices through PagedOffsets check only the pages
they read; a decrease across two pages' edge is caught once both are checked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpack._src.store.offsets_pages import OffsetsPages, PagedOffsets
from mmpack.errors import FormatError

PAGE = 8  # entries (64-byte stripes)


def _meta(offsets: np.ndarray) -> SimpleNamespace:
    n = offsets.shape[0] - 1
    return SimpleNamespace(num_docs=n, num_tokens=int(offsets[-1]), block_bytes=PAGE * 8)


class Lazy:
    """Offsets whose pages read as zeros until ``load`` copies them in (a lazy backend)."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.want = offsets
        self.array = np.zeros_like(offsets)
        self.loads: list[int] = []

    def load(self, first: int, stop: int) -> None:
        for p in range(first, stop):
            if p not in self.loads:
                self.loads.append(p)
                self.array[p * PAGE : (p + 1) * PAGE] = self.want[p * PAGE : (p + 1) * PAGE]


def _pages(offsets: np.ndarray) -> tuple[OffsetsPages, Lazy]:
    lazy = Lazy(offsets)
    return OffsetsPages(Path("s"), _meta(offsets), lazy.array, None, lazy.load), lazy


def _offsets(lens) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(lens, np.int64))]).astype(np.int64)


def test_open_loads_the_ends_pages_only_and_reads_check_theirs_once():
    offsets = _offsets(np.arange(60) % 7)
    pages, lazy = _pages(offsets)
    assert sorted(lazy.loads) == [0, 7] and not pages.all_checked()
    pages.check_entries(20, 26)  # pages 2 and 3
    assert sorted(lazy.loads) == [0, 2, 3, 7]
    np.testing.assert_array_equal(lazy.array[16:32], offsets[16:32])
    pages.check_all()
    assert pages.all_checked() and sorted(lazy.loads) == list(range(8))
    np.testing.assert_array_equal(lazy.array, offsets)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=70),
    st.lists(st.integers(-2, 200), min_size=1, max_size=6),
    st.sampled_from(["left", "right"]),
)
def test_search_is_searchsorted_and_checks_only_the_pages_it_probes(lens, values, side):
    offsets = _offsets(lens)
    pages, lazy = _pages(offsets)
    n_pages = -(-offsets.shape[0] // PAGE)
    for v in values:
        assert pages.search(v, side) == int(np.searchsorted(offsets, v, side=side))
    # a binary search over the pages' first entries, then one page (and the next one's first)
    bound = 2 + len(values) * (int(np.ceil(np.log2(max(n_pages, 1)))) + 2)
    assert len(lazy.loads) <= min(n_pages, bound)


def test_a_search_does_not_read_pages_it_did_not_check():
    offsets = _offsets(np.full(400, 3))  # 401 entries: 51 pages
    pages, lazy = _pages(offsets)
    # unchecked pages read as zeros: searching the raw array answers wrongly
    assert int(np.searchsorted(lazy.array, 600)) != 200
    assert pages.search(600) == 200 and pages.search(600, "right") == 201
    assert len(lazy.loads) <= 2 + 2 * 8


def test_paged_offsets_index_and_slice_through_checked_pages():
    offsets = _offsets(np.arange(1, 61))
    pages, lazy = _pages(offsets)
    view = PagedOffsets(pages, lazy.array)
    assert view.shape == offsets.shape and len(view) == 61
    assert int(view[30]) == int(offsets[30]) and int(view[-1]) == int(offsets[-1])
    np.testing.assert_array_equal(view[41:50], offsets[41:50])
    assert sorted(lazy.loads) == [0, 3, 5, 6, 7]
    np.testing.assert_array_equal(view[::7], offsets[::7])  # a strided slice: every page
    assert sorted(lazy.loads) == list(range(8))
    assert view.searchsorted(offsets[12]) == 12


def test_a_decrease_across_an_edge_is_caught_when_both_pages_are_checked():
    offsets = _offsets(np.full(40, 2))
    offsets[24] = offsets[23] - 1  # page 3's first entry below page 2's last
    offsets[25:] -= 2  # the rest stays increasing: only the edge decreases
    pages, _ = _pages(offsets)
    pages.check_entries(26, 30)  # page 3 alone: its own entries increase
    with pytest.raises(FormatError, match="offsets decrease at document 23"):
        pages.check_entries(20, 22)  # page 2, whose neighbour 3 is checked: the edge
    other, _ = _pages(offsets)
    other.check_entries(20, 22)
    with pytest.raises(FormatError, match="offsets decrease at document 23"):
        other.check_entries(26, 30)  # the other order
    last, _ = _pages(offsets)
    with pytest.raises(FormatError, match="offsets decrease at document 23"):
        last.check_all()


def test_a_page_whose_load_fails_stays_unchecked():
    offsets = _offsets(np.full(40, 2))
    lazy = Lazy(offsets)
    fail = {3}

    def load(first: int, stop: int) -> None:
        if set(range(first, stop)) & fail:
            raise FormatError("offsets stripe 3 fails its checksum")
        lazy.load(first, stop)

    pages = OffsetsPages(Path("s"), _meta(offsets), lazy.array, None, load)
    with pytest.raises(FormatError, match="stripe 3"):
        pages.check_entries(25, 26)
    with pytest.raises(FormatError, match="stripe 3"):
        pages.check_entries(25, 26)  # again: nothing was marked
    fail.clear()
    pages.check_entries(25, 26)
    assert 3 in lazy.loads
