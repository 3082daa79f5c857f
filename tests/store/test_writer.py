"""The store layer never deletes a user's file and never publishes a wrong store (issue 13).

Each test reproduces a defect found by adversarial testing: ``StoreWriter.add`` losing good
documents, wrapped ``add_batch`` lengths swapping a corrupt store in place of a good one, a full
disk leaking the temporary folder, a source that reuses its output buffer (what ``overwrite`` may
replace is in ``tests/store/test_publish.py``).  Run: ``pytest tests/store/test_writer.py``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from _paths import ROOT
from _store_folders import BACKENDS, listing
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
import mmpack._src.store.writer as W
from mmpack.errors import FormatError
from mmpack.store import StoreWriter


# ============================================================================ item 3: add()
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([4, -1, 5], "document 3 has a negative token -1 at position 1"),
        (np.array([4, -2]), "document 3 has a negative token -2 at position 1"),
        (torch.tensor([9, -3]), "document 3 has a negative token -3 at position 1"),
        ([1, 2**63], "document 3 has a token 9223372036854775808 at position 1"),
        ([1, True], "non-integer token True"),
        ("text", "document 3 is a str"),
    ],
)
def test_add_raises_on_the_bad_document_and_keeps_every_good_one(tmp_path, backend, bad, message):
    """Default buffer (nothing is flushed before the bad document): the add() that receives it
    raises, and the documents before and after it are all stored."""
    good_before = [[1, 2], [3], []]
    good_after = [[10, 11], np.array([12], dtype=np.int32), torch.tensor([13, 14])]
    with StoreWriter(tmp_path / "s", backend=backend, fsync=False) as w:
        for d in good_before:
            w.add(d)
        with pytest.raises((ValueError, TypeError), match=message):
            w.add(bad)
        for d in good_after:
            w.add(d)
    expected = [list(d) for d in good_before] + [[10, 11], [12], [13, 14]]
    assert [d.tolist() for d in w.store] == expected
    w.store.verify()


def test_add_many_adds_the_documents_before_the_bad_one(tmp_path):
    with StoreWriter(tmp_path / "s", fsync=False) as w:
        w.add([100])
        with pytest.raises(ValueError, match="document 3 has a negative token -4 at position 0"):
            w.add_many([[1], np.array([2, 3]), [-4], [5]])
        w.add([6])
    assert [d.tolist() for d in w.store] == [[100], [1], [2, 3], [6]]


# ============================================================================ item 4: add_batch
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("tokens", "lengths", "message"),
    [
        ([5], np.array([2**64 - 1, 2], dtype=np.uint64), "lengths.0. is 18446744073709551615"),
        (
            [1, 2, 3],
            np.array([2**63 - 1, 2**63 - 1, 5], dtype=np.int64),
            "lengths.0. is 9223372036854775807",
        ),
        ([1, 2, 3], np.array([-1, 4]), "lengths must be non-negative; lengths.0. is -1"),
        ([1, 2, 3], [1, 1], "lengths sum to 2"),
    ],
)
def test_wrapping_lengths_never_replace_the_previous_store(
    tmp_path, backend, tokens, lengths, message
):
    target = tmp_path / "s"
    prev = mmpack.build(target, [[1, 2], [3]], backend=backend, fsync=False)
    with (
        pytest.raises(ValueError, match=message),
        StoreWriter(target, backend=backend, overwrite=True, fsync=False) as w,
    ):
        w.add_batch(np.array(tokens), lengths)
    store = mmpack.open(target)
    assert store.fingerprint == prev.fingerprint
    store.verify()
    assert listing(tmp_path) == ["s"]


# ============================================================================ item 5: full disk
class _FullDisk:
    """A file object that fails with ENOSPC after ``room`` bytes, and again on close."""

    def __init__(self, f, room: int) -> None:
        self._f = f
        self._room = room

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= n
        return self._f.write(data)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
            raise OSError(errno.ENOSPC, "No space left on device (close)")

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("room", [0, 40, 400])
def test_disk_full_removes_the_temporary_folder(tmp_path, backend, room, monkeypatch):
    target = tmp_path / "s"
    prev = mmpack.build(target, [[1, 2], [3]], backend=backend, fsync=False)
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if "w" in mode and Path(path).name == "tokens.bin":
            return _FullDisk(f, room)
        return f

    monkeypatch.setattr(W, "open", full_open, raising=False)
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 300, 20) for _ in range(50)]
    with pytest.raises(OSError) as info:
        mmpack.build(target, docs, backend=backend, overwrite=True, buffer_tokens=64, fsync=False)
    assert info.value.errno == errno.ENOSPC
    assert listing(tmp_path) == ["s"]  # no temporary folder left behind
    assert mmpack.open(target).fingerprint == prev.fingerprint


def test_failure_creating_the_files_removes_the_temporary_folder(tmp_path, monkeypatch):
    real_open = open

    def failing_open(path, mode="r", *args, **kwargs):
        if Path(path).name == "offsets.bin":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(W, "open", failing_open, raising=False)
    with pytest.raises(OSError, match="No space"):
        mmpack.build(tmp_path / "s", [[1]], fsync=False)
    assert listing(tmp_path) == []


# ============================================================================ item 15: reused buffers
@pytest.mark.parametrize("kind", ["numpy", "torch", "numpy-uint64", "memmap-slice"])
@pytest.mark.parametrize("buffer_tokens", [1, 1 << 20])
def test_a_source_reusing_its_output_buffer(tmp_path, kind, buffer_tokens):
    """A generator that refills one array and yields it each time: every document is stored as
    it was when yielded (the writer copies what it buffers)."""
    expected = [[j, j + 1, j + 2] for j in range(0, 300, 3)]
    if kind == "memmap-slice":
        backing = np.memmap(tmp_path / "buf", dtype=np.int64, mode="w+", shape=(3,))
    else:
        backing = np.zeros(3, dtype=np.uint64 if kind == "numpy-uint64" else np.int64)
    out = torch.from_numpy(backing) if kind == "torch" else backing

    def docs():
        for d in expected:
            backing[:] = d
            yield out

    store = mmpack.build(tmp_path / "s", docs(), buffer_tokens=buffer_tokens, fsync=False)
    assert [d.tolist() for d in store] == expected


# ============================================================================ item 7: Zarr chunks
def _zarr_store(tmp_path: Path, docs=None):
    """A Zarr store whose token shards hold 2**18 tokens (uint16: 512 KiB), so 8 documents of
    100,000 tokens lie in 4 shards; tests/store/backends/test_zarr.py checks the shards' own structure."""
    import mmpack._src.store.backends._zarr_shards as shards

    docs = docs if docs is not None else [np.arange(j, j + 100_000) % 60000 + 1 for j in range(8)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shards, "SHARD_BYTES", 1 << 19)
        return mmpack.build(tmp_path / "z", docs, backend="zarr", fsync=False)


@pytest.mark.parametrize("array", ["tokens", "offsets"])
@pytest.mark.parametrize("damage", ["removed", "emptied", "a folder"])
def test_zarr_missing_chunk_is_an_error_at_open(tmp_path, array, damage):
    _zarr_store(tmp_path)
    chunk = tmp_path / "z" / array / "c" / ("1" if array == "tokens" else "0")
    chunk.unlink()
    if damage == "emptied":
        chunk.write_bytes(b"")
    elif damage == "a folder":
        chunk.mkdir()
    what = {"removed": "is missing", "emptied": "is empty", "a folder": "is not a regular file"}[
        damage
    ]
    with pytest.raises(FormatError, match=f"{array} shard .* {what}: Zarr would read it as zeros"):
        mmpack.open(tmp_path / "z")


def test_zarr_chunk_removed_after_open_is_an_error_at_read(tmp_path):
    from mmpack import WindowDataset

    expected = _zarr_store(tmp_path)[3].copy()
    store = mmpack.open(tmp_path / "z")  # opened, no shard mapped yet (a mapped one is kept)
    ds = WindowDataset(store, 4096)
    (tmp_path / "z" / "tokens" / "c" / "1").unlink()  # tokens [262144, 524288)
    assert store[0].tolist() == list(np.arange(0, 100_000) % 60000 + 1)  # chunk 0 is fine
    with pytest.raises(FormatError, match="tokens shard 1 .* is missing"):
        store[3]  # tokens [300000, 400000)
    with pytest.raises(FormatError, match="tokens shard 1"):
        ds[300_000 // 4096]
    with pytest.raises(FormatError, match="tokens shard 1|cannot read tokens"):
        store.verify()
    assert expected.min() > 0  # what zarr would have returned instead: zeros


def test_zarr_all_zero_chunks_are_written(tmp_path):
    """Zarr skips writing chunks equal to the fill value by default; a store of zeros must still
    open (every chunk exists)."""
    store = _zarr_store(tmp_path, [np.zeros(300_000, dtype=np.int64)] + [[]] * 70_000 + [[0]])
    assert (tmp_path / "z" / "tokens" / "c" / "0").is_file()
    assert int(store[0].max()) == 0 and len(mmpack.open(tmp_path / "z")) == 70_002


# ============================================================================ item 15: store files
@pytest.mark.parametrize(
    ("backend", "name"),
    [
        ("memmap", "tokens.bin"),
        ("memmap", "offsets.bin"),
        ("memmap", "mmpack.json"),
        ("zarr", "zarr.json"),
        ("zarr", "tokens/c/0"),
        ("zarr", "offsets/zarr.json"),
    ],
)
def test_a_fifo_in_place_of_a_store_file_is_refused_not_waited_on(tmp_path, backend, name):
    mmpack.build(tmp_path / "s", [[1, 2], [3]], backend=backend, fsync=False)
    os.unlink(tmp_path / "s" / name)
    os.mkfifo(tmp_path / "s" / name)
    with pytest.raises(FormatError, match="is not a regular file"):
        mmpack.open(tmp_path / "s")  # used to block forever in open()


def test_zarr_truncated_chunk_is_an_error_at_read(tmp_path):
    store = _zarr_store(tmp_path)
    chunk = tmp_path / "z" / "tokens" / "c" / "1"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    store = mmpack.open(tmp_path / "z")  # present and non-empty: the structure is fine
    with pytest.raises(FormatError, match="shard index (fails its checksum|points past)"):
        store[3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_paths_are_resolved_at_open(tmp_path, backend, monkeypatch):
    """After os.chdir, a store opened by a relative path keeps reading its own files, and its
    packing plan goes to its own cache folder."""
    from mmpack import PackedDataset

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    docs = [[j + 1] * (j % 7 + 1) for j in range(50)]
    store = mmpack.build("s", docs, backend=backend, fsync=False)
    mmpack.build(tmp_path / "b" / "s", [[9]] * 3, backend=backend, fsync=False)  # same name
    store = mmpack.open("s")
    assert store.path == tmp_path / "a" / "s"
    monkeypatch.chdir(tmp_path / "b")
    assert [d.tolist() for d in store] == docs  # not "replaced (rebuilt)", not b's documents
    ds = PackedDataset(store, 16)
    assert len(list((tmp_path / "a" / "s" / "cache").iterdir())) == 1
    assert not (tmp_path / "b" / "s" / "cache").exists()
    assert sum(int(r["attention_mask"].sum()) for r in (ds[i] for i in range(len(ds)))) == sum(
        map(len, docs)
    )


# ============================================================================ item 14: verify_reads
def _flipped_store(tmp_path: Path, monkeypatch, backend: str = "memmap"):
    """A store with 4 KiB checksum blocks and one flipped byte in tokens block 3."""
    monkeypatch.setattr(W, "STRIPE_BYTES", 4096)
    docs = [np.arange(j * 100, j * 100 + 100) % 5000 + 1 for j in range(200)]  # uint16
    store = mmpack.build(tmp_path / "s", docs, backend=backend, fsync=False)
    assert (
        store.meta["checksum"]["block_bytes"] == 4096
        and len(store.meta["checksum"]["tokens"]) == 10
    )
    if backend == "memmap":
        with open(tmp_path / "s" / "tokens.bin", "r+b") as f:
            f.seek(3 * 4096 + 10)
            f.write(b"\xff")
    return docs


@pytest.mark.parametrize("backend", ["memmap"])
def test_verify_reads_checks_each_block_on_first_read(tmp_path, monkeypatch, backend):
    from mmpack import PackedDataset, WindowDataset

    docs = _flipped_store(tmp_path, monkeypatch, backend)
    plain = mmpack.open(tmp_path / "s")
    bad_doc = (3 * 4096 + 10) // 2 // 100  # document 61 holds the flipped token
    assert plain[bad_doc].tolist() != docs[bad_doc].tolist()  # served silently without the option

    store = mmpack.open(tmp_path / "s", verify_reads=True)
    assert store.verify_reads and store.tokens is None
    assert [store[j].tolist() for j in range(40)] == [d.tolist() for d in docs[:40]]  # blocks 0-1
    with pytest.raises(FormatError, match="tokens stripe 3 .* fails its checksum"):
        store[bad_doc]
    ds = WindowDataset(store, 64)
    assert ds[0]["input_ids"].tolist() == docs[0][:64].tolist()
    with pytest.raises(FormatError, match="tokens stripe 3"):
        ds.__getitems__([0, (3 * 2048) // 64])
    packed = PackedDataset(store, 256, eot=0, cache=False)
    with pytest.raises(FormatError, match="tokens stripe 3"):
        packed.__getitems__(list(range(len(packed))))
    with pytest.raises(FormatError, match="tokens stripe 3"):
        store.read_range(3 * 2048, 3 * 2048 + 1)
    import pickle

    again = pickle.loads(pickle.dumps(store))
    assert again.verify_reads
    with pytest.raises(FormatError, match="tokens stripe 3"):
        again[bad_doc]


def test_verify_reads_checks_the_offsets_at_open(tmp_path, monkeypatch):
    _flipped_store(tmp_path, monkeypatch)
    with open(tmp_path / "s" / "offsets.bin", "r+b") as f:  # offsets[5] + 1: still increasing
        f.seek(5 * 8)
        value = int.from_bytes(f.read(8), "little")
        f.seek(5 * 8)
        f.write((value + 1).to_bytes(8, "little"))
    mmpack.open(tmp_path / "s")  # the structure is fine
    with pytest.raises(FormatError, match="offsets stripe 0 .* fails its checksum"):
        mmpack.open(tmp_path / "s", verify_reads=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_reads_returns_the_same_data(tmp_path, backend):
    from mmpack import WindowDataset

    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 70000, int(rng.integers(0, 300))) for _ in range(300)]
    mmpack.build(tmp_path / "s", docs, backend=backend, fsync=False)
    a = WindowDataset(mmpack.open(tmp_path / "s"), 50, 17, eot=0)
    b = WindowDataset(mmpack.open(tmp_path / "s", verify_reads=True), 50, 17, eot=0)
    idx = rng.integers(0, len(a), 64)
    assert np.array_equal(
        a.__getitems__(idx).columns["input_ids"], b.__getitems__(idx).columns["input_ids"]
    )
    assert all(np.array_equal(a[i]["input_ids"], b[i]["input_ids"]) for i in idx[:8].tolist())


def test_cli_build_over_its_own_input_folder_is_refused(tmp_path):
    """``mmpack build "corpus/*.txt" -o corpus --overwrite`` used to replace the input folder."""
    import subprocess
    import sys

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world")
    (corpus / "b.txt").write_text("another document")
    res = subprocess.run(
        [sys.executable, "-m", "mmpack", "build", "corpus/*.txt", "-o", "corpus", "--overwrite"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode != 0
    assert "is not an mmpack store (it holds a.txt, b.txt); refusing to replace it" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert listing(corpus) == ["a.txt", "b.txt"] and (corpus / "a.txt").read_text() == "hello world"
    assert listing(tmp_path) == ["corpus"]


# ============================================================================ property: add()
_good = st.one_of(
    st.lists(st.integers(0, 2**63 - 1), max_size=6),
    st.lists(st.integers(0, 300), max_size=6).map(lambda xs: np.array(xs, dtype=np.int64)),
    st.lists(st.integers(0, 70000), max_size=6).map(lambda xs: np.array(xs, dtype=np.uint32)),
    st.lists(st.integers(0, 2**63 - 1), max_size=4).map(lambda xs: np.array(xs, dtype=np.uint64)),
    st.lists(st.integers(0, 1000), max_size=6).map(lambda xs: torch.tensor(xs, dtype=torch.int64)),
)
_bad = st.one_of(
    st.lists(st.integers(0, 9), max_size=3).map(lambda xs: xs + [-1]),
    st.lists(st.integers(0, 9), max_size=3).map(lambda xs: np.array(xs + [2**63], dtype=np.uint64)),
    st.lists(st.integers(0, 9), max_size=3).map(lambda xs: [*xs, True]),
    st.just([1.5]),
    st.just("text"),
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), _good, _bad), max_size=12),
    st.sampled_from([1, 3, 1 << 20]),
    st.sampled_from(["add", "add_many"]),
)
def test_add_keeps_exactly_the_good_documents(items, buffer_tokens, how):
    """Against the naive specification: the store holds every good document in order, and each
    bad one raised from the call that received it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        expected = []
        with StoreWriter(Path(tmp) / "s", buffer_tokens=buffer_tokens, fsync=False) as w:
            for is_bad, good, bad in items:
                doc = bad if is_bad else good
                call = w.add if how == "add" else (lambda d: w.add_many([d]))
                if is_bad:
                    with pytest.raises((ValueError, TypeError)):
                        call(doc)
                else:
                    call(doc)
                    expected.append(
                        [int(v) for v in (doc.tolist() if hasattr(doc, "tolist") else doc)]
                    )
        assert [d.tolist() for d in w.store] == expected
        w.store.verify()
