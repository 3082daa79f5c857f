"""Loss masks in the streaming packer, against the packed view on the same documents: a masked
store and ``{"input_ids", "loss_mask"}`` documents (sequences or incoming batches, iterated or
indexed) give every segment the labels the packed view gives it (the one rule: a label is -100
where the token it predicts is not a target; an eot the packer appends is a target), and MLM
selects only target tokens.  The packings differ (online best fit against the plan), so the
segments are compared as a multiset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import StreamingPacker

IGNORE = -100
EOT = 50

# Documents shorter than a row (so that both packers keep each one whole), tokens 1..40.
docs_and_masks = st.lists(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1)), min_size=1, max_size=11),
    min_size=1,
    max_size=14,
)


def _docs(pairs):
    return [{"input_ids": [t for t, _ in d], "loss_mask": [m for _, m in d]} for d in pairs]


def _segments(ids, labels, cu_seqlens, attention):
    """(ids, labels) of every non-padding segment of every row, sorted."""
    out = []
    for r in range(ids.shape[0]):
        cu = np.asarray(cu_seqlens[r]).tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if b > a and attention[r, a]:
                out.append((tuple(ids[r, a:b].tolist()), tuple(labels[r, a:b].tolist())))
    return sorted(out)


def _view_segments(store, seqlen, eot, label_shift="next"):
    ds = mmpack.PackedDataset(
        store, seqlen, eot=eot, pad_id=0, cache=False, label_shift=label_shift
    )
    batch = ds.__getitems__(list(range(len(ds))))
    cols = batch.columns
    cu = [batch[i]["cu_seqlens"] for i in range(len(ds))]
    return _segments(cols["input_ids"], cols["labels"], cu, cols["attention_mask"])


def _packer_segments(packer):
    out = []
    for b in packer:
        out += _segments(b["input_ids"], b["targets"], b["cu_seqlens"], b["attention_mask"])
    return sorted(out)


def _source(docs, kind):
    """``docs`` as a list, an iterator of documents, of incoming batches (lists), or of incoming
    batches as dicts of lists."""
    if kind == "list":
        return docs
    if kind == "iterable":
        return iter(docs)
    batches = [docs[i : i + 3] for i in range(0, len(docs), 3)]
    if kind == "batches":
        return iter(batches)
    return iter({k: [d[k] for d in b] for k in ("input_ids", "loss_mask")} for b in batches)


def _packer(source, seqlen, eot, **kw):
    kw = {"batch_size": 2, "buffer_size": 4, "mode": "causal", "drop_last": False, **kw}
    return StreamingPacker(source, seqlen=seqlen, eot=eot, pad_id=0, **kw)


@settings(max_examples=40, deadline=None)
@given(
    pairs=docs_and_masks,
    eot=st.sampled_from([None, EOT]),
    source=st.sampled_from(["store", "subset", "list", "iterable", "batches", "batch_dicts"]),
    world_size=st.sampled_from([None, 2]),
    shift=st.sampled_from(["next", "hf"]),
)
def test_causal_labels_match_the_packed_view(
    tmp_path_factory, pairs, eot, source, world_size, shift
):
    """Either label shift (one option of both packers' RowOptions)."""
    seqlen = 12
    store = mmpack.build(tmp_path_factory.mktemp("s") / "m", _docs(pairs), fsync=False)
    if source == "subset":  # every other document
        store = store.select(np.arange(0, len(store), 2))
    want = _view_segments(store, seqlen, eot, shift)
    got = []
    for rank in range(world_size or 1):
        src = store if source in ("store", "subset") else _source(_docs(pairs), source)
        ranks = {} if world_size is None else {"rank": rank, "world_size": world_size}
        got += _packer_segments(_packer(src, seqlen, eot, label_shift=shift, **ranks))
    assert sorted(got) == want


def test_a_masked_store_masks_the_labels(tmp_path):
    # The one rule on a small case: targets[t] = ids[t + 1] where that token is a target.
    docs = [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}]
    store = mmpack.build(tmp_path / "s", docs, fsync=False)
    (batch,) = _packer(store, 8, EOT, batch_size=1, buffer_size=1)
    assert batch["targets"][0].tolist() == [IGNORE, 3, 4, EOT, IGNORE, IGNORE, IGNORE, IGNORE]
    (batch,) = _packer(docs, 8, None, batch_size=1, buffer_size=1)
    assert batch["targets"][0].tolist() == [IGNORE, 3, 4, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]


@settings(max_examples=30, deadline=None)
@given(pairs=docs_and_masks, seed=st.integers(0, 2**32 - 1), masked_store=st.booleans())
def test_mlm_selects_only_target_tokens(tmp_path_factory, pairs, seed, masked_store):
    # The corruption draws per (seed, epoch, row, position): with a mask, the selected
    # positions are those selected without it that are targets, corrupted alike.
    plain_docs = [[t for t, _ in d] for d in pairs]
    masks: dict[tuple[int, ...], list[int]] = {}
    for d, p in zip(plain_docs, pairs):  # the check finds a document's mask by its tokens
        assume(masks.setdefault(tuple(d), [f for _, f in p]) == [f for _, f in p])
    tmp = tmp_path_factory.mktemp("mlm")
    kw = dict(mode="mlm", mask_prob=0.5, mask_id=60, vocab_size=64, seed=seed)
    if masked_store:
        source = mmpack.build(tmp / "m", _docs(pairs), fsync=False)
    else:
        source = _docs(pairs)
    got = list(_packer(source, 12, EOT, **kw))
    free = list(_packer(plain_docs, 12, EOT, **kw))
    clean = list(_packer(plain_docs, 12, EOT, batch_size=2, buffer_size=4))
    assert len(got) == len(free) == len(clean)
    flags_of = {tuple(d): [f for _, f in p] + [1] for d, p in zip(plain_docs, pairs)}
    for g, f, c in zip(got, free, clean):
        flags = np.zeros_like(g["input_ids"], dtype=bool)
        for r, cu in enumerate(c["cu_seqlens"]):
            cu = np.asarray(cu).tolist()
            for a, b in zip(cu[:-1], cu[1:]):
                if c["attention_mask"][r, a]:
                    flags[r, a:b] = flags_of[tuple(c["input_ids"][r, a : b - 1].tolist())]
        np.testing.assert_array_equal(g["targets"], np.where(flags, f["targets"], IGNORE))
        np.testing.assert_array_equal(
            g["input_ids"], np.where(flags, f["input_ids"], c["input_ids"])
        )


def test_a_resumed_packer_keeps_the_masks(tmp_path):
    rng = np.random.default_rng(3)
    pairs = [[(int(t), int(m)) for t, m in zip(rng.integers(1, 40, n), rng.integers(0, 2, n))]
             for n in rng.integers(1, 12, 60)]  # fmt: skip
    store = mmpack.build(tmp_path / "s", _docs(pairs), fsync=False)
    for source in (store, _docs(pairs)):
        whole = list(_packer(source, 12, EOT))
        packer = _packer(source, 12, EOT)
        it = iter(packer)
        first = [next(it) for _ in range(5)]
        state = packer.state_dict()
        again = _packer(source, 12, EOT)
        again.load_state_dict(state)
        rest = list(again)
        assert len(first) + len(rest) == len(whole)
        for a, b in zip(first + rest, whole):
            np.testing.assert_array_equal(a["targets"], b["targets"])
        assert _packer_segments(first + rest) == _view_segments(store, 12, EOT)


def test_documents_with_and_without_a_mask_are_refused():
    docs = [{"input_ids": [1, 2], "loss_mask": [1, 0]}, {"input_ids": [3, 4]}]
    with pytest.raises(ValueError, match="document 1 has no loss_mask"):
        list(_packer(docs, 8, None))
    with pytest.raises(ValueError, match="document 1 has a loss_mask"):
        list(_packer(iter(docs[::-1]), 8, None))
    with pytest.raises(ValueError, match="loss_mask has 1 values but input_ids has 2"):
        list(_packer([{"input_ids": [1, 2], "loss_mask": [1]}], 8, None))


def test_packer_dataset_labels_are_masked(tmp_path):
    from mmpack.torch import PackerDataset

    docs = [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}]
    store = mmpack.build(tmp_path / "s", docs, fsync=False)
    ds = PackerDataset(store, batch_size=1, seqlen=8, buffer_size=1, mode="causal", eot=EOT,
                       drop_last=False)  # fmt: skip
    (batch,) = list(ds)
    assert batch["targets"][0].tolist() == [IGNORE, 3, 4, EOT, IGNORE, IGNORE, IGNORE, IGNORE]
