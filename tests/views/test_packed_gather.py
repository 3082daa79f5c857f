"""The packed view's MLM targets (mmpack._src.views.packed_gather.mlm_targets): the masking's
statistics, a function of seed, epoch and index (the epoch an index carries included), the edges
of mask_prob, and int32 rows equal to int64."""

from __future__ import annotations

import numpy as np
import pytest
from reference import IGNORE

from mmpack import PackedDataset, build


@pytest.fixture(scope="module")
def mlm_store(tmp_path_factory):
    rng = np.random.default_rng(5)
    lens = rng.lognormal(5.48, 1.15, 5200).astype(np.int64) + 1
    docs = []
    for n in lens:
        doc = rng.integers(10, 1000, n)
        doc[rng.random(n) < 0.05] = 1  # a special id inside the documents
        docs.append(doc)
    return build(tmp_path_factory.mktemp("mlm") / "s", docs)


def mlm_dataset(store, **kw):
    params = dict(
        eot=3,
        pad_id=0,
        mode="mlm",
        mask_prob=0.3,
        mask_id=4,
        vocab_size=1000,
        special_ids=(1, 2),
        seed=11,
    )
    params.update(kw)
    return PackedDataset(store, 2048, **params)


@pytest.mark.slow
def test_mlm_statistics(mlm_store):
    ds = mlm_dataset(mlm_store)
    plain = PackedDataset(mlm_store, 2048, eot=3, pad_id=0)
    idx = np.arange(len(ds))
    got = ds.__getitems__(idx)
    ids = np.stack([g["input_ids"] for g in got])
    labels = np.stack([g["labels"] for g in got])
    orig = np.stack([g["input_ids"] for g in plain.__getitems__(idx)])
    attn = np.stack([g["attention_mask"] for g in got])
    special = np.isin(orig, [1, 2, 3, 4]) | (attn == 0)
    maskable = ~special
    n = int(maskable.sum())
    assert n > 1_000_000
    selected = labels != IGNORE
    # Selected positions are exactly the maskable ones with a label equal to the original token.
    assert not (selected & special).any()
    assert (labels[selected] == orig[selected]).all()
    assert (ids[special] == orig[special]).all()  # specials, eot and padding untouched
    assert (ids[~selected] == orig[~selected]).all()
    frac = selected.sum() / n
    assert abs(frac - 0.3) < 0.003  # sd ~ 4.5e-4
    k = int(selected.sum())
    to_mask = selected & (ids == 4)
    changed = selected & (ids != 4) & (ids != orig)
    kept = selected & (ids == orig)
    assert abs(to_mask.sum() / k - 0.8) < 0.004  # sd ~ 7e-4
    assert abs((changed.sum() + kept.sum()) / k - 0.2) < 0.004
    assert abs(changed.sum() / k - 0.1 * (1 - 1 / 995)) < 0.003
    random_ids = ids[changed]
    assert random_ids.min() >= 0 and random_ids.max() < 1000
    assert not np.isin(random_ids, [0, 1, 2, 3, 4]).any()  # never special, eot, mask or pad


def test_mlm_is_a_function_of_seed_epoch_index(mlm_store):
    ds = mlm_dataset(mlm_store)
    a = ds[5]["input_ids"].copy()
    assert np.array_equal(ds[5]["input_ids"], a)
    assert np.array_equal(mlm_dataset(mlm_store)[5]["input_ids"], a)
    batch = ds.__getitems__([7, 5, 5])
    assert np.array_equal(batch[1]["input_ids"], a) and np.array_equal(batch[2]["input_ids"], a)
    assert not np.array_equal(ds[6]["labels"], ds[5]["labels"])
    ds.set_epoch(1)
    b = ds[5]["input_ids"].copy()
    assert not np.array_equal(a, b)
    ds.set_epoch(0)
    assert np.array_equal(ds[5]["input_ids"], a)
    assert not np.array_equal(mlm_dataset(mlm_store, seed=12)[5]["input_ids"], a)
    # The packing is identical in both modes.
    plain = PackedDataset(mlm_store, 2048, eot=3, pad_id=0)
    assert np.array_equal(plain.plan.piece_doc, ds.plan.piece_doc)
    s, p = ds[5], plain[5]
    assert np.array_equal(s["cu_seqlens"], p["cu_seqlens"])
    assert np.array_equal(s["attention_mask"], p["attention_mask"])
    with pytest.raises(ValueError):
        ds.set_epoch(-1)


def test_mlm_mask_prob_edges(mlm_store):
    none = mlm_dataset(mlm_store, mask_prob=0.0)[0]
    assert (none["labels"] == IGNORE).all()
    every = mlm_dataset(mlm_store, mask_prob=1.0)[0]
    real = every["attention_mask"] == 1
    orig = PackedDataset(mlm_store, 2048, eot=3)[0]["input_ids"]
    maskable = real & ~np.isin(orig, [1, 2, 3, 4])
    assert ((every["labels"] != IGNORE) == maskable).all()


def test_mlm_uses_the_epoch_an_index_carries(mlm_store):
    """Indices from a ResumableSampler carry their epoch (EpochIndex); the MLM key uses it, so
    the epoch needs no ``set_epoch`` on the dataset (which persistent workers never see)."""
    from mmpack.store import EpochIndex

    ds = mlm_dataset(mlm_store)
    per_epoch = []
    for e in (0, 1, 2):
        ref = mlm_dataset(mlm_store)
        ref.set_epoch(e)
        per_epoch.append({i: ref[i] for i in (4, 5, 6)})
    assert ds.epoch == 0
    for e in (0, 1, 2):
        got = ds[EpochIndex(5, e)]
        for key in ("input_ids", "labels"):
            assert np.array_equal(got[key], per_epoch[e][5][key])
    # a batch mixing epochs (and a plain int, which takes the dataset's epoch)
    batch = ds.__getitems__([EpochIndex(4, 2), EpochIndex(5, 1), 6, EpochIndex(5, 1)])
    want = [per_epoch[2][4], per_epoch[1][5], per_epoch[0][6], per_epoch[1][5]]
    for got, ref in zip(batch, want):
        assert np.array_equal(got["input_ids"], ref["input_ids"])
        assert np.array_equal(got["labels"], ref["labels"])
    assert not np.array_equal(per_epoch[1][5]["input_ids"], per_epoch[0][5]["input_ids"])
    ds.set_epoch(2)  # plain ints follow set_epoch; carried epochs do not
    assert np.array_equal(ds[5]["input_ids"], per_epoch[2][5]["input_ids"])
    assert np.array_equal(ds[EpochIndex(5, 0)]["input_ids"], per_epoch[0][5]["input_ids"])


def test_int32_mlm_matches_int64(mlm_store):
    """The MLM corruption of an int32 view is the int64 view's, value for value."""
    wide, narrow = mlm_dataset(mlm_store), mlm_dataset(mlm_store, dtype="int32")
    for i in (0, 3, len(wide) - 1):
        a, b = wide[i], narrow[i]
        assert b["input_ids"].dtype == np.int32 and b["labels"].dtype == np.int32
        for key in ("input_ids", "labels", "position_ids", "attention_mask", "cu_seqlens"):
            assert a[key].tolist() == b[key].tolist(), key
    batch = narrow.__getitems__([0, 3])
    assert [s["input_ids"].tolist() for s in batch] == [
        wide[0]["input_ids"].tolist(),
        wide[3]["input_ids"].tolist(),
    ]
