"""Region cuts (mmpack._src.packing.region_cuts) against slow, obviously right twins: the
edges of any slot range, the slack the probes measure and its cap, the blocks of whole regions."""

from __future__ import annotations

import numpy as np
from _plans import ref_regions, ref_slack
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.packing.region_cuts import edge_slack, region_blocks, region_edges, region_slack


def ref_region_blocks(region_bin, region_doc, offsets, itemsize, block_bytes):
    """Greedy blocks of whole regions, one region at a time."""
    bounds, start = [0], 0
    for r in range(1, len(region_bin) - 1):
        if (offsets[region_doc[r + 1]] - offsets[region_doc[start]]) * itemsize > block_bytes:
            bounds.append(region_bin[r])
            start = r
    bounds.append(region_bin[-1])
    return [b for i, b in enumerate(bounds) if i == 0 or b > bounds[i - 1]]


@given(
    st.lists(st.integers(0, 50), max_size=60),
    st.integers(1, 400),
    st.one_of(st.integers(1, 64), st.integers(6000, 40000)),  # either side of 5 S / 32 > 1024
    st.integers(0, 1),
    st.data(),
)
def test_region_edges_of_any_slot_range_are_the_reference_cut_there(lens, r_tokens, s, eot, data):
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    whole = region_edges(offsets, r_tokens, s, eot)
    assert whole.tolist() == ref_regions(lens, r_tokens, s, eot)
    k = max(1, -(-int(offsets[-1]) // r_tokens))
    lo = data.draw(st.integers(0, k))
    hi = data.draw(st.integers(lo, k))
    part = region_edges(offsets, r_tokens, s, eot, lo, hi).tolist()
    # The slots' edges, empty slots removed: consecutive ranges join into the whole cut.
    mid = region_edges(offsets, r_tokens, s, eot, 0, lo).tolist()
    rest = region_edges(offsets, r_tokens, s, eot, hi, k).tolist()
    assert mid[-1] == part[0] and part[-1] == rest[0]
    assert mid + part[1:] + rest[1:] == whole.tolist()


@given(
    st.lists(st.integers(0, 200), max_size=200),
    st.integers(150, 400),  # a third of the cases get a slack under the cap
    st.integers(1000, 8000),
    st.integers(0, 1),
)
def test_region_slack_is_the_reference_probes_best_fit_gaps(lens, s, r_tokens, eot):
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    assert region_slack(offsets, r_tokens, s, eot) == ref_slack(lens, r_tokens, s, eot)


def test_edge_slack_is_at_most_two_fifths_then_1024_then_five_32nds_of_a_bin():
    """At seqlen 8192 best fit's gaps in a region of 2048 bins of long documents add up to
    300-1300 slots: a cap of 1024 took a bin more in most such regions."""
    assert [edge_slack(s) for s in (1, 2048, 2560, 4096, 6553, 8192, 16384)] == [
        0,
        819,
        1024,
        1024,
        1024,
        1280,
        2560,
    ]


def test_regions_leave_the_free_slots_their_probes_measure():
    """Every inner region's slots end about region_slack under a multiple of seqlen (give or
    take the search's granularity), far under the cap when best fit leaves small gaps."""
    rng = np.random.default_rng(0)
    lens = np.maximum(1, rng.lognormal(6.4, 1.3, 40_000)).astype(np.int64)
    s, r_tokens = 8192, 64 * 8192
    offsets = np.concatenate([[0], np.cumsum(lens)])
    sigma = region_slack(offsets, r_tokens, s, 1)
    assert 0 < sigma < edge_slack(s)
    edges = region_edges(offsets, r_tokens, s, 1)
    assert edges.tolist() == region_edges(offsets, r_tokens, s, 1, slack=sigma).tolist()
    slots = offsets + np.arange(offsets.shape[0])
    free = (-np.diff(slots[edges[:-1]])) % s  # each inner region's free slots in its last bin
    assert len(free) > 50
    assert abs(float(np.median(free)) - sigma) < 100


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), max_size=30),
    st.integers(1, 4),
    st.integers(1, 200),
)
def test_region_blocks_match_the_greedy_reference(regions, itemsize, block_bytes):
    docs = [d for d, _ in regions]
    region_doc = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
    region_bin = np.concatenate([[0], np.cumsum([b for _, b in regions])]).astype(np.int64)
    lens = np.random.default_rng(len(regions)).integers(0, 9, int(region_doc[-1]))
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    got = region_blocks(region_bin, region_doc, offsets, itemsize, block_bytes)
    assert got.dtype == np.int64
    want = ref_region_blocks(
        region_bin.tolist(), region_doc.tolist(), offsets, itemsize, block_bytes
    )
    assert got.tolist() == want
    assert got[0] == 0 and got[-1] == region_bin[-1] and np.all(np.diff(got) > 0)
    assert set(got.tolist()) <= set(region_bin.tolist())  # blocks follow region edges
