"""Where a batch came from: ``collate(..., provenance=True)`` and ``SampleBatch.provenance()``
(mmpack._src.views.provenance), entry for entry what each view's ``locate`` says of every row, on
random stores, sequence lengths and strides; for windows, packed rows and mixtures; through a
DataLoader worker; and document ids of a subset store given as its parent's.

(``tests/ingest/test_provenance.py`` is about stores that record their tokenizer.)

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/views/test_provenance.py``
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import mmpack
from mmpack import Mixture, PackedDataset, ResumableSampler, WindowDataset
from mmpack._src.torch.collate import PROVENANCE
from mmpack._src.views.provenance import PIECE_FIELDS, parent_docs, parent_located
from mmpack.torch import Collator, collate

corpora = st.lists(st.lists(st.integers(0, 60000), max_size=30), min_size=1, max_size=20)
KEYS = ("doc", "start", "stop", "eot", "at")


def rows_of(prov, n_rows, keys=KEYS):
    """The batch provenance ``prov`` (tensors or arrays) as one locate-shaped list per row."""
    prov = {k: np.asarray(v) for k, v in prov.items()}
    cu = prov["cu_docs"].tolist()
    assert len(cu) == n_rows + 1 and cu[0] == 0 and cu[-1] == prov["doc"].shape[0]
    assert (np.repeat(np.arange(n_rows), np.diff(cu)) == prov["sample"]).all()
    assert all(prov[k].dtype == np.int64 for k in prov)
    return [
        [{k: int(prov[k][q]) for k in keys} for q in range(cu[r], cu[r + 1])] for r in range(n_rows)
    ]


def draw_indices(data, n):
    return data.draw(st.lists(st.integers(-n, n - 1), max_size=12), label="indices")


@given(
    docs=corpora,
    seqlen=st.integers(1, 16),
    stride=st.integers(1, 20),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
    sampled=st.booleans(),
    data=st.data(),
)
def test_window_batches_say_what_locate_says(
    tmp_path_factory, docs, seqlen, stride, use_eot, labels, drop_last, sampled, data
):
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs)
    eot = 123456 if use_eot else None
    ds = WindowDataset(
        store, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last, sampled_index=sampled
    )
    if len(ds) == 0:
        return
    idx = draw_indices(data, len(ds))
    got = rows_of(ds.__getitems__(idx).provenance(), len(idx))
    assert got == [ds.locate(i) for i in idx]
    if idx:
        batch = collate(ds.__getitems__(idx), provenance=True)
        assert rows_of(batch[PROVENANCE], len(idx)) == got
        assert all(isinstance(v, torch.Tensor) for v in batch[PROVENANCE].values())


@given(
    docs=st.lists(st.lists(st.tuples(st.integers(0, 60000), st.integers(0, 1)), max_size=30),
                  min_size=1, max_size=12),
    seqlen=st.integers(1, 16),
    stride=st.integers(1, 20),
    use_eot=st.booleans(),
    data=st.data(),
)  # fmt: skip
def test_windows_of_a_store_with_a_loss_mask_say_what_locate_says(
    tmp_path_factory, docs, seqlen, stride, use_eot, data
):
    records = [{"input_ids": [t for t, _ in d], "loss_mask": [m for _, m in d]} for d in docs]
    store = mmpack.build(tmp_path_factory.mktemp("m") / "s", records, dtype=np.uint16)
    ds = WindowDataset(store, seqlen, stride, eot=123 if use_eot else None, labels=True)
    if len(ds) == 0:
        return
    idx = draw_indices(data, len(ds))
    assert rows_of(ds.__getitems__(idx).provenance(), len(idx)) == [ds.locate(i) for i in idx]


@given(
    docs=corpora,
    seqlen=st.integers(1, 24),
    use_eot=st.booleans(),
    long_docs=st.sampled_from(["split", "truncate", "drop"]),
    algorithm=st.sampled_from(["bfd", "online", "nextfit"]),
    data=st.data(),
)
def test_packed_batches_say_what_locate_says(
    tmp_path_factory, docs, seqlen, use_eot, long_docs, algorithm, data
):
    store = mmpack.build(tmp_path_factory.mktemp("p") / "s", docs)
    eot = 123456 if use_eot else None
    ds = PackedDataset(
        store, seqlen, eot=eot, long_docs=long_docs, algorithm=algorithm, cache=False
    )
    if len(ds) == 0:
        return
    idx = draw_indices(data, len(ds))
    got = rows_of(ds.__getitems__(idx).provenance(), len(idx))
    assert got == [ds.locate(i) for i in idx]
    # every piece is a segment of the row: its cu_seqlens are the pieces' ends
    for r, i in enumerate(idx):
        ends = [p["at"] + p["stop"] - p["start"] + p["eot"] for p in got[r]]
        assert ends == ds[i]["cu_seqlens"].tolist()[1 : len(ends) + 1]


@given(
    docs_a=corpora,
    docs_b=corpora,
    seqlen=st.integers(1, 12),
    packed=st.booleans(),
    weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=2),
    data=st.data(),
)
def test_mixture_batches_add_the_source(
    tmp_path_factory, docs_a, docs_b, seqlen, packed, weights, data
):
    root = tmp_path_factory.mktemp("m")
    stores = [mmpack.build(root / "a", docs_a), mmpack.build(root / "b", docs_b)]
    if packed:
        views = [PackedDataset(s, seqlen, eot=9, cache=False) for s in stores]
    else:
        views = [WindowDataset(s, seqlen, eot=9, labels=True, drop_last=False) for s in stores]
    if min(len(v) for v in views) == 0:
        return
    mix = Mixture(views, weights=weights, seed=5)
    idx = draw_indices(data, len(mix)) or [0]
    batch = mix.__getitems__(idx)
    got = rows_of(batch.provenance(), len(idx), (*KEYS, "source"))
    assert got == [mix.locate(i) for i in idx]
    assert [row[0]["source"] for row in got if row] == [
        int(batch.columns["source"][r]) for r, row in enumerate(got) if row
    ]


# ----------------------------------------------------------------------------- collate, workers
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 500, int(n)).tolist() for n in rng.integers(0, 60, 400)]
    return mmpack.build(tmp_path_factory.mktemp("s") / "s", docs)


def test_collate_refuses_samples_that_do_not_say_where_they_come_from(store):
    ds = WindowDataset(store, 16)
    with pytest.raises(ValueError, match="__getitems__"):
        collate([ds[0], ds[1]], provenance=True)
    assert "provenance" not in collate(ds.__getitems__([0, 1]))  # off by default


def test_collator_with_padding_keeps_the_provenance(store):
    ds = PackedDataset(store, 40, eot=7, cache=False)
    collator = pickle.loads(pickle.dumps(Collator(pad_to_multiple_of=64, provenance=True)))
    assert "provenance=True" in repr(collator)
    batch = collator(ds.__getitems__([3, 1, 4]))
    assert batch["input_ids"].shape == (3, 64)
    assert rows_of(batch["provenance"], 3) == [ds.locate(i) for i in (3, 1, 4)]
    assert set(batch["provenance"]) == {*PIECE_FIELDS, "cu_docs"}


def test_provenance_leaves_a_dataloader_worker_by_value(store):
    ds = WindowDataset(store, 32, eot=7, labels=True)
    sampler = ResumableSampler(len(ds), seed=1)
    order = list(sampler)
    loader = DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=1,
        collate_fn=Collator(provenance=True),
        drop_last=True,
    )
    for k, batch in enumerate(loader):
        if k == 3:
            break
        idx = order[8 * k : 8 * k + 8]
        assert rows_of(batch["provenance"], 8) == [ds.locate(i) for i in idx]


def test_a_batch_pickles_with_its_provenance(store):
    ds = PackedDataset(store, 40, eot=7, cache=False)
    batch = pickle.loads(pickle.dumps(ds.__getitems__([0, 5])))
    assert rows_of(batch.provenance(), 2) == [ds.locate(0), ds.locate(5)]


# ----------------------------------------------------------------------------- subsets
class _Subset:
    """A store-like stand-in for a subset: documents 0..2 of it are 7, 3 and 11 of its parent."""

    parent_doc_ids = np.array([7, 3, 11], dtype=np.int64)


def test_document_ids_of_a_subset_are_its_parents():
    assert parent_docs(_Subset(), np.array([2, 0, 0, 1])).tolist() == [11, 7, 7, 3]
    plain = np.array([2, 0])
    assert parent_docs(object(), plain) is plain
    pieces = [{"doc": 1, "start": 0, "stop": 2, "eot": 0, "at": 0}]
    assert parent_located(_Subset(), pieces) == [{**pieces[0], "doc": 3}]


def test_views_over_a_subset_report_parent_ids(store):
    ids = np.arange(1, len(store), 2, dtype=np.int64)  # the odd documents of the store
    sub = store.select(ids)
    for ds in (WindowDataset(sub, 24, eot=7), PackedDataset(sub, 48, eot=7, cache=False)):
        located = [ds.locate(i) for i in range(5)]
        assert all(p["doc"] % 2 == 1 for row in located for p in row)
        assert rows_of(ds.__getitems__(range(5)).provenance(), 5) == located
