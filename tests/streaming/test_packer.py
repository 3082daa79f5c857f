"""StreamingPacker: the seed's greedy best fit, exactly, with every capability around it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _packer import KW, assert_same_batch, make_docs, take
from reference import rows_of

from mmpack import StreamingPacker

# =========================================================================== kernels
# place_batch against a linear scan (ref_place): tests/reference.py ("plan_bestfit.place_batch"),
# run by tests/test_reference.py.


# =========================================================================== the packer vs the twin
# (every container and dtype of source, Python lists included, against the seed's packer:
# tests/kernels/test_streaming_batch.py::test_numpy_and_list_sources_match_seed_twin)


def test_deferred_sequences_keep_their_order():
    # Row of 10: a(6) fits, b(5) and c(5) do not, d(4) fills the row.  The next batch must take
    # b before c; the seed's extendleft would hand back c first.
    docs = [[1] * 6, [2] * 5, [3] * 5, [4] * 4, [5] * 10]
    packer = StreamingPacker(docs, batch_size=1, seqlen=10, buffer_size=3)
    batches = [rows_of(b) for b in packer]
    assert batches[0] == [[[1] * 6, [4] * 4]]
    assert batches[1] == [[[2] * 5, [3] * 5]]
    assert batches[2] == [[[5] * 10]]


# =========================================================================== outputs
def test_batch_layout_and_padding():
    docs = make_docs([3, 4, 2, 5, 1, 6, 7, 2])
    packer = StreamingPacker(
        docs, batch_size=2, seqlen=8, buffer_size=4, drop_last=False, pad_id=-7
    )
    for batch in packer:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        assert ids.shape == mask.shape == (2, 8) and ids.dtype == mask.dtype == np.int64
        assert batch["targets"] is None
        for r, cu in enumerate(batch["cu_seqlens"]):
            used = int(mask[r].sum())
            assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == 8
            assert mask[r, :used].all() and not mask[r, used:].any()
            assert (ids[r, used:] == -7).all()
            if used == 8:
                assert used in cu.tolist()[1:] and cu.tolist().count(8) == 1
            else:
                assert cu[-2] == used  # the trailing 8 is the padding segment
            assert batch["max_seqlen"][r] == int(np.diff(cu).max())
            assert isinstance(batch["max_seqlen"][r], int)


def test_every_token_emitted_once_without_drop_last():
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 100, size=int(n)) for n in rng.integers(0, 40, size=300)]
    packer = StreamingPacker(docs, batch_size=3, seqlen=32, buffer_size=10, drop_last=False)
    pieces = [tuple(s) for b in packer for row in rows_of(b) for s in row]
    want = []
    for d in docs:
        want += [tuple(d[k : k + 32].tolist()) for k in range(0, len(d), 32)]
    assert sorted(pieces) == sorted(want)
    stats = packer.stats()
    assert stats.n_docs == 300
    assert stats.n_empty == sum(len(d) == 0 for d in docs)
    assert stats.n_pieces == len(want)
    assert stats.n_tokens == sum(len(d) for d in docs)
    assert stats.efficiency == stats.n_tokens / (stats.n_rows * 32)
    assert stats.padding_tokens == stats.n_rows * 32 - stats.n_tokens
    assert stats.n_batches == len(list(packer)) and stats.n_rows == 3 * stats.n_batches


def test_drop_last():
    docs = make_docs([5, 5, 5])  # 3 rows wanted, 2 rows fill, then one partial batch
    assert [rows_of(b) for b in StreamingPacker(docs, batch_size=2, seqlen=5, buffer_size=4)] == [
        [[docs[0]], [docs[1]]]
    ]
    got = [
        rows_of(b)
        for b in StreamingPacker(docs, batch_size=2, seqlen=5, buffer_size=4, drop_last=False)
    ]
    assert got == [[[docs[0]], [docs[1]]], [[docs[2]], []]]
    last = list(
        StreamingPacker(docs, batch_size=2, seqlen=5, buffer_size=4, drop_last=False, mode="causal")
    )[-1]
    assert last["cu_seqlens"][1].tolist() == [0, 5] and last["max_seqlen"][1] == 5
    assert not last["attention_mask"][1].any() and (last["targets"][1] == -100).all()


def test_long_sequences():
    doc = list(range(1, 24))  # 23 tokens, rows of 10
    split = StreamingPacker([doc], batch_size=1, seqlen=10, buffer_size=3, drop_last=False)
    assert [rows_of(b) for b in split] == [[[doc[:10]]], [[doc[10:20]]], [[doc[20:]]]]
    assert split.stats().n_split == 1 and split.stats().n_pieces == 3

    trunc = StreamingPacker(
        [doc, [7, 7]],
        batch_size=1,
        seqlen=10,
        buffer_size=3,
        long_docs="truncate",
        drop_last=False,
    )
    assert [rows_of(b) for b in trunc] == [[[doc[:10]]], [[[7, 7]]]]
    assert trunc.stats().n_truncated == 1 and trunc.stats().lost_tokens == 13

    drop = StreamingPacker(
        [doc, [7, 7]],
        batch_size=1,
        seqlen=10,
        buffer_size=3,
        long_docs="drop",
        drop_last=False,
    )
    assert [rows_of(b) for b in drop] == [[[[7, 7]]]]
    assert drop.stats().n_dropped == 1 and drop.stats().lost_tokens == 23


def test_empty_sequences_are_ignored_and_counted():
    docs = [[], [1, 2], np.array([], dtype=np.int64), [3], torch.tensor([], dtype=torch.long)]
    p = StreamingPacker(docs, batch_size=1, seqlen=3, buffer_size=2)
    assert [rows_of(b) for b in p] == [[[[1, 2], [3]]]]
    assert p.stats().n_empty == 3 and p.stats().n_docs == 5


def test_causal_labels():
    docs = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    p = StreamingPacker(docs, batch_size=2, seqlen=5, buffer_size=3, mode="causal", drop_last=False)
    (batch,) = list(p)
    assert rows_of(batch) == [[[10, 11, 12], [20, 21]], [[30, 31, 32, 33]]]
    assert batch["targets"].tolist() == [
        [11, 12, -100, 21, -100],
        [31, 32, 33, -100, -100],
    ]


def mlm_packer(docs, **kw):
    args = dict(
        batch_size=2,
        seqlen=64,
        buffer_size=8,
        mode="mlm",
        mask_id=3,
        vocab_size=100,
        special_ids=(1, 2),
        mask_prob=0.5,
        pad_id=0,
        drop_last=False,
    )
    args.update(kw)
    return StreamingPacker(docs, **args)


def test_mlm_masking():
    rng = np.random.default_rng(0)
    docs = [
        np.concatenate([[1], rng.integers(4, 100, size=int(n)), [2]])
        for n in rng.integers(5, 30, size=40)
    ]
    p = mlm_packer(docs)
    plain = StreamingPacker(docs, batch_size=2, seqlen=64, buffer_size=8, drop_last=False)
    n_selected = n_real = 0
    for batch, ref in zip(p, plain):
        ids, labels, orig = batch["input_ids"], batch["targets"], ref["input_ids"]
        mask = batch["attention_mask"].astype(bool)
        assert (batch["attention_mask"] == ref["attention_mask"]).all()
        selected = labels != -100
        assert not (selected & ~mask).any()  # padding never selected
        assert not np.isin(orig[selected], [1, 2]).any()  # special ids never selected
        assert (labels[selected] == orig[selected]).all()
        assert (ids[~selected] == orig[~selected]).all()
        changed = selected & (ids != orig)
        assert ((ids[changed] == 3) | ((ids[changed] >= 4) & (ids[changed] < 100))).all()
        assert "mask_prob" not in batch
        n_selected += int(selected.sum())
        n_real += int(mask.sum() - np.isin(orig[mask], [1, 2]).sum())
    assert 0.4 < n_selected / n_real < 0.6


def test_mlm_reseeds_per_epoch_and_set_epoch():
    docs = [list(range(4, 40))] * 12
    p = mlm_packer(docs)
    e0 = [b["input_ids"] for b in p]
    e1 = [b["input_ids"] for b in p]
    assert p.epoch == 1
    assert any((a != b).any() for a, b in zip(e0, e1))
    again = [b["input_ids"] for b in mlm_packer(docs)]
    assert len(again) == len(e0) and all((a == b).all() for a, b in zip(e0, again))
    jumped = mlm_packer(docs)
    jumped.set_epoch(1)
    assert all((a == b["input_ids"]).all() for a, b in zip(e1, jumped))
    assert jumped.epoch == 1


class _Sampler:
    def __init__(self):
        self.epochs = []

    def set_epoch(self, e):
        self.epochs.append(e)


def test_epoch_reaches_dataloader_sampler(docs):
    from torch.utils.data import DataLoader, DistributedSampler

    data = [np.asarray(d) for d in docs]
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=4, sampler=sampler, collate_fn=lambda b: b)
    p = StreamingPacker(loader, **KW)
    first = [rows_of(b) for b in p]
    assert sampler.epoch == 0
    second = [rows_of(b) for b in p]
    assert sampler.epoch == 1 and first != second
    p.set_epoch(7)
    list(p)
    assert sampler.epoch == 7

    class Source(list):
        pass

    src = Source(docs)
    src.set_epoch = _Sampler().set_epoch  # e.g. a shuffled view
    p = StreamingPacker(src, **KW)
    list(p), list(p)
    assert src.set_epoch.__self__.epochs == [0, 1]


def test_stale_iterator(docs):
    p = StreamingPacker(docs, **KW)
    it = iter(p)
    next(it)
    iter(p)
    with pytest.raises(RuntimeError, match="stale"):
        next(it)


# =========================================================================== schedules
def test_batch_size_warmup():
    docs = [[5] * 10] * 200
    p = StreamingPacker(
        docs,
        batch_size=4,
        seqlen=10,
        buffer_size=8,
        batch_size_warmup_min_size=1,
        batch_size_warmup_tokens="120tok",
    )
    # thresholds: ceil(120/6 * [1, 3]) = [20, 60]; the count is checked before each batch
    sizes = [b["input_ids"].shape[0] for _, b in zip(range(8), p)]
    assert sizes == [1, 1, 2, 2, 3, 3, 4, 4]
    assert p.stats().token_count == 200


def test_mask_prob_cooldown_in_batches():
    p = mlm_packer(
        [list(range(4, 68))] * 20,
        seqlen=64,
        batch_size=1,
        masking_ratio_cooldown_tokens="256tok",
        final_masking_ratio=0.1,
        masking_cooldown_schedule_type="stair",
        masking_ratio_step_size=0.1,
    )
    probs = [float(b["mask_prob"]) for _, b in zip(range(6), p)]
    assert probs == pytest.approx([0.5, 0.4, 0.3, 0.2, 0.1, 0.1])


# =========================================================================== state
@pytest.mark.parametrize("kind", ["list", "store"])
def test_exact_resume(kind, tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(4, 90, size=int(n)) for n in rng.integers(0, 90, size=120)]
    source = docs
    if kind == "store":
        from mmpack import build

        source = build(tmp_path / "s", docs)
    kw = dict(
        batch_size=3,
        seqlen=40,
        buffer_size=6,
        mode="mlm",
        mask_id=3,
        vocab_size=100,
        masking_ratio_cooldown_tokens=3000,
        final_masking_ratio=0.1,
        batch_size_warmup_min_size=1,
        batch_size_warmup_tokens=500,
    )
    ref = StreamingPacker(source, **kw)
    e0 = list(ref)
    full = e0 + list(ref)  # two epochs (of different lengths: the warm-up grows the batches)
    n0 = len(e0)

    for stop in (0, 3, n0 - 1, n0, n0 + 2):
        a = StreamingPacker(source, **kw)
        it = iter(a)
        seen = take(it, min(stop, n0))
        if stop >= n0:
            assert list(it) == []
        if stop > n0:
            seen += take(iter(a), stop - n0)
        state = a.state_dict()
        b = StreamingPacker(source, **kw)
        b.load_state_dict(state)
        rest = list(b)
        if stop < n0:
            rest += list(b)
        assert len(seen) + len(rest) == len(full)
        for x, y in zip(seen + rest, full):
            assert_same_batch(x, y)
        assert b.stats().token_count == ref.stats().token_count


def test_state_needs_an_indexable_source(docs):
    p = StreamingPacker(iter(docs), **KW)
    with pytest.raises(TypeError, match="random-access"):
        p.state_dict()
    with pytest.raises(TypeError, match="random-access"):
        p.load_state_dict({})


# =========================================================================== names
def test_the_row_length_is_seqlen_only_and_the_seed_is_zero():
    """One name per parameter, as in the views: ``seqlen`` (ModernBERT's ``out_pseq_len`` and
    ``out_batch_size`` are not taken), ``seed=0`` by default."""
    docs = make_docs([3, 4, 2, 5, 1, 6, 7, 2])
    p = StreamingPacker(docs, batch_size=2, seqlen=8, buffer_size=4, drop_last=False)
    assert p.seqlen == 8 and p.batch_size == 2 and p.config.seed == 0
    for old in ({"out_pseq_len": 8}, {"out_batch_size": 2}, {"return_tensors": "np"}):
        with pytest.raises(TypeError, match=next(iter(old))):
            StreamingPacker(docs, **{"batch_size": 2, "seqlen": 8, "buffer_size": 4, **old})
    with pytest.raises(TypeError, match="seqlen"):
        StreamingPacker(docs, batch_size=2, buffer_size=4)
    with pytest.raises(ValueError, match="seqlen"):
        StreamingPacker(docs, batch_size=2, seqlen=0, buffer_size=4)
    with pytest.raises(TypeError, match="seqlen"):
        StreamingPacker(docs, batch_size=2, seqlen=True, buffer_size=4)
    mlm = dict(batch_size=2, seqlen=8, buffer_size=4, mode="mlm", mask_id=3, vocab_size=50)
    default = [b["input_ids"].tolist() for b in StreamingPacker(docs, **mlm)]
    assert default == [b["input_ids"].tolist() for b in StreamingPacker(docs, seed=0, **mlm)]


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.array([True, False]), "bool"),
        ([1, True], "non-integer token True"),
        (torch.tensor([True]), "bool"),
        ([2, 0.5], "non-integer token 0.5"),
        (np.full(3, 0.5), "non-integer token 0.5"),
        ([3, -1], "negative token -1"),
    ],
)
def test_tokens_follow_the_build_rule(bad, match, tmp_path):
    """One token rule for the packer and for build (the same function checks both)."""
    from mmpack import build

    with pytest.raises(ValueError, match=match):
        build(tmp_path / "s", [bad])
    with pytest.raises(ValueError, match=match):
        list(StreamingPacker([bad], **KW))
    with pytest.raises(ValueError, match=match):
        list(StreamingPacker([[1, 2], bad], **KW))
    if "negative" not in match:  # checked when the row is written, not per document
        with pytest.raises(ValueError, match="document 1"):
            list(StreamingPacker([[1, 2], bad], **KW))


def test_float_lists_are_tokens_like_for_build():
    """A list of integral floats is detected as a sequence (not as a batch whose floats "must
    have a length") and converted as build converts it."""
    got = [rows_of(b) for b in StreamingPacker([[1.0, 2.0], [3.0]], **KW)]
    assert got == [rows_of(b) for b in StreamingPacker([[1, 2], [3]], **KW)]
    with pytest.raises(ValueError, match="non-integer token 1.5"):
        list(StreamingPacker([[1.5, 2.0]], **KW))
