"""Stores that know their tokenizer (mmpack._src.ingest.provenance, mmpack._src.store.vocab): the record
and the copy of tokenizer.json written at build, outside the fingerprint; views taking ids from the
store; vocabulary and mixed-tokenizer checks; joins and distributed builds carrying the record;
``mmpack info`` and ``mmpack show --decode`` without ``--tokenizer``.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/ingest/test_provenance.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _text_corpora import stdlib_files, stdlib_texts, train_bpe

import mmpack
from mmpack._src.ingest.provenance import store_tokenizer
from mmpack._src.store.format import StoreMeta
from mmpack.ingest import build_distributed, ingest, load_tokenizer

SPECIALS = ["<|endoftext|>", "<s>", "<pad>", "<mask>", "<unk>"]


def _train_with_specials(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(p) for p in stdlib_files(100_000)], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return _train_with_specials(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def other_bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe2"), vocab_size=700, max_bytes=80_000)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_texts(40_000)))
    return path


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "mmpack", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_build_records_tokenizer_outside_the_fingerprint(tmp_path, jsonl, bpe, backend):
    store = ingest([jsonl], tmp_path / "s", tokenizer=bpe, backend=backend).store
    rec = store.meta["tokenizer"]
    assert (
        rec["kind"] == "tokenizers" and rec["vocab_size"] == 600 and rec["file"] == "tokenizer.json"
    )
    assert rec["special_ids"] == {"eot": 0, "bos": 1, "pad": 2, "mask": 3, "unk": 4}
    assert (tmp_path / "s" / "tokenizer.json").read_bytes() == bpe.read_bytes()
    prov = store.meta["provenance"]
    assert prov["inputs"] == [str(jsonl)] and prov["docs_written"] == len(store)
    assert prov["tokens_written"] == store.num_tokens and prov["time"].endswith("Z")
    # the same documents built plainly: the same fingerprint (the record is not part of it)
    plain = mmpack.build(tmp_path / "plain", list(store), dtype=store.dtype)
    assert plain.fingerprint == store.fingerprint and "tokenizer" not in plain.meta
    StoreMeta.from_json(store.meta, tmp_path)  # the record a reader without this feature sees
    assert store.verify()["blocks"] > 0
    tok = store_tokenizer(store)
    assert tok.decode(store[0]) == load_tokenizer(bpe).decode(store[0])


def test_byte_level_record(tmp_path, jsonl):
    store = ingest([jsonl], tmp_path / "s").store
    assert store.meta["tokenizer"] == {
        "kind": "byte",
        "identity": "byte",
        "source": None,
        "vocab_size": 257,
        "special_ids": {"eot": 256},
    }
    assert not (tmp_path / "s" / "tokenizer.json").exists()
    assert store_tokenizer(store).decode(store[0][:5]) == stdlib_texts(40_000)[0][:5]


def test_views_take_ids_from_the_store(tmp_path, jsonl, bpe):
    store = ingest([jsonl], tmp_path / "s", tokenizer=bpe).store
    a = mmpack.WindowDataset(store, 32, eot="store", pad_id="store", drop_last=False)
    b = mmpack.WindowDataset(store, 32, eot=0, pad_id=2, drop_last=False)
    assert (a.eot, a.pad_id) == (0, 2)
    np.testing.assert_array_equal(a[len(a) - 1]["input_ids"], b[len(b) - 1]["input_ids"])
    p = mmpack.PackedDataset(
        store, 64, eot="store", pad_id="store", mode="mlm", mask_id="store", vocab_size="store"
    )
    assert (p.eot, p.pad_id, p.mask_id, p.vocab_size) == (0, 2, 3, 600)
    with pytest.raises(ValueError, match="outside the vocabulary.*eot='store'"):
        mmpack.WindowDataset(store, 32, eot=50256)
    with pytest.raises(ValueError, match="mask_id=9999 (is outside|must be in)"):
        mmpack.PackedDataset(store, 64, eot=0, mode="mlm", mask_id=9999, vocab_size=600)
    assert mmpack.WindowDataset(store, 32, eot=50256, check_vocab=False).eot == 50256
    plain = mmpack.build(tmp_path / "plain", [[1, 2, 3]])
    with pytest.raises(ValueError, match="records no tokenizer"):
        mmpack.PackedDataset(plain, 4, mode="mlm", mask_id="store", vocab_size=10)
    assert mmpack.WindowDataset(plain, 2, eot=50256).eot == 50256  # nothing recorded: no check
    # "store" on a store that records nothing: no eot and pad 0, what the views always did
    assert (mmpack.WindowDataset(plain, 2, eot="store", pad_id="store").eot, 0) == (None, 0)
    byte = ingest([jsonl], tmp_path / "b").store
    assert mmpack.WindowDataset(byte, 8, pad_id="store").pad_id == 0  # byte-level: no pad
    with pytest.raises(ValueError, match="no mask token"):
        mmpack.PackedDataset(byte, 8, mode="mlm", mask_id="store", vocab_size=257)


def test_the_views_default_to_the_ids_the_store_records(tmp_path, jsonl, bpe):
    """Issue 23 item 19: a store built with a tokenizer records its eot and pad, yet
    ``WindowDataset(store, 16)`` joined documents with no separator and ``PackedDataset`` padded
    with 0 (this tokenizer's eot): ``eot="store"`` and ``pad_id="store"`` are the defaults."""
    store = ingest([jsonl], tmp_path / "s", tokenizer=bpe).store  # eot 0, pad 2
    window = mmpack.WindowDataset(store, 16, drop_last=False)
    packed = mmpack.PackedDataset(store, 64)
    assert (window.eot, window.pad_id, packed.eot, packed.pad_id) == (0, 2, 0, 2)
    assert "eot=0, pad_id=2" in repr(window) and "eot=0, pad_id=2" in repr(packed)
    explicit = mmpack.WindowDataset(store, 16, eot=0, pad_id=2, drop_last=False)
    for i in (0, len(window) - 1):
        np.testing.assert_array_equal(window[i]["input_ids"], explicit[i]["input_ids"])
    assert window.stats().eot_tokens == len(store)
    row = packed[len(packed) - 1]  # best-fit decreasing: the last bin is the emptiest
    pad = row["attention_mask"] == 0
    assert pad.any() and (row["input_ids"][pad] == 2).all()
    cu = row["cu_seqlens"]
    assert row["input_ids"][cu[1] - 1] == 0  # the first document ends with the eot
    none = mmpack.WindowDataset(store, 16, eot=None)  # still available explicitly
    assert none.eot is None and none.stats().stream_tokens == window.stats().stream_tokens - len(
        store
    )
    byte = ingest([jsonl], tmp_path / "b").store  # records eot 256 and no pad
    assert (mmpack.WindowDataset(byte, 16).eot, mmpack.PackedDataset(byte, 64).pad_id) == (256, 0)
    # documents built with a template carry its tokens (here their own eot): none is added
    closed = ingest(iter(["ab", "c"]), tmp_path / "t", template="$A 256").store
    window = mmpack.WindowDataset(closed, 5)
    assert window.eot is None and window[0]["input_ids"].tolist() == [97, 98, 256, 99, 256]


def test_mixtures_and_joins_refuse_different_tokenizers(tmp_path, jsonl, bpe, other_bpe):
    a = ingest([jsonl], tmp_path / "a", tokenizer=bpe).store
    a2 = ingest([jsonl], tmp_path / "a2", tokenizer=bpe).store
    b = ingest([jsonl], tmp_path / "b", tokenizer=other_bpe).store
    plain = mmpack.build(tmp_path / "plain", [list(range(1, 400))])
    views = [mmpack.WindowDataset(s, 8) for s in (a, b)]
    with pytest.raises(ValueError, match="sources 0 and 1 .* different tokenizers"):
        mmpack.Mixture(views, [1, 1])
    assert len(mmpack.Mixture(views, [1, 1], mixed_tokenizers=True)) > 0
    mmpack.Mixture([mmpack.WindowDataset(s, 8) for s in (a, a2, plain)], [1, 1, 1])
    with pytest.raises(ValueError, match="parts 0 and 1"):
        mmpack.join([a, b], tmp_path / "ab")
    assert not (tmp_path / "ab").exists()
    mixed = mmpack.join([a, b], tmp_path / "ab", mixed_tokenizers=True)
    assert "tokenizer" not in mixed.meta
    same = mmpack.join([a, a2], tmp_path / "aa")
    assert same.meta["tokenizer"] == a.meta["tokenizer"]
    assert (tmp_path / "aa" / "tokenizer.json").read_bytes() == bpe.read_bytes()
    assert mmpack.WindowDataset(same, 8, eot="store").eot == 0
    with pytest.raises(ValueError, match="different tokenizers"):
        mmpack.join([b], tmp_path / "aa", append=True)


def test_cli_info_and_show_decode_without_tokenizer(tmp_path, jsonl, bpe):
    ingest([jsonl], tmp_path / "s", tokenizer=bpe)
    r = _cli("info", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert (
        "tokenizer    tokenizers (vocab 600, copy in tokenizer.json; special ids: eot 0, "
        "bos 1, pad 2, mask 3, unk 4)" in r.stdout
    )
    assert "built " in r.stdout and "from 1 input:" in r.stdout
    r = _cli("info", "--json", tmp_path / "s")
    assert json.loads(r.stdout)["tokenizer"]["vocab_size"] == 600
    r = _cli("show", tmp_path / "s", "--seqlen", 40, "-i", 0, "--eot", "store", "--decode")
    assert r.returncode == 0, r.stderr
    store = mmpack.open(tmp_path / "s")
    expected = load_tokenizer(bpe).decode(store[0][:39])
    assert "eot 0, pad 2)" in r.stdout and expected in r.stdout
    (tmp_path / "s" / "tokenizer.json").write_text(bpe.read_text().replace("<mask>", "<MASK>"))
    r = _cli("show", tmp_path / "s", "--seqlen", 40, "-i", 0, "--decode")
    assert r.returncode == 1 and "does not match the tokenizer recorded" in r.stderr
    assert "Traceback" not in r.stderr


def test_distributed_build_records_tokenizer(tmp_path, jsonl, bpe):
    (tmp_path / "more.jsonl").write_text(jsonl.read_text())
    report = build_distributed(
        [str(jsonl), str(tmp_path / "more.jsonl")],
        tmp_path / "d",
        engine="serial",
        part_bytes=1,
        tokenizer=bpe,
    )
    store = report.store
    assert store.meta["tokenizer"]["file"] == "tokenizer.json"
    assert store.meta["provenance"]["parts"] == 2
    assert (tmp_path / "d" / "tokenizer.json").read_bytes() == bpe.read_bytes()
    # parts record the tokenizer but do not each hold a copy
    assert not (tmp_path / "d" / "parts" / "part-00000" / "tokenizer.json").exists()
    assert store.parts[0].meta["tokenizer"]["identity"] == store.meta["tokenizer"]["identity"]
    r = _cli("show", tmp_path / "d", "--seqlen", 16, "-i", 3, "--decode")
    assert r.returncode == 0 and "--- positions" in r.stdout, r.stderr


def test_transformers_folder_special_ids(tmp_path, jsonl, bpe):
    import transformers

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bpe),
        bos_token="<s>",
        eos_token="<|endoftext|>",
        pad_token="<pad>",
        mask_token="<mask>",
        unk_token="<unk>",
    )
    fast.save_pretrained(tmp_path / "hf")
    store = ingest([jsonl], tmp_path / "s", tokenizer=tmp_path / "hf").store
    assert store.meta["tokenizer"]["special_ids"] == {
        "eot": 0,
        "bos": 1,
        "pad": 2,
        "mask": 3,
        "unk": 4,
    }
    assert store_tokenizer(store).decode(store[0][:10]) == fast.decode(store[0][:10].tolist())


def test_appending_to_a_distributed_join_keeps_its_tokenizer_copy(tmp_path, jsonl, bpe):
    build_distributed([str(jsonl)], tmp_path / "d", engine="serial", tokenizer=bpe)
    extra = ingest([jsonl], tmp_path / "more", tokenizer=bpe, copy_tokenizer=False).store
    joined = mmpack.join([extra], tmp_path / "d", append=True)
    assert joined.meta["tokenizer"]["file"] == "tokenizer.json" and len(joined.parts) == 2
    assert store_tokenizer(joined).decode(joined[0][:5]) == load_tokenizer(bpe).decode(
        joined[0][:5]
    )


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_store_built_with_a_tokenizer_can_be_rebuilt_over(tmp_path, jsonl, bpe, backend):
    """Every file a build writes into a store is the store's own: a store built with a tokenizer
    (its copy of tokenizer.json) is replaced by --overwrite, through the CLI and the API."""
    out = tmp_path / "s"
    for _ in range(2):
        r = _cli(
            "build",
            jsonl,
            "-o",
            out,
            "--tokenizer",
            bpe,
            "--backend",
            backend,
            "--overwrite",
            "--no-progress",
        )
        assert r.returncode == 0, r.stderr
    assert mmpack.open(out).meta["files"] == ["tokenizer.json"]
    for kw in ({"backend": backend}, {"backend": "memmap" if backend == "zarr" else "zarr"}):
        store = ingest([jsonl], out, tokenizer=bpe, overwrite=True, **kw).store
        assert (
            store.backend == kw["backend"]
            and (out / "tokenizer.json").read_bytes() == bpe.read_bytes()
        )
    store = ingest([jsonl], out, overwrite=True).store  # byte-level: no copy is left behind
    assert not (out / "tokenizer.json").exists() and "files" not in store.meta
    ingest([jsonl], out, tokenizer=bpe, overwrite=True)
    r = _cli(
        "build",
        jsonl,
        "-o",
        out,
        "--engine",
        "serial",
        "--tokenizer",
        bpe,
        "--overwrite",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr  # a join replaces the store, then is replaced in turn
    for engine in ("serial", "local"):
        r = _cli(
            "build",
            jsonl,
            "-o",
            out,
            "--engine",
            engine,
            "--tokenizer",
            bpe,
            "--overwrite",
            "--no-progress",
        )
        assert r.returncode == 0, r.stderr
    assert mmpack.open(out).meta["tokenizer"]["file"] == "tokenizer.json"


def test_overwrite_still_refuses_files_the_store_does_not_list(tmp_path, jsonl, bpe):
    out = tmp_path / "s"
    ingest([jsonl], out, tokenizer=bpe)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"other files \(it holds notes.txt\)"):
        ingest([jsonl], out, tokenizer=bpe, overwrite=True)
    (out / "notes.txt").unlink()
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").mkdir()  # a listed name that is not the file the build wrote
    (out / "tokenizer.json" / "keep").write_text("mine")
    with pytest.raises(FileExistsError, match=r"other files \(it holds tokenizer.json\)"):
        ingest([jsonl], out, tokenizer=bpe, overwrite=True)
    assert (out / "tokenizer.json" / "keep").read_text() == "mine"
