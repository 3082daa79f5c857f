"""Loss masks turned into labels by the window and packed views, against slow Python twins
written from the rule: a label is -100 where its target token is not a target (mask 0); an
eot the view inserts is a target; padding and the document-boundary rules are the views' own,
unchanged.  MLM selects only target tokens.  ``collate`` and ``hf_inputs`` carry the labels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    naive_stream,
    ref_find_doc,
    ref_window,
    twin_mask_pieces,
    twin_masked_window_labels,
)

import mmpack

IGNORE = -100

docs_and_masks = st.lists(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1)), max_size=30),
    min_size=1,
    max_size=12,
)


def _build(tmp, name, pairs, masked=True):
    docs = [
        {"input_ids": [t for t, _ in d], "loss_mask": [m for _, m in d]}
        if masked
        else [t for t, _ in d]
        for d in pairs
    ]
    return mmpack.build(tmp / name, docs, dtype=np.uint16, fsync=False)


# ------------------------------------------------------------------------------------ twins
def twin_window_labels(pairs, seqlen, stride, eot, drop_last):
    """The labels of every window, from the stream of tokens and of their target flags."""
    stream, flags = [], []
    for d in pairs:
        stream += [t for t, _ in d]
        flags += [m for _, m in d]
        if eot is not None:
            stream.append(eot)
            flags.append(1)  # an inserted eot is a target
    width = seqlen + 1
    starts = list(range(0, max(len(stream) - width + 1, 0), stride))
    if not drop_last:
        covered = starts[-1] + width if starts else 0
        nxt = starts[-1] + stride if starts else 0
        if covered < len(stream) and nxt < len(stream):
            starts.append(nxt)
    out = []
    for s in starts:
        row = []
        for t in range(seqlen):
            q = s + t + 1
            row.append(stream[q] if q < len(stream) and flags[q] else IGNORE)
        out.append(row)
    return out


def twin_packed_labels(pairs, pieces, seqlen, eot, label_shift):
    """The labels of one packed row from its pieces (the plan's, tested elsewhere)."""
    labels = []
    for p in pieces:
        d, a, b = p["doc"], p["start"], p["stop"]
        seg = [t for t, _ in pairs[d][a:b]]
        flag = [m for _, m in pairs[d][a:b]]
        if p["eot"]:
            seg.append(eot)
            flag.append(1)
        n = len(seg)
        if label_shift == "next":
            labels += [seg[t + 1] if flag[t + 1] else IGNORE for t in range(n - 1)] + [IGNORE]
        else:
            labels += [IGNORE] + [seg[t] if flag[t] else IGNORE for t in range(1, n)]
    return labels + [IGNORE] * (seqlen - len(labels))


# ------------------------------------------------------------------------------------ window
@settings(max_examples=60, deadline=None)
@given(
    pairs=docs_and_masks,
    seqlen=st.integers(1, 12),
    stride=st.integers(1, 14),
    eot=st.sampled_from([None, 50]),
    drop_last=st.booleans(),
)
def test_window_labels_match_the_twin(tmp_path_factory, pairs, seqlen, stride, eot, drop_last):
    tmp = tmp_path_factory.mktemp("w")
    store, plain = _build(tmp, "m", pairs), _build(tmp, "p", pairs, masked=False)
    kw = dict(eot=eot, labels=True, drop_last=drop_last, pad_id=0)
    ds, ref = (
        mmpack.WindowDataset(store, seqlen, stride, **kw),
        mmpack.WindowDataset(plain, seqlen, stride, **kw),
    )
    want = twin_window_labels(pairs, seqlen, stride, eot, drop_last)
    assert len(ds) == len(want) == len(ref)
    if not len(ds):
        return
    batch = ds.__getitems__(list(range(len(ds)))[::-1])
    plain_batch = ref.__getitems__(list(range(len(ds)))[::-1])
    np.testing.assert_array_equal(batch.columns["labels"], want[::-1])
    for key in ("input_ids", "position_ids"):  # the mask changes the labels only
        np.testing.assert_array_equal(batch.columns[key], plain_batch.columns[key])
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i]["labels"], want[i])


# ------------------------------------------------------------------------------------ packed
@settings(max_examples=60, deadline=None)
@given(
    pairs=docs_and_masks,
    seqlen=st.integers(2, 24),
    eot=st.sampled_from([None, 50]),
    label_shift=st.sampled_from(["next", "hf"]),
    long_docs=st.sampled_from(["split", "truncate"]),
)
def test_packed_labels_match_the_twin(tmp_path_factory, pairs, seqlen, eot, label_shift, long_docs):
    tmp = tmp_path_factory.mktemp("p")
    store, plain = _build(tmp, "m", pairs), _build(tmp, "p", pairs, masked=False)
    kw = dict(eot=eot, pad_id=0, label_shift=label_shift, long_docs=long_docs, cache=False)
    ds, ref = mmpack.PackedDataset(store, seqlen, **kw), mmpack.PackedDataset(plain, seqlen, **kw)
    assert len(ds) == len(ref)
    if not len(ds):
        return
    order = list(range(len(ds)))[::-1]
    batch, plain_batch = ds.__getitems__(order), ref.__getitems__(order)
    for r, i in enumerate(order):
        want = twin_packed_labels(pairs, ds.locate(i), seqlen, eot, label_shift)
        np.testing.assert_array_equal(batch.columns["labels"][r], want)
        np.testing.assert_array_equal(ds[i]["labels"], want)
    for key in ("input_ids", "position_ids", "attention_mask"):
        np.testing.assert_array_equal(batch.columns[key], plain_batch.columns[key])
    np.testing.assert_array_equal(batch.num_cuts, plain_batch.num_cuts)


@settings(max_examples=40, deadline=None)
@given(pairs=docs_and_masks, seqlen=st.integers(2, 24), seed=st.integers(0, 2**32 - 1))
def test_mlm_selects_only_target_tokens(tmp_path_factory, pairs, seqlen, seed):
    # The corruption draws per (seed, epoch, row, position): with a mask, the selected
    # positions are those selected without it that are targets, corrupted alike.
    tmp = tmp_path_factory.mktemp("mlm")
    store, plain = _build(tmp, "m", pairs), _build(tmp, "p", pairs, masked=False)
    kw = dict(eot=50, pad_id=0, mode="mlm", mask_prob=0.5, mask_id=60, vocab_size=64, seed=seed)
    ds, ref = mmpack.PackedDataset(store, seqlen, **kw), mmpack.PackedDataset(plain, seqlen, **kw)
    clean = mmpack.PackedDataset(plain, seqlen, eot=50, pad_id=0)
    for i in range(len(ds)):
        got, free, orig = ds[i], ref[i], clean[i]
        flags = np.zeros(seqlen, dtype=bool)
        at = 0
        for p in ds.locate(i):
            m = [f for _, f in pairs[p["doc"]][p["start"] : p["stop"]]]
            flags[p["at"] : p["at"] + len(m)] = np.array(m, dtype=bool)
            at = p["at"] + len(m) + p["eot"]
        assert at <= seqlen
        np.testing.assert_array_equal(got["labels"], np.where(flags, free["labels"], IGNORE))
        np.testing.assert_array_equal(
            got["input_ids"], np.where(flags, free["input_ids"], orig["input_ids"])
        )


# ------------------------------------------------------------------------------- torch side
def test_collate_and_hf_inputs_carry_the_masked_labels(tmp_path):
    import torch

    from mmpack.torch import collate, hf_inputs

    pairs = [[(1, 0), (2, 0), (3, 1), (4, 1)], [(5, 0), (6, 1)], [(7, 1), (8, 0), (9, 1)]]
    store = _build(tmp_path, "s", pairs)
    for ds in (
        mmpack.PackedDataset(store, 8, eot=0, pad_id=0),
        mmpack.WindowDataset(store, 4, eot=0, labels=True),
    ):
        samples = ds.__getitems__(list(range(len(ds))))
        batch = collate(samples)
        np.testing.assert_array_equal(batch["targets"].numpy(), samples.columns["labels"])
        assert (batch["targets"] == IGNORE).any()
        model_in = hf_inputs(batch, "sdpa")
        assert torch.equal(model_in["labels"], batch["targets"])
        assert torch.equal(model_in["shift_labels"], batch["targets"])


def test_a_view_reads_the_mask_after_pickling(tmp_path):
    import pickle

    pairs = [[(1, 0), (2, 1), (3, 1)], [(4, 1), (5, 0)]]
    store = _build(tmp_path, "s", pairs)
    ds = mmpack.PackedDataset(store, 8, eot=0, pad_id=0)
    again = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(again[0]["labels"], ds[0]["labels"])
    assert again[0]["labels"].tolist() == [2, 3, 0, IGNORE, IGNORE, 0, IGNORE, IGNORE]


# ------------------------------------------------------------------------------------ kernels


@settings(max_examples=80, deadline=None)
@given(
    lens=st.lists(st.integers(0, 9), min_size=1, max_size=700),
    use_eot=st.integers(0, 1),
    seqlen=st.integers(1, 20),
    sampled=st.booleans(),
    shift=st.integers(0, 5),
    data=st.data(),
)
def test_gather_masked_windows_matches_its_twins(lens, use_eot, seqlen, sampled, shift, data):
    from mmpack._src.kernels.window import INDEX_STEP, fill_sampled_index, gather_masked_windows

    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1]) + use_eot * len(lens)
    if total == 0:
        return
    n = int(offsets[-1])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mask = rng.integers(0, 2, size=n + shift).astype(np.uint8)  # read at mshift[k] = shift
    src = rng.integers(0, 1000, size=n).astype(np.int64)
    k = data.draw(st.integers(1, 6))
    vstarts = rng.integers(0, total, size=k).astype(np.int64)
    base = np.full(k, shift, dtype=np.int64)
    top = np.empty((len(lens) - 1) // INDEX_STEP + 1 if sampled else 0, dtype=np.int64)
    if sampled:
        fill_sampled_index(offsets, use_eot, top)
    rows = np.empty((k, seqlen + 1), dtype=np.int64)
    pos, got = np.empty((k, seqlen), dtype=np.int64), np.empty((k, seqlen), dtype=np.int64)
    cu, ncu = np.empty((k, seqlen + 1), dtype=np.int32), np.empty(k, dtype=np.int64)
    cursors, first = np.full(1, -1, dtype=np.int64), np.full(k, -1, dtype=np.int64)
    gather_masked_windows(
        src, cursors, mask, base, offsets, top, use_eot, 9, vstarts, seqlen, total, 0, IGNORE,
        rows, pos, cu, ncu, got, first,
    )  # fmt: skip
    docs = [src[offsets[j] : offsets[j + 1]] for j in range(len(lens))]
    stream, ends = naive_stream(docs, 9 if use_eot else None)
    for r, v in enumerate(vstarts.tolist()):
        row, positions, cuts = ref_window(stream, ends, v, seqlen, seqlen + 1, 0)
        assert rows[r].tolist() == row and pos[r].tolist() == positions
        assert cu[r, : ncu[r]].tolist() == cuts
        assert first[r] == ref_find_doc(offsets.tolist(), use_eot, v)
    want = twin_masked_window_labels(
        mask, base, offsets, use_eot, vstarts, seqlen, total, rows, IGNORE
    )
    np.testing.assert_array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(
    rows_pieces=st.lists(
        st.lists(st.tuples(st.integers(0, 8), st.integers(0, 1)), max_size=5),
        min_size=1,
        max_size=6,
    ),
    shift=st.integers(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_mask_pieces_kernel_matches_its_twin(rows_pieces, shift, seed):
    from mmpack._src.kernels.packed_rows import mask_pieces

    rng = np.random.default_rng(seed)
    lengths = np.array([n for row in rows_pieces for n, _ in row], dtype=np.int64)
    has_eot = np.array([e for row in rows_pieces for _, e in row], dtype=np.int64)
    row_ptr = np.zeros(len(rows_pieces) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows_pieces], out=row_ptr[1:])
    seqlen = max([int(sum(n + e for n, e in row)) for row in rows_pieces] + [1])
    mask = rng.integers(0, 2, size=int(lengths.sum()) + 50).astype(np.uint8)
    mask_starts = rng.integers(0, 51, size=lengths.shape[0]).astype(np.int64)
    out = rng.integers(0, 1000, size=(len(rows_pieces), seqlen)).astype(np.int64)
    want = twin_mask_pieces(mask, mask_starts, lengths, has_eot, row_ptr, shift, IGNORE, out)
    mask_pieces(mask, mask_starts, lengths, has_eot, row_ptr, shift, IGNORE, out)
    np.testing.assert_array_equal(out, want)
