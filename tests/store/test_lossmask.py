"""Per-token loss masks in the store (``mmpack._src.store.lossmask``): built from document dicts on
every layout (local memmap and Zarr, ``file://``, S3 memmap and Zarr on a real SeaweedFS server,
joins), read back equal to what was given, checksummed and covered by the fingerprint; bad
input refused naming the document, with nothing written."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from _contract import LAYOUTS, assert_views_equal
from _zarr_stores import _small
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack._src.store.format import LOSS_MASK_STORE
from mmpack.errors import FormatError


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    _small(monkeypatch)


def masked_docs(rng: np.random.Generator, lengths: list[int]) -> list[dict]:
    """Documents with random masks in the forms a user gives them (lists of ints, numpy bools,
    numpy integers)."""
    docs = []
    for k, n in enumerate(lengths):
        ids = rng.integers(0, 65536, size=n).astype(np.uint16)
        mask = rng.integers(0, 2, size=n)
        form = k % 3
        given = mask.tolist() if form == 0 else mask.astype(bool) if form == 1 else mask
        docs.append({"input_ids": ids, "loss_mask": given})
    return docs


def _mask_of(doc: dict) -> np.ndarray:
    return np.asarray(doc["loss_mask"]).astype(np.uint8)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=3, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=3, max_size=30),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_layout_keeps_the_mask(layout, lengths, seed, s3_server, tmp_path_factory):
    docs = masked_docs(np.random.default_rng(seed), [*lengths, 40])  # a window at least
    tmp = tmp_path_factory.mktemp(layout)
    reference = mmpack.build(tmp / "reference", docs, fsync=False)
    store = LAYOUTS[layout](tmp, docs, s3=s3_server)
    assert store.has_loss_mask and reference.has_loss_mask
    if layout != "joined-parts":
        assert store.fingerprint == reference.fingerprint
    mask = store.loss_mask
    assert mask is not None and mask.dtype == np.uint8 and len(mask) == len(docs)
    np.testing.assert_array_equal(mask.offsets, store.offsets)
    for j, doc in enumerate(docs):
        np.testing.assert_array_equal(mask[j], _mask_of(doc))
        np.testing.assert_array_equal(store[j], doc["input_ids"])
    want = np.concatenate([_mask_of(d) for d in docs])
    rng = np.random.default_rng(seed + 1)
    starts = rng.integers(0, store.num_tokens + 1, size=17)
    lens = np.minimum(rng.integers(0, 90, size=17), store.num_tokens - starts)
    src, at = mask.read_ranges(starts.astype(np.int64), lens.astype(np.int64))
    for a, b, n in zip(starts.tolist(), np.asarray(at).tolist(), lens.tolist()):
        np.testing.assert_array_equal(np.asarray(src)[b : b + n], want[a : a + n])
    checked, own = store.verify(), mask.verify()  # the mask's blocks come with the tokens'
    assert checked["bytes"] >= own["bytes"] + store.offsets.nbytes + store.num_tokens * 2
    again = pickle.loads(pickle.dumps(mask))
    np.testing.assert_array_equal(again[len(docs) - 1], _mask_of(docs[-1]))
    # the views' labels (the mask read through read_ranges off the mapping) are the reference's
    assert_views_equal(
        store, reference, seqlen=16, every_row=False, same_fingerprint=layout != "joined-parts"
    )


def test_the_mask_is_part_of_the_fingerprint(tmp_path):
    ids = [[1, 2, 3], [4, 5]]
    plain = mmpack.build(tmp_path / "plain", ids)
    ones = mmpack.build(
        tmp_path / "ones", [{"input_ids": d, "loss_mask": [1] * len(d)} for d in ids]
    )
    other = mmpack.build(
        tmp_path / "other",
        [
            {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
            {"input_ids": [4, 5], "loss_mask": [1, 1]},
        ],
    )
    assert len({plain.fingerprint, ones.fingerprint, other.fingerprint}) == 3
    assert not plain.has_loss_mask and plain.loss_mask is None
    assert "loss_mask" not in plain.meta and ones.meta["loss_mask"]["store"] == LOSS_MASK_STORE
    # a dict without loss_mask is a document without one
    same = mmpack.build(tmp_path / "same", [{"input_ids": d} for d in ids])
    assert same.fingerprint == plain.fingerprint and not same.has_loss_mask


def test_masks_in_every_form(tmp_path):
    import torch

    docs = [
        {"input_ids": [1, 2], "loss_mask": [True, False]},
        {"input_ids": np.array([3, 4, 5]), "loss_mask": torch.tensor([0, 1, 1])},
        {"input_ids": torch.tensor([6]), "loss_mask": torch.tensor([True])},
        {"input_ids": [], "loss_mask": []},
        {"input_ids": [7, 8], "loss_mask": np.array([1, 0], dtype=np.int8)},
    ]
    store = mmpack.build(tmp_path / "s", iter(docs))
    mask = store.loss_mask
    got = [mask[j].tolist() for j in range(len(docs))]
    assert got == [[1, 0], [0, 1, 1], [1], [], [1, 0]]


def test_a_refilled_buffer_keeps_each_document_as_given(tmp_path):
    ids, mask = np.zeros(4, dtype=np.uint16), np.zeros(4, dtype=np.uint8)

    def source():
        for k in range(3):
            ids[:] = k + 1
            mask[:] = [k % 2, 1, 0, 1]
            yield {"input_ids": ids, "loss_mask": mask}

    store = mmpack.build(tmp_path / "s", source())
    assert [store[j].tolist() for j in range(3)] == [[k + 1] * 4 for k in range(3)]
    assert [store.loss_mask[j].tolist() for j in range(3)] == [
        [0, 1, 0, 1],
        [1, 1, 0, 1],
        [0, 1, 0, 1],
    ]


BAD = [
    (
        [{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}],
        ValueError,
        "document 0: loss_mask has 2 values but input_ids has 3 tokens",
    ),
    (
        [{"input_ids": [1, 2], "loss_mask": [1, 1]}, {"input_ids": [1, 2], "loss_mask": [0, 2]}],
        ValueError,
        r"document 1: loss_mask\[1\] is 2; a loss mask holds 0",
    ),
    (
        [{"input_ids": [1], "loss_mask": [0.5]}],
        ValueError,
        "document 0: loss_mask holds float64 values",
    ),
    (
        [{"input_ids": [1], "loss_mask": [-1]}],
        ValueError,
        r"document 0: loss_mask\[0\] is -1",
    ),
    ([{"input_ids": [1, 2], "loss_mask": [[1, 1]]}], TypeError, "loss_mask has shape"),
    ([{"input_ids": [1, 2], "loss_mask": "11"}], TypeError, "loss_mask is str"),
    (
        [[1, 2], [3], {"input_ids": [1, 2], "loss_mask": [1, 1]}],
        ValueError,
        "document 2 has a loss_mask but documents 0 to 1 have none",
    ),
    (
        [[1, 2], {"input_ids": [1, 2], "loss_mask": [1, 1]}],
        ValueError,
        "document 1 has a loss_mask but document 0 before it has none",
    ),
    (
        [{"input_ids": [1, 2], "loss_mask": [1, 1]}, [3, 4]],
        ValueError,
        "document 1 has no loss_mask but the documents before it have one",
    ),
    (
        [{"input_ids": [1, 2], "loss_mask": [1, 1]}, np.array([3, 4])],
        ValueError,
        "document 1 has no loss_mask",
    ),
    (
        [{"input_ids": [1, 2], "loss_mask": [1, 1]}, {"input_ids": [3]}],
        ValueError,
        "document 1 has no loss_mask",
    ),
    (
        [{"input_ids": [1, 2], "attention_mask": [1, 1]}],
        ValueError,
        r"document 0 has keys \['attention_mask'\]",
    ),
    ([{"loss_mask": [1, 1]}], ValueError, "document 0 has no 'input_ids'"),
    (
        [{"input_ids": [1, -2], "loss_mask": [1, 1]}],
        ValueError,
        "document 0 has a negative token -2",
    ),
]


@pytest.mark.parametrize("source", ["list", "iterator"])
@pytest.mark.parametrize("docs, kind, message", BAD)
def test_bad_masks_are_refused_and_nothing_is_written(tmp_path, docs, kind, message, source):
    with pytest.raises(kind, match=message):
        mmpack.build(tmp_path / "s", docs if source == "list" else iter(docs))
    assert os.listdir(tmp_path) == []  # no store, no temporary folder


def test_a_bad_document_leaves_the_writer_usable(tmp_path):
    from mmpack.store import StoreWriter

    with StoreWriter(tmp_path / "s") as w:
        w.add({"input_ids": [1, 2], "loss_mask": [0, 1]})
        with pytest.raises(ValueError, match="document 1: loss_mask has 1 values"):
            w.add({"input_ids": [3, 4], "loss_mask": [1]})
        with pytest.raises(ValueError, match="document 1 has no loss_mask"):
            w.add([5])
        w.add({"input_ids": [6], "loss_mask": [1]})
        with pytest.raises(ValueError, match=r"document 3: loss_mask\[1\] is 3"):  # 2 is kept
            w.add_many(
                [{"input_ids": [9], "loss_mask": [0]}, {"input_ids": [7, 8], "loss_mask": [1, 3]}]
            )
    store = w.store
    assert [store[j].tolist() for j in range(len(store))] == [[1, 2], [6], [9]]
    assert [store.loss_mask[j].tolist() for j in range(len(store))] == [[0, 1], [1], [0]]


def test_flat_batches_carry_no_mask(tmp_path):
    from mmpack.store import StoreWriter

    with StoreWriter(tmp_path / "s") as w:
        w.add({"input_ids": [1, 2], "loss_mask": [0, 1]})
        with pytest.raises(ValueError, match="document 1 has no loss_mask"):
            w.add_batch(np.array([3, 4, 5]), np.array([1, 2]))
    assert len(w.store) == 1 and w.store.loss_mask[0].tolist() == [0, 1]
    with StoreWriter(tmp_path / "t") as w:
        w.add_batch(np.array([3, 4, 5]), np.array([1, 2]))
        with pytest.raises(ValueError, match="document 2 has a loss_mask but documents 0 to 1"):
            w.add({"input_ids": [1], "loss_mask": [1]})
    assert not w.store.has_loss_mask


def test_a_changed_mask_fails_verify(tmp_path):
    store = mmpack.build(tmp_path / "s", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}])
    path = tmp_path / "s" / LOSS_MASK_STORE / "tokens.bin"
    os.chmod(path, 0o644)
    path.write_bytes(bytes([1, 1, 1]))
    with pytest.raises(FormatError, match="tokens stripe 0 .* fails its checksum"):
        mmpack.open(tmp_path / "s").verify()
    del store


def test_another_mask_store_is_refused(tmp_path):
    mmpack.build(tmp_path / "s", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}])
    mmpack.build(tmp_path / "t", [{"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]}])
    target = tmp_path / "s" / LOSS_MASK_STORE
    os.rename(target, tmp_path / "kept")
    os.rename(tmp_path / "t" / LOSS_MASK_STORE, target)
    store = mmpack.open(tmp_path / "s")
    assert store.has_loss_mask  # the metadata alone: nothing opened yet
    with pytest.raises(FormatError, match="its loss mask store has fingerprint"):
        assert store.loss_mask is None


def test_a_missing_mask_store_is_an_error(tmp_path):
    mmpack.build(tmp_path / "s", [{"input_ids": [1], "loss_mask": [1]}])
    os.rename(tmp_path / "s" / LOSS_MASK_STORE, tmp_path / "elsewhere")
    with pytest.raises(FormatError, match="its loss mask store .* is missing"):
        assert mmpack.open(tmp_path / "s").loss_mask is None


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_overwrite_replaces_a_masked_store(tmp_path, backend):
    masked = [{"input_ids": [1, 2], "loss_mask": [1, 0]}]
    mmpack.build(tmp_path / "s", masked, backend=backend)
    plain = mmpack.build(tmp_path / "s", [[3, 4]], backend=backend, overwrite=True)
    assert not plain.has_loss_mask and not (tmp_path / "s" / LOSS_MASK_STORE).exists()
    again = mmpack.build(tmp_path / "s", masked, backend=backend, overwrite=True)
    assert again.loss_mask[0].tolist() == [1, 0]


def test_zarr_group_reads_the_mask_with_plain_zarr(tmp_path):
    import zarr

    mmpack.build(tmp_path / "z", [{"input_ids": [5, 6, 7], "loss_mask": [0, 0, 1]}], backend="zarr")
    group = zarr.open_group(str(tmp_path / "z"), mode="r")
    assert group[LOSS_MASK_STORE]["tokens"][:].tolist() == [0, 0, 1]


def test_joins_refuse_parts_with_and_without_masks(tmp_path):
    a = mmpack.build(tmp_path / "a", [{"input_ids": [1], "loss_mask": [1]}])
    b = mmpack.build(tmp_path / "b", [[2]])
    with pytest.raises(ValueError, match=r"part 1 \(.*b\) has no loss mask but part 0"):
        mmpack.join([a, b], tmp_path / "j")
    assert not (tmp_path / "j").exists()
    mmpack.join([a], tmp_path / "j")
    with pytest.raises(ValueError, match="part 1 .* has no loss mask"):
        mmpack.join([b], tmp_path / "j", append=True)
    plain = mmpack.join([b], tmp_path / "jp")
    assert not plain.has_loss_mask and plain.loss_mask is None
    with pytest.raises(ValueError, match="part 1 .* has a loss mask but part 0"):
        mmpack.join([a], tmp_path / "jp", append=True)


def test_a_join_verifies_its_parts_masks(tmp_path):
    a = mmpack.build(tmp_path / "a", [{"input_ids": [1, 2], "loss_mask": [1, 0]}])
    joined = mmpack.join([a, a.location], tmp_path / "j")
    assert joined.loss_mask[1].tolist() == [1, 0]
    path = Path(a.location) / LOSS_MASK_STORE / "tokens.bin"
    os.chmod(path, 0o644)
    path.write_bytes(bytes([0, 0]))
    with pytest.raises(FormatError, match="part 0 .* fails its checksum"):
        mmpack.open(tmp_path / "j").verify()


@pytest.mark.parametrize("export", ["megatron", "flat"])
def test_exports_refuse_a_masked_store(tmp_path, export):
    from mmpack.formats import export_flat, export_megatron

    store = mmpack.build(tmp_path / "s", [{"input_ids": [1, 2], "loss_mask": [1, 0]}])
    with pytest.raises(ValueError, match="has a per-token loss mask, which .* cannot hold"):
        if export == "megatron":
            export_megatron(store, tmp_path / "out")
        else:
            export_flat(store, tmp_path / "out.bin", eos=0)
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_info_shows_the_mask(tmp_path, capsys):
    from mmpack.cli import main

    mmpack.build(tmp_path / "s", [{"input_ids": [1, 2], "loss_mask": [1, 0]}])
    assert main(["info", str(tmp_path / "s")]) == 0
    assert "loss mask    yes" in capsys.readouterr().out
