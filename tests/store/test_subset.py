"""Subsets without rewriting (mmpack._src.store.subset): select / where / split give stores whose
views, plans, samplers and mixtures equal those of a store built from just their documents,
whose fingerprints key plans apart, and whose document ids name the parent's documents."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _contract import assert_views_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import Mixture
from mmpack._src.store.subset import SubsetBackend, token_source

pytestmark = pytest.mark.usefixtures("cache_home")


def _docs(rng, n, masked=False):
    docs = []
    for _ in range(n):
        k = int(rng.choice([0, int(rng.integers(1, 40)), int(rng.integers(60, 200))]))
        ids = rng.integers(0, 65000, size=k).astype(np.uint16)
        docs.append({"input_ids": ids, "loss_mask": rng.integers(0, 2, size=k)} if masked else ids)
    return docs


def _tokens(doc):
    return doc["input_ids"] if isinstance(doc, dict) else doc


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), masked=st.booleans())
def test_a_subset_reads_as_the_store_of_its_documents(n, seed, masked, tmp_path_factory):
    rng = np.random.default_rng(seed)
    docs = _docs(rng, n, masked)
    tmp = tmp_path_factory.mktemp("s")
    store = mmpack.build(tmp / "s", docs, fsync=False)
    keep = np.flatnonzero(rng.random(n) < 0.5)
    if keep.size == 0:
        keep = np.array([n - 1])
    sub = store.select(keep)
    just = mmpack.build(tmp / "just", [docs[j] for j in keep], fsync=False)
    assert type(sub) is mmpack.TokenStore and sub.parent is store
    assert sub.has_loss_mask == masked
    assert token_source(sub)[0] is store and token_source(store)[0] is store
    np.testing.assert_array_equal(token_source(sub)[1], store.offsets[keep])
    assert_views_equal(sub, just, seqlen=16, same_fingerprint=False)
    # MLM selects only target tokens: the masks too are read from the parent's
    mlm = {"eot": 65535, "mode": "mlm", "mask_id": 65534, "vocab_size": 65536, "mask_prob": 0.5}
    a, b = (mmpack.PackedDataset(s, 16, **mlm) for s in (sub, just))
    got, want = a.__getitems__(np.arange(len(b))), b.__getitems__(np.arange(len(b)))
    for key in want.columns:
        np.testing.assert_array_equal(got.columns[key], want.columns[key])
    # flat reads across document boundaries: the naive concatenation of the kept documents
    flat = np.concatenate([_tokens(docs[j]) for j in keep] + [np.zeros(0, np.uint16)])
    starts = rng.integers(0, sub.num_tokens + 1, size=23)
    lens = np.minimum(rng.integers(0, 300, size=23), sub.num_tokens - starts)
    src, at = sub.read_ranges(starts.astype(np.int64), lens.astype(np.int64))
    for a, b, k in zip(starts.tolist(), np.asarray(at).tolist(), lens.tolist()):
        np.testing.assert_array_equal(np.asarray(src)[b : b + k], flat[a : a + k])
    if masked:
        want = np.concatenate([np.asarray(docs[j]["loss_mask"], np.uint8) for j in keep])
        mask = sub.loss_mask
        got, at = mask.read_ranges(np.array([0]), np.array([mask.num_tokens]))
        np.testing.assert_array_equal(got[at[0] : at[0] + mask.num_tokens], want)
    again = pickle.loads(pickle.dumps(sub))
    assert again.fingerprint == sub.fingerprint
    np.testing.assert_array_equal(again.parent_doc_ids, keep)


def test_provenance_names_the_parent_documents(tmp_path):
    docs = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    store = mmpack.build(tmp_path / "s", docs)
    sub = store.select([1, 3])
    assert store.parent_doc_ids is None
    assert sub.parent_doc_ids.dtype == np.int64 and sub.parent_doc_ids.tolist() == [1, 3]
    packed = mmpack.PackedDataset(sub, 8, eot=0)
    assert sorted(p["doc"] for i in range(len(packed)) for p in packed.locate(i)) == [1, 3]
    window = mmpack.WindowDataset(sub, 2, eot=0)
    assert {p["doc"] for i in range(len(window)) for p in window.locate(i)} == {1, 3}
    # a subset of a subset names the first parent's documents
    inner = sub.select([1])
    assert inner.parent is store and inner.parent_doc_ids.tolist() == [3]
    np.testing.assert_array_equal(inner[0], docs[3])


def test_a_subset_is_a_token_store_over_its_parent(tmp_path):
    """A subset is a plain ``TokenStore`` over a ``SubsetBackend`` holding the parent: every
    store answers ``parent`` / ``parent_doc_ids`` / ``parent_doc_starts`` / ``split_depth``
    (None, None, None, 0 for a store that holds its tokens), and a pickle keeps a subset one."""
    store = mmpack.build(tmp_path / "s", [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]], fsync=False)
    assert (store.parent, store.parent_doc_ids, store.parent_doc_starts, store.split_depth) == (
        None,
        None,
        None,
        0,
    )
    part = store.split({"a": 0.5, "b": 0.5}, seed=3)["a"].select([0])
    assert type(part) is mmpack.TokenStore and isinstance(part._backend, SubsetBackend)
    assert part.parent is store and part.split_depth == 1 and part.backend == "subset"
    np.testing.assert_array_equal(part.parent_doc_starts, store.offsets[part.parent_doc_ids])
    assert repr(part).startswith(f"TokenStore({store.location!r}, subset, docs=1 of 4")
    assert part.extra == store.extra and part.verify() == store.verify()
    again = pickle.loads(pickle.dumps(part))
    assert type(again) is mmpack.TokenStore and again.parent.fingerprint == store.fingerprint
    assert (again.split_depth, again.fingerprint) == (1, part.fingerprint)
    np.testing.assert_array_equal(again[0], part[0])


def test_fingerprints_key_plans_apart(tmp_path):
    store = mmpack.build(
        tmp_path / "s", [[k] * (k + 1) for k in range(30)], fields={"k": list(range(30))}
    )
    a, b = store.select(list(range(0, 30, 2))), store.select(list(range(1, 30, 2)))
    assert len({store.fingerprint, a.fingerprint, b.fingerprint}) == 3
    assert store.where(np.arange(30) % 2 == 0).fingerprint == a.fingerprint
    pa = mmpack.PackedDataset(a, 16, eot=0)
    pb = mmpack.PackedDataset(b, 16, eot=0)
    cached = sorted(p.name for p in store.cache_dir.glob("plan-*"))
    assert len(cached) == 2  # one plan per subset, in the parent's cache
    again = mmpack.PackedDataset(store.select(list(range(0, 30, 2))), 16, eot=0)
    assert sorted(p.name for p in store.cache_dir.glob("plan-*")) == cached
    np.testing.assert_array_equal(again[0]["input_ids"], pa[0]["input_ids"])
    assert pa[0]["input_ids"].tolist() != pb[0]["input_ids"].tolist()


def test_where_on_fields(tmp_path):
    store = mmpack.build(
        tmp_path / "s",
        [[1], [2], [3], [4]],
        fields={
            "source": [3, 1, 3, 2],
            "lang": ["en", "fr", "fr", "en"],
            "q": [0.1, 0.2, 0.3, 0.4],
        },
    )
    assert store.where(source=3).parent_doc_ids.tolist() == [0, 2]
    assert store.where(lang="fr").parent_doc_ids.tolist() == [1, 2]
    assert store.where(lang="fr", source=3).parent_doc_ids.tolist() == [2]
    assert store.where(store.fields["q"] > 0.25).parent_doc_ids.tolist() == [2, 3]
    sub = store.where(lang="en")
    assert sub.fields["source"].tolist() == [3, 2] and sub.field_categories("lang") == ("en", "fr")
    assert len(store.where(source=9)) == 0
    with pytest.raises(ValueError, match="no category 'de'"):
        store.where(lang="de")
    with pytest.raises(TypeError, match="holds numbers"):
        store.where(source="3")


def test_split_is_disjoint_covering_seeded_and_stable_when_appending(tmp_path):
    rng = np.random.default_rng(0)
    a = mmpack.build(tmp_path / "a", [[int(v)] for v in rng.integers(1, 100, size=3000)])
    b = mmpack.build(tmp_path / "b", [[5]] * 500)
    parts = a.split({"train": 0.9, "validation": 0.1}, seed=0)
    ids = [p.parent_doc_ids for p in parts.values()]
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(3000))
    assert 200 < len(parts["validation"]) < 400
    again = a.split({"train": 0.9, "validation": 0.1}, seed=0)
    assert again["validation"].fingerprint == parts["validation"].fingerprint
    other = a.split({"train": 0.9, "validation": 0.1}, seed=1)
    assert (
        other["validation"].parent_doc_ids.tolist() != parts["validation"].parent_doc_ids.tolist()
    )
    # appending parts keeps every earlier document in its part
    one = mmpack.join([a.location], tmp_path / "j1")
    two = mmpack.join([a.location, b.location], tmp_path / "j2")
    for name in ("train", "validation"):
        before = one.split({"train": 0.9, "validation": 0.1})[name].parent_doc_ids
        after = two.split({"train": 0.9, "validation": 0.1})[name].parent_doc_ids
        np.testing.assert_array_equal(after[after < 3000], before)
        np.testing.assert_array_equal(before, parts[name].parent_doc_ids)
    # a subset's split is the parent's restricted to it
    sub = a.select(np.arange(0, 3000, 3))
    val = sub.split({"train": 0.9, "validation": 0.1})["validation"].parent_doc_ids
    np.testing.assert_array_equal(
        val, np.intersect1d(parts["validation"].parent_doc_ids, sub.parent_doc_ids)
    )
    assert len(a.split({"all": 1.0})["all"]) == 3000


def test_a_split_of_a_split_is_exact_whatever_the_seeds(tmp_path):
    """A part split again with the same seed (the default) gets its fractions: its keys are
    not those that chose its documents (a 95/5 split of a 90% part held an empty 5%).  A
    ``select`` or ``where`` of a part splits as the part does, restricted to it; pickling keeps
    it; a ``where`` of the store still splits as the store does."""
    import pickle

    store = mmpack.build(tmp_path / "s", [[k % 50 + 1] for k in range(20_000)])
    parts = store.split({"train": 0.9, "dev": 0.1})
    train = parts["train"]
    for seed in (0, 1):
        inner = train.split({"train": 0.95, "dev": 0.05}, seed=seed)
        n = len(train)
        assert abs(len(inner["dev"]) - 0.05 * n) < 5 * (0.05 * 0.95 * n) ** 0.5, len(inner["dev"])
        ids = np.concatenate([p.parent_doc_ids for p in inner.values()])
        assert np.array_equal(np.sort(ids), train.parent_doc_ids)
        deeper = inner["train"].split({"a": 0.5, "b": 0.5}, seed=seed)
        assert (
            abs(len(deeper["a"]) - len(inner["train"]) / 2) < 5 * (len(inner["train"]) / 4) ** 0.5
        )
    assert (train.split_depth, inner["dev"].split_depth, store.where(None).split_depth) == (1, 2, 0)
    inner = train.split({"train": 0.95, "dev": 0.05})
    some = train.select(np.arange(0, len(train), 2))
    np.testing.assert_array_equal(
        some.split({"train": 0.95, "dev": 0.05})["dev"].parent_doc_ids,
        np.intersect1d(inner["dev"].parent_doc_ids, some.parent_doc_ids),
    )
    again = pickle.loads(pickle.dumps(train)).split({"train": 0.95, "dev": 0.05})
    np.testing.assert_array_equal(again["dev"].parent_doc_ids, inner["dev"].parent_doc_ids)


def test_a_mixture_weighs_subsets_of_one_store(tmp_path):
    store = mmpack.build(
        tmp_path / "s", [[k + 1] * 5 for k in range(40)], fields={"src": [k % 2 for k in range(40)]}
    )
    even, odd = store.where(src=0), store.where(src=1)
    views = [mmpack.WindowDataset(s, 4, eot=0) for s in (even, odd)]
    mix = Mixture(views, [0.75, 0.25], seed=0)
    for i in range(0, len(mix), max(1, len(mix) // 40)):
        source, _ = mix.source_of(i)
        assert (int(mix[i]["input_ids"][0]) - 1) % 2 == source or mix[i]["input_ids"][0] == 0


def test_an_empty_subset_is_a_store(tmp_path):
    store = mmpack.build(tmp_path / "s", [[1, 2], [3]])
    empty = store.select([])
    assert len(empty) == 0 and empty.num_tokens == 0
    src, at = empty.read_ranges(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert src.size == 0 and at.size == 0
    assert len(mmpack.WindowDataset(empty, 4)) == 0


def test_region_plans_megatron_and_workers_take_subsets(tmp_path):
    from _contract import assert_workers_serve

    from mmpack.formats import MegatronGPTDataset

    rng = np.random.default_rng(7)
    docs = _docs(rng, 120)
    store = mmpack.build(tmp_path / "s", docs, fsync=False)
    keep = np.flatnonzero(rng.random(120) < 0.4)
    sub = store.select(keep)
    just = mmpack.build(tmp_path / "just", [docs[j] for j in keep], fsync=False)
    for make in (
        lambda s: mmpack.PackedDataset(s, 64, eot=0, region_tokens=256),
        lambda s: MegatronGPTDataset(s, 32, seed=1, eot=0, cache=False),
    ):
        a, b = make(sub), make(just)
        assert len(a) == len(b)
        for i in range(len(a)):
            for key, value in b[i].items():
                np.testing.assert_array_equal(a[i][key], value)
    ds = mmpack.PackedDataset(sub, 64, eot=0)  # a ResumableSampler's batches, two workers
    assert_workers_serve(ds, mmpack.PackedDataset(just, 64, eot=0), "fork")


def test_a_join_refuses_a_subset_as_a_part(tmp_path):
    store = mmpack.build(tmp_path / "s", [[1], [2], [3]])
    with pytest.raises(ValueError, match="part 0 is a subset"):
        mmpack.join([store.select([1])], tmp_path / "j")
    assert not (tmp_path / "j").exists()
