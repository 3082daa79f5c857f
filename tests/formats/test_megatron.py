"""Megatron ``.bin/.idx`` datasets opened in place, against the real megatron-core: datasets are
built with its own ``IndexedDatasetBuilder``, read back with its ``IndexedDataset`` and sampled
with its ``GPTDataset`` (C++ ``helpers`` included), all on CPU.

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/formats/test_megatron.py``
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import time

import numpy as np
import pytest
from _megatron import (
    GPTDataset,
    IndexedDataset,
    IndexedDatasetBuilder,
    Split,
    build_megatron,
    gpt_config,
    gpt_dataset,
    random_docs,
    torch,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import PackedDataset, WindowDataset
from mmpack._src.formats import foreign
from mmpack._src.formats.megatron import HEADER_BYTES, MegatronStore, open_megatron
from mmpack._src.store.backends._memmap import mapping_of
from mmpack.errors import FormatError, StateMismatchError, StoreNotFoundError

VOCAB = 1000
# megatron-core's builder calls numpy.array(tensor, ...) the numpy-2 way torch warns about
pytestmark = [
    pytest.mark.megatron,
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every derived file goes to a cache inside the test's folder, never ~/.cache; the files a
    test writes are cached although they are seconds old."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 0)


def _data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    return d


def _listing(folder):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


def _megatron_documents(prefix):
    """Each Megatron document as its sequences concatenated, read by Megatron's own reader."""
    ds = IndexedDataset(str(prefix))
    di = ds.document_indices
    out = []
    for d in range(len(di) - 1):
        seqs = [np.asarray(ds[k]) for k in range(int(di[d]), int(di[d + 1]))]
        out.append(np.concatenate(seqs) if seqs else np.empty(0, dtype=ds.index.dtype))
    return out


# ----------------------------------------------------------------------------- documents
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
@pytest.mark.parametrize("split", [False, True])
def test_documents_are_megatrons_documents(tmp_path, dtype, split):
    rng = np.random.default_rng(1)
    vocab = 250 if dtype == np.uint8 else VOCAB
    docs = random_docs(rng, 40, vocab)
    prefix = build_megatron(_data_dir(tmp_path) / "corpus", docs, dtype=dtype, split=split)
    store = mmpack.open(prefix)  # detected: PREFIX.idx exists
    assert isinstance(store, MegatronStore)
    assert store.dtype == np.dtype(f"<u{np.dtype(dtype).itemsize}")
    reference = _megatron_documents(prefix)
    assert len(store) == len(reference) == len(docs)
    for j, (ours, theirs, made) in enumerate(zip(store, reference, docs)):
        np.testing.assert_array_equal(ours, theirs, err_msg=f"document {j}")
        np.testing.assert_array_equal(ours, made, err_msg=f"document {j}")
    assert store.num_tokens == sum(d.size for d in docs)
    # the same store through the explicit format and through either file's path
    for where in (prefix, prefix + ".bin", prefix + ".idx"):
        again = mmpack.open(where, format="megatron")
        np.testing.assert_array_equal(again.offsets, store.offsets)
        assert again.fingerprint == store.fingerprint


def test_empty_dataset(tmp_path):
    prefix = build_megatron(_data_dir(tmp_path) / "empty", [])
    store = mmpack.open(prefix)
    assert len(store) == 0 and store.num_tokens == 0
    assert len(WindowDataset(store, 4)) == 0


def test_merged_dataset_from_builder_add_index(tmp_path):
    rng = np.random.default_rng(2)
    data = _data_dir(tmp_path)
    parts = [random_docs(rng, n, VOCAB) for n in (7, 0, 12)]
    prefixes = [
        build_megatron(data / f"part{k}", docs, split=k == 2) for k, docs in enumerate(parts)
    ]
    merged = IndexedDatasetBuilder(str(data / "merged.bin"), dtype=np.int32)
    for p in prefixes:
        merged.add_index(p)
    merged.finalize(str(data / "merged.idx"))
    store = mmpack.open(data / "merged")
    everything = [d for docs in parts for d in docs]
    assert len(store) == len(everything)
    for ours, made in zip(store, everything):
        np.testing.assert_array_equal(ours, made)
    for ours, theirs in zip(store, _megatron_documents(data / "merged")):
        np.testing.assert_array_equal(ours, theirs)


# ----------------------------------------------------------------------------- GPTDataset
def _gpt(prefix, seqlen, cache):
    ds = IndexedDataset(str(prefix))
    cfg = gpt_config(seqlen, VOCAB, cache)
    return GPTDataset(ds, str(prefix), np.arange(len(ds.sequence_lengths)), None, Split.train, cfg)


@pytest.mark.parametrize("seqlen", [1, 7, 32])
@pytest.mark.parametrize("split", [False, True])
def test_windows_reproduce_gptdataset_unshuffled(tmp_path, monkeypatch, seqlen, split):
    """GPTDataset with its two shuffles turned off (document order and sample order; everything
    else is Megatron's code, the C++ sample index included) gives mmpack's windows of
    ``seqlen + 1`` tokens with stride ``seqlen``, sample for sample."""
    real = gpt_dataset._build_document_index

    def unshuffled(documents, num_epochs, numpy_random_state, separate_final_epoch):
        return np.tile(np.asarray(documents), num_epochs).astype(np.int32)

    monkeypatch.setattr(gpt_dataset, "_build_document_index", unshuffled)
    rng = np.random.default_rng(seqlen)
    docs = random_docs(rng, 60, VOCAB - 2)
    prefix = build_megatron(_data_dir(tmp_path) / "corpus", docs, split=split)
    gpt = _gpt(prefix, seqlen, tmp_path / "megatron-cache")
    np.testing.assert_array_equal(gpt.document_index, np.arange(len(gpt.document_index)))
    gpt.shuffle_index = np.arange(len(gpt), dtype=np.int64)  # unshuffled sample order
    windows = WindowDataset(mmpack.open(prefix), seqlen, labels=True)
    assert len(windows) == len(gpt) > 0
    for i in range(len(gpt)):
        theirs, ours = gpt[i], windows[i]
        np.testing.assert_array_equal(theirs["tokens"].numpy(), ours["input_ids"], err_msg=str(i))
        np.testing.assert_array_equal(theirs["labels"].numpy(), ours["labels"], err_msg=str(i))
    assert real is not unshuffled


def test_windows_reproduce_gptdataset_shuffled_through_its_indexes(tmp_path):
    """The real (shuffled) GPTDataset: sample ``shuffle_index[i]`` of its sample index is window
    ``shuffle_index[i]`` over mmpack's documents taken in its ``document_index`` order."""
    rng = np.random.default_rng(5)
    docs = random_docs(rng, 50, VOCAB - 2)
    prefix = build_megatron(_data_dir(tmp_path) / "corpus", docs)
    seqlen = 16
    gpt = _gpt(prefix, seqlen, tmp_path / "megatron-cache")
    store = mmpack.open(prefix)
    reordered = mmpack.build(tmp_path / "reordered", [store[int(d)] for d in gpt.document_index])
    windows = WindowDataset(reordered, seqlen, labels=True)
    assert len(windows) == len(gpt)
    for i in range(len(gpt)):
        j = int(gpt.shuffle_index[i])
        np.testing.assert_array_equal(gpt[i]["tokens"].numpy(), windows[j]["input_ids"])
        np.testing.assert_array_equal(gpt[i]["labels"].numpy(), windows[j]["labels"])


# ----------------------------------------------------------------------------- zero copy
def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_opening_copies_no_byte_of_the_bin(tmp_path):
    data = _data_dir(tmp_path)
    n = 24 << 20  # 96 MiB of int32 tokens
    b = IndexedDatasetBuilder(str(data / "big.bin"), dtype=np.int32)
    b.add_document(torch.arange(n, dtype=torch.int32) % 50_000, [n // 2, n - n // 2])
    b.add_item(torch.arange(5, dtype=torch.int32))
    b.end_document()
    b.finalize(str(data / "big.idx"))
    before = _rss_bytes()
    store = mmpack.open(data / "big")
    grown = _rss_bytes() - before
    assert grown < 8 << 20, f"opening grew RSS by {grown} bytes"
    tokens = store.tokens
    assert not tokens.flags.writeable and not tokens.flags.owndata
    assert mapping_of(tokens).length == os.path.getsize(data / "big.bin")  # the file's mapping
    assert np.shares_memory(store[0], tokens) and np.shares_memory(store[1], tokens)
    np.testing.assert_array_equal(store[1], np.arange(5))
    np.testing.assert_array_equal(store.doc_lens, [n, 5])
    assert int(store[0][-1]) == (n - 1) % 50_000


# ----------------------------------------------------------------------------- refusals
def _corrupt(prefix, offset, data):
    with open(str(prefix) + ".idx", "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_multimodal_index_is_refused(tmp_path):
    data = _data_dir(tmp_path)
    b = IndexedDatasetBuilder(str(data / "mm.bin"), dtype=np.int32, multimodal=True)
    b.add_item(torch.arange(4), mode=1)
    b.add_item(torch.arange(3), mode=0)
    b.end_document()
    b.finalize(str(data / "mm.idx"))
    with pytest.raises(FormatError, match="multimodal"):
        mmpack.open(data / "mm")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p: _corrupt(p, 0, b"NOTMEGAT\x00"), "not a Megatron index"),
        (lambda p: _corrupt(p, 9, struct.pack("<Q", 2)), "version 2"),
        (lambda p: _corrupt(p, 17, struct.pack("<B", 6)), "not token ids"),
        (lambda p: _corrupt(p, 17, struct.pack("<B", 9)), "unknown Megatron dtype code 9"),
        (
            lambda p: os.truncate(str(p) + ".idx", os.path.getsize(str(p) + ".idx") - 3),
            "truncated or not understood",
        ),
        (lambda p: os.truncate(str(p) + ".bin", os.path.getsize(str(p) + ".bin") - 4), "truncated"),
        # the second sequence's pointer moved: not contiguous in order
        (lambda p: _corrupt(p, HEADER_BYTES + 4 * 3 + 8, struct.pack("<q", 4)), "not contiguous"),
        # a negative sequence length
        (lambda p: _corrupt(p, HEADER_BYTES, struct.pack("<i", -1)), "negative length"),
        # the document index decreasing
        (lambda p: _corrupt(p, HEADER_BYTES + 12 * 3 + 8, struct.pack("<q", 3)), "decreases"),
    ],
)
def test_malformed_files_are_refused(tmp_path, edit, match):
    prefix = build_megatron(_data_dir(tmp_path) / "c", [np.arange(5), np.arange(4), np.arange(3)])
    edit(prefix)
    with pytest.raises(FormatError, match=match):
        mmpack.open(prefix, format="megatron")


def test_missing_files(tmp_path):
    with pytest.raises(StoreNotFoundError):
        open_megatron(tmp_path / "nothing")
    prefix = build_megatron(_data_dir(tmp_path) / "c", [np.arange(3)])
    os.remove(prefix + ".bin")
    with pytest.raises(StoreNotFoundError, match=r"\.bin is missing"):
        mmpack.open(prefix)
    with pytest.raises(StoreNotFoundError):  # a plain missing path is still "no store"
        mmpack.open(tmp_path / "no-such-store")


# ----------------------------------------------------------------------------- identity, verify
def test_fingerprint_is_stable_location_independent_and_follows_the_index(tmp_path):
    data = _data_dir(tmp_path)
    prefix = build_megatron(data / "c", [np.arange(5), np.arange(7)])
    fp = mmpack.open(prefix).fingerprint
    assert mmpack.open(prefix).fingerprint == fp
    other = tmp_path / "elsewhere"
    other.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, other / f"renamed{ext}")
    assert mmpack.open(other / "renamed").fingerprint == fp
    build_megatron(data / "c", [np.arange(5), np.arange(6)])
    assert mmpack.open(prefix).fingerprint != fp


def test_verify_records_a_sidecar_then_catches_an_in_place_change(tmp_path):
    data = _data_dir(tmp_path)
    prefix = build_megatron(data / "c", random_docs(np.random.default_rng(0), 30, VOCAB))
    listing = _listing(data)
    store = mmpack.open(prefix)
    first = store.verify()
    assert first["recorded"] and first["bytes"] == sum(
        os.path.getsize(prefix + e) for e in (".idx", ".bin")
    )
    assert str(tmp_path / "cache") in first["sidecar"]
    second = store.verify()
    assert not second["recorded"]
    assert _listing(data) == listing  # nothing written beside the user's files
    with open(prefix + ".bin", "r+b") as f:  # same size, one token changed
        f.seek(8)
        f.write(struct.pack("<i", 999))
    again = mmpack.open(prefix)
    assert again.fingerprint == store.fingerprint  # the cheap fingerprint cannot see it...
    with pytest.raises(FormatError, match=r"c\.bin stripe 0 .* differs"):  # ...verify does
        again.verify()


def _long_index(data, n=200_000):
    """One document of ``n`` one-token sequences: a 2.4 MB .idx."""
    b = IndexedDatasetBuilder(str(data / "c.bin"), dtype=np.int32)
    b.add_document(torch.arange(n, dtype=torch.int32), [1] * n)
    b.finalize(str(data / "c.idx"))
    return str(data / "c")


def test_reopen_uses_the_cached_index_and_verify_reparses(tmp_path, monkeypatch):
    from mmpack._src.formats.megatron import MegatronIndex

    data = _data_dir(tmp_path)
    prefix = _long_index(data)
    first = mmpack.open(prefix)
    (index,) = (tmp_path / "cache" / "megatron").glob("index-*.npy")

    def no_parse(self):
        raise AssertionError("parsed again")

    with monkeypatch.context() as m:
        m.setattr(MegatronIndex, "token_offsets", no_parse)
        again = mmpack.open(prefix)
    np.testing.assert_array_equal(again.offsets, first.offsets)
    assert again.fingerprint == first.fingerprint
    # the .idx edited and its cached index left under the new key (what a file system that
    # keeps no ctime would allow): served, until verify() parses the .idx again and removes it
    k = 49_995
    _corrupt(prefix, HEADER_BYTES + 4 * 200_000 + 8 * k, struct.pack("<q", 4 * k + 4))
    key = {
        "idx": foreign.file_identity(data / "c.idx"),
        "bin_size": (data / "c.bin").stat().st_size,
    }
    foreign.save_index(
        tmp_path / "cache" / "megatron", key, first.offsets, {"fingerprint": first.fingerprint}
    )
    stale = mmpack.open(prefix)
    assert stale.fingerprint == first.fingerprint
    with pytest.raises(FormatError, match=f"sequence {k} starts at byte {4 * k + 4}.*removed"):
        stale.verify()
    with pytest.raises(FormatError, match=f"sequence {k} starts at byte"):  # cache dropped
        mmpack.open(prefix)
    assert index.exists()  # the first one's entry, under the old key, is never used again


def test_an_idx_rewritten_with_its_mtime_restored_is_parsed_again(tmp_path, monkeypatch):
    """A pointer in the middle of the .idx edited, its size, mtime, inode and first and last
    MiB kept: the kernel's new ctime gives it a new cache key, so the open parses it again."""
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 50_000_000)
    data = _data_dir(tmp_path)
    prefix = _long_index(data)
    time.sleep(0.1)
    mmpack.open(prefix)
    assert list((tmp_path / "cache" / "megatron").glob("index-*.npy"))
    st = os.stat(prefix + ".idx")
    k = 49_995
    at = HEADER_BYTES + 4 * 200_000 + 8 * k
    assert 1 << 20 < at < st.st_size - (1 << 20)
    _corrupt(prefix, at, struct.pack("<q", 4 * k + 4))
    os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(FormatError, match=f"sequence {k} starts at byte {4 * k + 4}"):
        mmpack.open(prefix)


def test_verify_reads_checks_the_bin_blocks_on_first_read(tmp_path):
    data = _data_dir(tmp_path)
    n = 5 << 20  # 20 MiB of int32 tokens: .bin blocks 0 and 1
    b = IndexedDatasetBuilder(str(data / "c.bin"), dtype=np.int32)
    b.add_document(torch.arange(n, dtype=torch.int32) % 1000, [n // 2, n - n // 2])
    b.add_item(torch.arange(7, dtype=torch.int32))
    b.end_document()
    b.finalize(str(data / "c.idx"))
    prefix = str(data / "c")
    store = mmpack.open(prefix, verify_reads=True)  # records the sidecar: both files read
    assert store.verify_reads and store.tokens is None
    assert store.read_range(0, 10).tolist() == list(range(10))  # block 0 checked
    with open(prefix + ".bin", "r+b") as f:  # block 1, same size: the fingerprint is unchanged
        f.seek((17 << 20) + 40)
        f.write(struct.pack("<i", 999))
    with pytest.raises(FormatError, match=r"c\.bin stripe 1 .* differs from the checksum"):
        store.read_range(n - 10, n)  # the open store's mapping sees the new bytes
    fresh = mmpack.open(prefix, verify_reads=True)
    assert fresh.read_range(0, 10).tolist() == list(range(10))  # block 0 is fine
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        WindowDataset(fresh, 4096)[len(WindowDataset(fresh, 4096)) - 1]
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        pickle.loads(pickle.dumps(fresh)).read_range(n - 10, n)
    assert mmpack.open(prefix).read_range(n - 10, n).size == 10  # unchecked by default


def test_verify_reads_refuses_negative_ids_in_the_blocks_it_reads(tmp_path):
    prefix = build_megatron(_data_dir(tmp_path) / "c", [np.array([3, -2, 5])])
    with pytest.raises(FormatError, match=r"1 negative token ids \(the first at token 1: -2"):
        mmpack.open(prefix, verify_reads=True)  # recording the sidecar verifies everything
    store = mmpack.open(prefix)
    assert int(store[0][1]) == 2**32 - 2  # the default serves the mapping


def test_verify_refuses_negative_ids(tmp_path):
    prefix = build_megatron(_data_dir(tmp_path) / "c", [np.array([3, -2, 5])])
    store = mmpack.open(prefix)
    assert int(store[0][1]) == 2**32 - 2  # served as uint32 over the same bytes
    with pytest.raises(FormatError, match="1 negative token ids"):
        store.verify()


# ----------------------------------------------------------------------------- views, pickling
def test_views_plans_sampler_and_mixture_work_and_write_only_to_the_cache(tmp_path):
    from mmpack import Mixture, ResumableSampler

    data = _data_dir(tmp_path)
    docs = random_docs(np.random.default_rng(3), 80, VOCAB)
    prefix = build_megatron(data / "c", docs)
    listing = _listing(data)
    store = mmpack.open(prefix)
    packed = PackedDataset(store, 64, eot=VOCAB)
    row = packed[0]
    assert row["input_ids"].shape == (64,)
    placed = sum(p["stop"] - p["start"] for i in range(len(packed)) for p in packed.locate(i))
    assert placed == store.num_tokens
    assert any(store.cache_dir.iterdir())  # the plan went to the cache folder
    assert store.cache_dir.is_relative_to(tmp_path / "cache")
    native = mmpack.build(tmp_path / "native", docs)
    mix = Mixture([WindowDataset(store, 16), WindowDataset(native, 16)], [0.5, 0.5])
    windows = {tuple(w["input_ids"].tolist()) for w in WindowDataset(native, 16)}
    items = [mix[i] for i in range(20)]
    assert {int(it["source"]) for it in items} == {0, 1}
    assert all(tuple(it["input_ids"].tolist()) in windows for it in items)  # same data
    order = list(ResumableSampler(len(WindowDataset(store, 16)), seed=1))
    assert sorted(order) == list(range(len(WindowDataset(store, 16))))
    assert _listing(data) == listing


def test_pickling_reopens_and_refuses_changed_data(tmp_path):
    prefix = build_megatron(_data_dir(tmp_path) / "c", [np.arange(5), np.arange(9)])
    store = mmpack.open(prefix, cache_dir=tmp_path / "mycache")
    again = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(again.offsets, store.offsets)
    assert again.cache_dir == store.cache_dir and str(tmp_path / "mycache") in str(again.cache_dir)
    windows = pickle.loads(pickle.dumps(WindowDataset(store, 4)))
    np.testing.assert_array_equal(windows[1]["input_ids"], [4, 0, 1, 2])
    blob = pickle.dumps(store)
    build_megatron(_data_dir(tmp_path) / "c", [np.arange(6), np.arange(9)])
    with pytest.raises(StateMismatchError, match="changed after this object was pickled"):
        pickle.loads(blob)


@settings(max_examples=150)
@given(data=st.data())
def test_corrupted_index_is_refused_or_consistent(tmp_path_factory, data):
    """Any single byte changed, or any truncation, of a valid ``.idx``: opening either raises
    FormatError or serves documents that tile the ``.bin`` exactly (never a crash, never a read
    outside the file)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    docs = [np.arange(k, k + n) for k, n in ((0, 3), (10, 0), (20, 4), (30, 2))]
    prefix = build_megatron(tmp / "c", docs, split=True)
    raw = bytearray(open(prefix + ".idx", "rb").read())
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="keep")]
    else:
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] ^= data.draw(st.integers(1, 255), label="xor")
    with open(prefix + ".idx", "wb") as f:
        f.write(bytes(raw))
    try:
        store = open_megatron(prefix, cache_dir=tmp / "cache")
    except FormatError:
        return
    flat = np.fromfile(prefix + ".bin", dtype=np.int32)
    got = [np.asarray(d) for d in store]
    np.testing.assert_array_equal(np.concatenate(got) if got else flat[:0], flat)
