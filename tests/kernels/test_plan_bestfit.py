"""The best-fit tree of the plan kernels (mmpack._src.kernels.plan_bestfit): count of trailing
zeros and the bitset tree's successor search, against plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.kernels import plan_bestfit


def ref_ctz(v):
    return (v & -v).bit_length() - 1


@given(st.integers(1, 2**64 - 1))
def test_ctz(v):
    assert plan_bestfit._ctz(np.uint64(v)) == ref_ctz(v)


@given(st.integers(1, 300_000), st.lists(st.integers(0, 299_999), max_size=40), st.data())
def test_bitset_tree_successor(universe, members, data):
    members = {m for m in members if m < universe}
    bits, off = plan_bestfit._tree_new(universe)
    for m in members:
        plan_bestfit._tree_set(bits, off, m)
    removed = (
        set(data.draw(st.lists(st.sampled_from(sorted(members)), max_size=5))) if members else set()
    )
    for m in removed:
        plan_bestfit._tree_clear(bits, off, m)
    live = sorted(members - removed)
    for x in data.draw(st.lists(st.integers(0, universe + 70), max_size=20)) + [0, universe - 1]:
        expect = next((m for m in live if m >= x), -1)
        assert plan_bestfit._tree_succ(bits, off, x) == expect
