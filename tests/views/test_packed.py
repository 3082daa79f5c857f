"""The packed view (mmpack._src.views.packed) against a naive Python implementation of its contract."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpack import PackedDataset, build
from mmpack.errors import FormatError

IGNORE = -100


# ------------------------------------------------------------------------------- reference
def ref_sample(docs, pieces, seqlen, eot, pad_id, label_shift):
    """The contract, spelled out: segments, then padding as the last segment."""
    ids, cu, pos, labels = [], [0], [], []
    for p in pieces:
        d, s, n = p["doc"], p["start"], p["stop"] - p["start"]
        seg = [int(t) for t in docs[d][s : s + n]]
        if eot is not None and n < seqlen:  # the document's last piece carries its eot
            seg.append(eot)
        assert p["eot"] == int(eot is not None and n < seqlen) and p["at"] == len(ids)
        ids += seg
        pos += list(range(len(seg)))
        if label_shift == "next":
            labels += seg[1:] + [IGNORE]
        else:
            labels += [IGNORE] + seg[1:]
        cu.append(len(ids))
    real = len(ids)
    if real < seqlen:
        pad = seqlen - real
        ids += [pad_id] * pad
        pos += list(range(pad))
        labels += [IGNORE] * pad
        cu.append(seqlen)
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": pos,
        "attention_mask": [1] * real + [0] * (seqlen - real),
        "cu_seqlens": cu,
        "max_seqlen": max(b - a for a, b in zip(cu, cu[1:])),
    }


def assert_sample(got, want, dtype=np.int64):
    assert set(got) == set(want)
    for key, value in want.items():
        if key == "max_seqlen":
            assert got[key] == value and type(got[key]) is int
            continue
        arr = got[key]
        assert arr.dtype == (np.int32 if key == "cu_seqlens" else dtype), key
        assert arr.tolist() == value, key


def make_store(tmp_path, docs, backend="memmap"):
    return build(tmp_path / f"store-{backend}", docs, backend=backend, overwrite=True)


docs_strategy = st.lists(st.lists(st.integers(1, 500), max_size=40), min_size=1, max_size=25)


# ------------------------------------------------------------------------------- properties
@settings(max_examples=30)
@given(
    docs=docs_strategy,
    seqlen=st.integers(1, 48),
    eot=st.one_of(st.none(), st.integers(0, 1000)),
    pad_id=st.integers(-5, 1000),
    label_shift=st.sampled_from(["next", "hf"]),
    long_docs=st.sampled_from(["split", "truncate", "drop"]),
    algorithm=st.sampled_from(["bfd", "online"]),
    backend=st.sampled_from(["memmap", "zarr"]),
)
def test_samples_match_reference(
    tmp_path_factory, docs, seqlen, eot, pad_id, label_shift, long_docs, algorithm, backend
):
    store = make_store(tmp_path_factory.mktemp("p"), docs, backend)
    ds = PackedDataset(
        store,
        seqlen,
        eot=eot,
        pad_id=pad_id,
        label_shift=label_shift,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=3,
    )
    assert len(ds) == ds.plan.n_bins == ds.stats().n_bins
    wants = [
        ref_sample(docs, ds.locate(i), seqlen, eot, pad_id, label_shift) for i in range(len(ds))
    ]
    for i, want in enumerate(wants):
        assert_sample(ds[i], want)
    if len(ds):
        order = list(np.random.default_rng(0).permutation(len(ds))) + [0, 0, -1]
        for i, got in zip(order, ds.__getitems__(order)):
            assert_sample(got, wants[i])


@settings(max_examples=30)
@given(docs=docs_strategy, seqlen=st.integers(1, 32), eot=st.one_of(st.none(), st.just(999)))
def test_split_documents_reassemble(tmp_path_factory, docs, seqlen, eot):
    """Reading every bin and putting the segments back by (doc, start) gives every document
    exactly once, followed by its eot: nothing lost, nothing repeated."""
    store = make_store(tmp_path_factory.mktemp("p"), docs)
    ds = PackedDataset(store, seqlen, eot=eot, pad_id=-1)
    got: dict[int, list[tuple[int, list[int]]]] = {}
    for i in range(len(ds)):
        sample = ds[i]
        cu = sample["cu_seqlens"]
        pieces = ds.locate(i)
        assert len(cu) - 1 - len(pieces) in (0, 1)  # one segment per piece, then any padding
        for p, a, b in zip(pieces, cu[:-1], cu[1:]):
            assert sorted(p) == ["at", "doc", "eot", "start", "stop"]
            assert p["at"] == a and b - a == p["stop"] - p["start"] + p["eot"]
            got.setdefault(p["doc"], []).append((p["start"], sample["input_ids"][a:b].tolist()))
        real = int(sample["attention_mask"].sum())
        assert sample["attention_mask"][:real].all() and not sample["attention_mask"][real:].any()
        assert (sample["input_ids"][real:] == -1).all()
    tail = [] if eot is None else [eot]
    for d, doc in enumerate(docs):
        if not doc and eot is None:
            assert d not in got
            continue
        assert sum((seg for _, seg in sorted(got[d])), []) == list(doc) + tail


def test_worked_example(tmp_path):
    docs = [[1, 2, 3], [4, 5, 6, 7, 8], [], [9] * 9, [10, 11], [12] * 7]
    ds = PackedDataset(make_store(tmp_path, docs), 8, eot=99, pad_id=0)
    assert len(ds) == 4
    s = ds[3]
    assert ds.locate(3) == [
        {"doc": 0, "start": 0, "stop": 3, "eot": 1, "at": 0},
        {"doc": 4, "start": 0, "stop": 2, "eot": 1, "at": 4},
        {"doc": 2, "start": 0, "stop": 0, "eot": 1, "at": 7},
    ]
    assert ds.locate(-1) == ds.locate(3)
    assert s["input_ids"].tolist() == [1, 2, 3, 99, 10, 11, 99, 99]
    assert s["labels"].tolist() == [2, 3, 99, IGNORE, 11, 99, IGNORE, IGNORE]
    assert s["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert s["cu_seqlens"].tolist() == [0, 4, 7, 8] and s["max_seqlen"] == 4
    hf = PackedDataset(make_store(tmp_path, docs), 8, eot=99, label_shift="hf")[3]
    assert hf["labels"].tolist() == [IGNORE, 2, 3, 99, IGNORE, 11, 99, IGNORE]
    padded = PackedDataset(make_store(tmp_path, [[1, 2, 3]]), 8, pad_id=7)[0]
    assert padded["input_ids"].tolist() == [1, 2, 3, 7, 7, 7, 7, 7]
    assert padded["cu_seqlens"].tolist() == [0, 3, 8] and padded["max_seqlen"] == 5
    assert padded["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert padded["labels"].tolist() == [2, 3] + [IGNORE] * 6


# ------------------------------------------------------------------------------- API
def test_pickle_is_small_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, n) for n in rng.integers(0, 3000, 3000)]
    store = make_store(tmp_path, docs)
    ds = PackedDataset(store, 1024, eot=50000, mode="mlm", mask_id=50001, vocab_size=50002)
    ds.set_epoch(3)
    blob = pickle.dumps(ds)
    assert len(blob) < 4096, len(blob)
    back = pickle.loads(blob)
    assert len(back) == len(ds) and back.epoch == 3
    for i in (0, 17, len(ds) - 1):
        for key in ("input_ids", "labels", "cu_seqlens"):
            assert np.array_equal(back[i][key], ds[i][key])


def test_plan_is_cached_in_the_store(tmp_path):
    store = make_store(tmp_path, [[1] * n for n in range(1, 200)])
    ds = PackedDataset(store, 64, eot=0)
    files = list((store.path / "cache").iterdir())
    assert len(files) == 1
    again = PackedDataset(store, 64, eot=0, mode="mlm", mask_id=5, vocab_size=10)
    assert np.array_equal(again.plan.bin_ptr, ds.plan.bin_ptr)
    assert list((store.path / "cache").iterdir()) == files
    PackedDataset(store, 64, eot=0, cache=False)
    assert list((store.path / "cache").iterdir()) == files


def test_indexing_errors(tmp_path):
    ds = PackedDataset(make_store(tmp_path, [[1, 2], [3]]), 4)
    n = len(ds)
    assert np.array_equal(ds[-1]["input_ids"], ds[n - 1]["input_ids"])
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            ds[bad]
        with pytest.raises(IndexError):
            ds.__getitems__([0, bad])
        with pytest.raises(IndexError):
            ds.locate(bad)
    for bad in (0.0, "0", None, True):
        with pytest.raises(TypeError):
            ds[bad]
    with pytest.raises(TypeError):
        ds.__getitems__([0.5])
    assert len(ds.__getitems__([])) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seqlen": 0}, "seqlen"),
        ({"mode": "clm"}, "mode.*causal.*mlm"),
        ({"mode": "mlm", "vocab_size": 10}, "mask_id"),
        ({"mode": "mlm", "mask_id": 3}, "vocab_size"),
        ({"mode": "mlm", "mask_id": 3, "vocab_size": 10, "mask_prob": 1.5}, "mask_prob"),
        ({"mask_prob": -0.1}, "mask_prob"),
        ({"mode": "mlm", "mask_id": 0, "vocab_size": 1}, "vocab_size"),
        ({"algorithm": "magic"}, "algorithm.*bfd"),
        ({"long_docs": "wrap"}, "long_docs.*split"),
        ({"label_shift": "prev"}, "label_shift.*hf.*next"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_parameters(tmp_path, kwargs, match):
    store = make_store(tmp_path, [[1, 2, 3]])
    kwargs = {"seqlen": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        PackedDataset(store, **kwargs)


def test_bad_types(tmp_path):
    store = make_store(tmp_path, [[1, 2, 3]])
    with pytest.raises(TypeError):
        PackedDataset([1, 2, 3], 8)
    with pytest.raises(TypeError):
        PackedDataset(store, 8.0)
    with pytest.raises(TypeError):
        PackedDataset(store, 8, eot=1.0)
    with pytest.raises(TypeError):
        PackedDataset(store, 8, special_ids=5)
    # Output ids outside the stored token range are fine.
    s = PackedDataset(str(store.path), 8, eot=2**40, pad_id=-7)[0]
    assert s["input_ids"].tolist() == [1, 2, 3, 2**40, -7, -7, -7, -7]


def test_corrupt_plan_is_reported_not_read(tmp_path):
    ds = PackedDataset(make_store(tmp_path, [[1, 2, 3], [4, 5]]), 8)
    plan = ds.plan
    bad_len = plan.piece_len.copy()
    bad_len[0] = 50
    ds._plan = dataclasses.replace(plan, piece_len=bad_len)
    with pytest.raises(FormatError):
        ds[0]
    bad_doc = plan.piece_ref.copy()
    bad_doc[0] = 99
    ds._plan = dataclasses.replace(plan, piece_ref=bad_doc)
    with pytest.raises(FormatError):
        ds[0]


def test_dataloader_with_collate(tmp_path):
    import torch

    from mmpack.torch import collate

    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 100, n) for n in rng.integers(1, 90, 200)]
    ds = PackedDataset(make_store(tmp_path, docs), 64, eot=0, pad_id=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate, num_workers=2)
    seen = 0
    for b, batch in enumerate(loader):
        assert batch["input_ids"].shape[1] == 64 and batch["input_ids"].dtype == torch.int64
        for r in range(batch["input_ids"].shape[0]):
            want = ds[b * 4 + r]
            assert batch["input_ids"][r].tolist() == want["input_ids"].tolist()
            assert batch["cu_seqlens_rows"][r].tolist() == want["cu_seqlens"].tolist()
        seen += batch["input_ids"].shape[0]
    assert seen == len(ds)


# ------------------------------------------------------------------------------- dtype="int32"
@settings(max_examples=30)
@given(
    docs=docs_strategy,
    seqlen=st.integers(1, 40),
    eot=st.one_of(st.none(), st.integers(0, 1000)),
    pad_id=st.integers(-5, 1000),
    label_shift=st.sampled_from(["next", "hf"]),
    backend=st.sampled_from(["memmap", "zarr"]),
)
def test_int32_samples_match_reference(
    tmp_path_factory, docs, seqlen, eot, pad_id, label_shift, backend
):
    """dtype="int32": the reference samples as int32 arrays, single and batched."""
    store = make_store(tmp_path_factory.mktemp("p"), docs, backend)
    ds = PackedDataset(
        store, seqlen, eot=eot, pad_id=pad_id, label_shift=label_shift, dtype="int32"
    )
    wants = [
        ref_sample(docs, ds.locate(i), seqlen, eot, pad_id, label_shift) for i in range(len(ds))
    ]
    for i, want in enumerate(wants):
        assert_sample(ds[i], want, np.int32)
    if len(ds):
        order = list(np.random.default_rng(0).permutation(len(ds))) + [0, -1]
        for i, got in zip(order, ds.__getitems__(order)):
            assert_sample(got, wants[i], np.int32)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_bin_with_more_pieces_than_the_single_buffer(tmp_path, dtype):
    """A plan swapped in with fuller bins than the one measured at construction: the single
    sample falls back to a cu_seqlens sized from the plan, same sample."""
    docs = [[1], [2, 3], [4], [5, 6, 7], [8]]
    ds = PackedDataset(make_store(tmp_path, docs), 16, eot=9, dtype=dtype)
    want = [ref_sample(docs, ds.locate(i), 16, 9, 0, "next") for i in range(len(ds))]
    assert max(len(w["cu_seqlens"]) for w in want) > 2
    ds._cu_cols = 2  # fewer entries than any bin needs
    ds._buflen = 4 * 16 + 2 * int(ds._one_buffer)
    for i, w in enumerate(want):
        assert_sample(ds[i], w, dtype)


def test_corrupt_bin_ptr_is_reported_not_read(tmp_path):
    ds = PackedDataset(make_store(tmp_path, [[1, 2, 3], [4, 5]]), 4)
    plan = ds.plan
    assert plan.bin_ptr.tolist() == [0, 1, 2]
    for bad in ([0, 2, 1], [0, 1, 7], [-1, 1, 2]):
        ds._plan = dataclasses.replace(plan, bin_ptr=np.array(bad, dtype=np.int64))
        with pytest.raises(FormatError):
            for i in range(len(ds)):
                ds[i]


def test_dtype_option_is_checked(tmp_path):
    store = make_store(tmp_path, [[1, 2, 3]])
    with pytest.raises(ValueError, match="int8"):
        PackedDataset(store, 4, dtype="int8")
    with pytest.raises(ValueError, match="mask_id=2147483648"):
        PackedDataset(
            store,
            4,
            mode="mlm",
            mask_id=2**31,
            vocab_size=2**31 + 1,
            dtype="int32",
            check_vocab=False,
        )
    wide = build(tmp_path / "wide", [[1, 2, 3]], dtype=np.uint32)
    with pytest.raises(ValueError, match="uint32"):
        PackedDataset(wide, 4, dtype="int32")
    ds = pickle.loads(pickle.dumps(PackedDataset(store, 4, eot=0, dtype="int32")))
    assert ds.dtype == np.int32
    assert_sample(ds[0], ref_sample([[1, 2, 3]], ds.locate(0), 4, 0, 0, "next"), np.int32)


def test_int32_batches_collate_to_int32_tensors(tmp_path):
    """An int32 view's batch collates with ``dtype=torch.int32`` to the int64 view's values."""
    import torch

    from mmpack.torch import collate

    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 100, n) for n in rng.integers(1, 40, 60)]
    store = make_store(tmp_path, docs)
    wide = PackedDataset(store, 32, eot=0, pad_id=0)
    narrow = PackedDataset(store, 32, eot=0, pad_id=0, dtype="int32")
    idx = [3, 0, len(wide) - 1]
    a = collate(wide.__getitems__(idx))
    b = collate(narrow.__getitems__(idx), dtype=torch.int32)
    for key in ("input_ids", "targets", "position_ids", "attention_mask"):
        assert b[key].dtype == torch.int32, key
        assert torch.equal(a[key], b[key].long()), key
    assert torch.equal(a["cu_seqlens"], b["cu_seqlens"])
