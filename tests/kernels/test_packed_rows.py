"""The packed-row kernels (mmpack._src.kernels.packed_rows) against their slow Python twin.

:func:`one_bin` (the single-sample path) and :func:`select_pieces` + :func:`fill_rows` (the
batch path) are compared with :func:`twin_bin`, a plain-Python spelling of the contract, on
random documents and random plans -- corrupt ones included (pieces outside their document,
bins over ``seqlen``, a ``bin_ptr`` out of range or decreasing) -- for every label mode, with
and without eot, int64 and int32 outputs, and ``cu_seqlens`` in its own array or in the tail of
an int32 output (``cu_at``).  Rerun with ``NUMBA_BOUNDSCHECK=1`` by ``make test``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import encoded, twin_bin

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack._src.kernels.packed_rows import (
    LABELS_HF,
    LABELS_NEXT,
    LABELS_NONE,
    SPLIT_FLAG,
    one_bin,
)

IGNORE = -100


@st.composite
def cases(draw):
    doc = st.lists(st.integers(0, 60000), min_size=draw(st.sampled_from([0, 1, 3])), max_size=9)
    docs = draw(st.lists(doc, min_size=1, max_size=8))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    src = np.array([t for d in docs for t in d], dtype=np.uint16)
    seqlen = draw(st.integers(1, 16))
    corrupt = draw(st.integers(0, 3)) == 0
    wild = st.integers(-3, 30) if corrupt else None
    pieces = []
    for _ in range(draw(st.integers(0, 8))):
        d = draw(st.integers(0, len(docs) - 1) if wild is None else wild)
        dl = len(docs[d]) if 0 <= d < len(docs) else 0
        s = draw(st.sampled_from([0, 0, dl // 2, dl]) if wild is None else wild)
        n = draw(st.sampled_from([dl - s, dl - s, max(dl - s - 1, 0), 0]) if wild is None else wild)
        pieces.append((d, s, n))
    cuts = sorted(draw(st.lists(st.integers(0, len(pieces)), max_size=5)))
    bin_ptr = [0, *cuts, len(pieces)]
    if corrupt and draw(st.booleans()):
        bin_ptr = draw(st.lists(st.integers(-2, len(pieces) + 2), min_size=1, max_size=6))
    arr = np.array(pieces, dtype=np.int64).reshape(-1, 3)
    plan = (
        np.array(bin_ptr, dtype=np.int64),
        np.ascontiguousarray(arr[:, 0]),
        np.ascontiguousarray(arr[:, 1]),
        np.ascontiguousarray(arr[:, 2]).astype(np.int32),
    )
    eot = draw(st.booleans())
    mode = draw(st.sampled_from([LABELS_NONE, LABELS_NEXT, LABELS_HF]))
    params = [seqlen, int(eot), draw(st.integers(0, 70000)), draw(st.integers(0, 70000)), mode]
    return plan, offsets, src, params


@settings(max_examples=300, deadline=None)
@given(case=cases(), dtype=st.sampled_from([np.int64, np.int32]), data=st.data())
def test_one_bin_matches_its_twin(case, dtype, data):
    plan, offsets, src, params = case
    seqlen = params[0]
    n_bins = len(plan[0]) - 1
    b = data.draw(st.one_of(st.integers(0, max(n_bins - 1, 0)), st.integers(-1, n_bins + 1)))
    room = data.draw(st.one_of(st.just(12), st.integers(0, 12)))  # cu_seqlens entries
    in_out = dtype == np.int32 and data.draw(st.booleans())
    if in_out:  # cu_seqlens in the tail of the output, as PackedDataset does for int32
        out = np.full(4 * seqlen + room, 77, dtype=dtype)
        cu_arr, cu_at = out, 4 * seqlen
    else:
        out = np.full(4 * seqlen, 77, dtype=dtype)
        cu_at = data.draw(st.integers(0, 3))
        cu_arr = np.full(cu_at + room, 77, dtype=np.int32)
    p = np.array([*params, cu_at, IGNORE_INDEX], dtype=np.int64)
    code, want = twin_bin(*plan, offsets, src, b, p, room)
    got = one_bin(*encoded(plan, regions=1 + b % 3), offsets, src, b, p, out, cu_arr)
    assert tuple(got) == code
    if want is None:
        assert (out[: 4 * seqlen] == 77).all()  # nothing written to the rows
        return
    ids, pos, lab, att, cu = want
    rows = out[: 4 * seqlen].reshape(4, seqlen)
    assert [r.tolist() for r in rows] == [ids, pos, lab, att]
    assert cu_arr[cu_at : cu_at + len(cu)].tolist() == cu


# select_pieces + fill_rows over a batch of bins against the twin: tests/reference.py
# ("packed_rows.fill_rows"), run by tests/test_reference.py.


def test_worked_example():
    """One document [5, 6] and eot 99 in an 8-slot bin, every label mode."""
    plan = (np.array([0, 1]), np.array([0]), np.array([0]), np.array([2], dtype=np.int32))
    offsets, src = np.array([0, 2]), np.array([5, 6], dtype=np.uint16)
    want = {
        LABELS_NEXT: [6, 99, -100, -100, -100, -100, -100, -100],
        LABELS_HF: [-100, 6, 99, -100, -100, -100, -100, -100],
        LABELS_NONE: [-100] * 8,
    }
    for mode, labels in want.items():
        out, cu = np.zeros(32, dtype=np.int64), np.zeros(4, dtype=np.int32)
        got = one_bin(
            *encoded(plan), offsets, src, 0, np.array([8, 1, 99, 0, mode, 0, IGNORE_INDEX]), out, cu
        )
        assert tuple(got) == (2, 5) and cu[:3].tolist() == [0, 3, 8]
        assert out.reshape(4, 8).tolist() == [
            [5, 6, 99, 0, 0, 0, 0, 0],
            [0, 1, 2, 0, 1, 2, 3, 4],
            labels,
            [1, 1, 1, 0, 0, 0, 0, 0],
        ]


def test_the_label_without_loss_is_the_callers():
    """The kernels write the caller's ``ignore`` (a value frozen into a kernel from another
    module would not follow an edit there: numba's cache does not see it)."""
    plan = (np.array([0, 1]), np.array([0]), np.array([0]), np.array([2], dtype=np.int32))
    offsets, src = np.array([0, 2]), np.array([5, 6], dtype=np.uint16)
    out, cu = np.zeros(32, dtype=np.int64), np.zeros(4, dtype=np.int32)
    one_bin(*encoded(plan), offsets, src, 0, np.array([8, 1, 99, 0, LABELS_NEXT, 0, -7]), out, cu)
    assert out.reshape(4, 8)[2].tolist() == [6, 99, -7, -7, -7, -7, -7, -7]


def _all_split(plan, shift):
    """Every piece of ``plan`` (one region) as a split entry, its start moved by ``shift``."""
    assert plan.n_regions == 1 and plan.region_doc[0] == 0
    n = plan.n_pieces
    return {
        "piece_ref": (SPLIT_FLAG + np.arange(n)).astype(np.uint32),
        "split": np.stack([plan.piece_doc, plan.piece_start + shift], axis=1).reshape(-1),
        "region_split": np.array([0, n], dtype=np.int64),
    }


_CORRUPTIONS = {
    "doc past the store": lambda p: {"piece_ref": p.piece_ref + 50},
    "negative doc": lambda p: {"region_doc": p.region_doc - 50},
    "start past its document": lambda p: _all_split(p, 1000),
    "split entry past the table": lambda p: {"piece_ref": p.piece_ref + SPLIT_FLAG},
    "bin longer than seqlen": lambda p: {"piece_len": (p.piece_len + 3).astype(np.int32)},
    "decreasing bin_ptr": lambda p: {"bin_ptr": p.bin_ptr[::-1].copy()},
    "bin_ptr past the pieces": lambda p: {"bin_ptr": p.bin_ptr * 100},
}


@pytest.mark.parametrize("corruption", sorted(_CORRUPTIONS))
def test_locate_refuses_a_corrupt_plan_as_reads_do(tmp_path, corruption):
    """``locate(i)`` lists a bin's pieces by the rule its reads check them with: a bin of a
    corrupt plan is the reads' ``FormatError``, never a list of pieces outside the store."""
    import dataclasses

    import mmpack
    from mmpack import PackedDataset
    from mmpack.errors import FormatError

    store = mmpack.build(tmp_path / "s", [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]])
    ds = PackedDataset(store, 8, eot=0, cache=False)
    ds._plan = dataclasses.replace(ds._plan, **_CORRUPTIONS[corruption](ds._plan))
    for i in range(len(ds)):
        with pytest.raises(FormatError, match="packing plan"):
            ds.locate(i)


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("corruption", sorted(_CORRUPTIONS))
def test_a_corrupt_plan_is_refused_by_single_and_batched_reads(tmp_path, dtype, corruption):
    """``ds[i]`` (one ``one_bin`` call) and ``__getitems__`` of every bin of a
    corrupt plan raise the documented ``FormatError`` (rerun with NUMBA_BOUNDSCHECK=1 by
    ``make test``: no out-of-bounds access on the way)."""
    import dataclasses

    import mmpack
    from mmpack import PackedDataset
    from mmpack.errors import FormatError

    store = mmpack.build(tmp_path / "s", [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]])
    ds = PackedDataset(store, 8, eot=0, cache=False, dtype=dtype)
    ds._plan = dataclasses.replace(ds._plan, **_CORRUPTIONS[corruption](ds._plan))
    for i in range(len(ds)):
        with pytest.raises(FormatError, match="packing plan"):
            ds[i]
        with pytest.raises(FormatError, match="packing plan"):
            ds.__getitems__([i])


@pytest.mark.parametrize("field", ["piece_ref", "piece_len"])
def test_a_plan_whose_piece_arrays_differ_in_length_is_refused(tmp_path, field):
    """The row kernels check a bin's range against ``piece_ref`` only and then index every
    piece array: a plan whose ``piece_ref``/``piece_len`` is shorter is refused when it is
    installed (a ``FormatError`` naming the shapes), before any kernel reads past its end."""
    import dataclasses

    import mmpack
    from mmpack import PackedDataset
    from mmpack.errors import FormatError

    store = mmpack.build(tmp_path / "s", [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]])
    ds = PackedDataset(store, 8, eot=0, cache=False)
    short = dataclasses.replace(ds._plan, **{field: getattr(ds._plan, field)[:1].copy()})
    with pytest.raises(FormatError, match="one length"):
        ds._plan = short
    with pytest.raises(FormatError, match="one length"):
        short.validate(store.doc_lens)
