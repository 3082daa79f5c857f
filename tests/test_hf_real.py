"""Ingestion with the real Hugging Face packages (``datasets``, ``transformers``; nothing is
downloaded: tokenizers are trained here, datasets made in memory), special-token templates, and
zstd-compressed inputs.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/test_hf_real.py``
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import transformers
from _text_corpora import stdlib_files, stdlib_texts

from mmpack import open as mmpack_open
from mmpack.ingest import ingest, load_tokenizer

pytestmark = pytest.mark.hf

TEXTS = [t[:3000] for t in stdlib_texts(60_000)] + ["", "short one"]


def _docs(store):
    return [d.tolist() for d in store]


@pytest.fixture(scope="module")
def bert_like(tmp_path_factory):
    """A BPE with [CLS]/[SEP]/[PAD]/[MASK]/[UNK] and a BERT-style post-processor."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(
        [str(p) for p in stdlib_files(100_000)],
        trainers.BpeTrainer(
            vocab_size=700,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        unk_token="[UNK]",
    )
    folder = tmp_path_factory.mktemp("bert") / "tok"
    fast.save_pretrained(folder)
    return folder, fast


def test_saved_dataset_dict_and_split(tmp_path):
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TEXTS[:6]}),
            "validation": datasets.Dataset.from_dict({"text": TEXTS[6:9]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    bytes_of = [list(t.encode()) for t in TEXTS[:9]]
    for given in (tmp_path / "dd", dd):  # several splits, none chosen: refused, naming them
        with pytest.raises(ValueError, match=r"several splits \(train, validation\)") as info:
            ingest(given, tmp_path / "all")
        assert "split='train'" in str(info.value)
    assert not (tmp_path / "all").exists()
    val = ingest(tmp_path / "dd", tmp_path / "val", split="validation").store
    assert _docs(val) == bytes_of[6:9]
    assert val.meta["provenance"]["inputs"] == [f"{tmp_path / 'dd'}['validation']"]
    with pytest.raises(ValueError, match="splits: train, validation"):
        ingest(tmp_path / "dd", tmp_path / "x", split="test")
    mem = ingest(dd, tmp_path / "mem", split="train").store
    assert _docs(mem) == bytes_of[:6]


def test_dataset_dict_splits_through_the_cli(tmp_path, capsys):
    from mmpack.cli import main
    from mmpack.ingest import build_distributed

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TEXTS[:4]}),
            "validation": datasets.Dataset.from_dict({"text": TEXTS[4:6]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    capsys.readouterr()  # the progress bar of save_to_disk
    assert main(["build", str(tmp_path / "dd"), "-o", str(tmp_path / "s"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmpack: error: ") and "several splits (train, validation)" in err
    assert "--split train" in err and "split=" not in err and not (tmp_path / "s").exists()
    argv = ["build", str(tmp_path / "dd"), "-o", str(tmp_path / "s"), "--split", "test"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--split test is not a split of" in err and "(its splits: train, validation)" in err
    with pytest.raises(ValueError, match="several splits"):
        build_distributed([tmp_path / "dd"], tmp_path / "d", engine="serial")
    assert (
        main(
            [
                "build",
                str(tmp_path / "dd"),
                "-o",
                str(tmp_path / "s"),
                "--split",
                "validation",
                "--no-progress",
            ]
        )
        == 0
    )
    assert _docs(mmpack_open(tmp_path / "s")) == [list(t.encode()) for t in TEXTS[4:6]]
    one = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": TEXTS[:3]})})
    one.save_to_disk(str(tmp_path / "one"))  # one split: used
    assert main(["build", str(tmp_path / "one"), "-o", str(tmp_path / "o"), "--no-progress"]) == 0
    assert _docs(mmpack_open(tmp_path / "o")) == [list(t.encode()) for t in TEXTS[:3]]


def test_in_memory_dataset_and_iterable_dataset(tmp_path):
    ds = datasets.Dataset.from_dict({"body": TEXTS})
    a = ingest(ds, tmp_path / "a", field="body").store
    it = datasets.IterableDataset.from_generator(lambda: ({"body": t} for t in TEXTS))
    b = ingest(it, tmp_path / "b", field="body").store
    ds.save_to_disk(str(tmp_path / "saved"))
    c = ingest(tmp_path / "saved", tmp_path / "c", field="body").store
    expected = [list(t.encode()) for t in TEXTS]
    assert _docs(a) == _docs(b) == _docs(c) == expected


def test_pretrained_fast_folder_ids_and_specials(tmp_path, bert_like):
    folder, fast = bert_like
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    store = ingest(ds, tmp_path / "s", tokenizer=folder).store
    assert _docs(store) == [fast(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    ids = store.meta["tokenizer"]["special_ids"]
    assert {k: ids[k] for k in ("pad", "mask", "unk")} == {"pad": 0, "mask": 4, "unk": 1}
    # the tokenizer's own post-processor: [CLS] ... [SEP], in a worker pool too
    post = ingest(
        ds, tmp_path / "p", tokenizer=folder, template="tokenizer", workers=2, batch_size=3
    ).store
    assert _docs(post) == [fast(t)["input_ids"] for t in TEXTS]
    assert post.meta["tokenizer"]["template"] == "tokenizer"
    flag = ingest(ds, tmp_path / "f", tokenizer=folder, template="[CLS] $A [SEP]").store
    assert _docs(flag) == _docs(post)


def test_vocab_merges_folder_without_tokenizer_json(tmp_path, bert_like):
    folder, _ = bert_like
    raw = json.loads((folder / "tokenizer.json").read_text())
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "vocab.json").write_text(json.dumps(raw["model"]["vocab"]))
    merges = raw["model"]["merges"]
    lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
    (tmp_path / "gpt2" / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    (tmp_path / "gpt2" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "unk_token": "[UNK]", "eos_token": "[SEP]"})
    )
    assert not (tmp_path / "gpt2" / "tokenizer.json").exists()
    tok = load_tokenizer(tmp_path / "gpt2")
    assert tok.spec.kind == "transformers" and tok.eot_id == 3
    store = ingest(iter(TEXTS[:5]), tmp_path / "s", tokenizer=tmp_path / "gpt2").store
    slow = transformers.GPT2Tokenizer(
        str(tmp_path / "gpt2" / "vocab.json"), str(tmp_path / "gpt2" / "merges.txt")
    )
    assert _docs(store) == [slow(t, add_special_tokens=False)["input_ids"] for t in TEXTS[:5]]
    assert (
        store.meta["tokenizer"]["kind"] == "transformers" and "file" not in store.meta["tokenizer"]
    )


def test_templates_by_flag(tmp_path):
    byte = ingest(iter(["ab", "c"]), tmp_path / "b", template="$A 256").store
    assert _docs(byte) == [[97, 98, 256], [99, 256]] and byte.dtype == np.uint16
    with pytest.raises(ValueError, match="exactly once"):
        ingest(iter(["ab"]), tmp_path / "x", template="<s>")
    with pytest.raises(ValueError, match="no post-processor"):
        ingest(iter(["ab"]), tmp_path / "x", template="tokenizer")
    with pytest.raises(ValueError, match="not a token"):
        ingest(iter(["ab"]), tmp_path / "x", template="<s> $A")
    assert not (tmp_path / "x").exists()


def test_zstd_inputs(tmp_path):
    import zstandard

    lines = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS)
    (tmp_path / "a.jsonl").write_text(lines)
    cctx = zstandard.ZstdCompressor()
    (tmp_path / "a.jsonl.zst").write_bytes(cctx.compress(lines.encode()))
    (tmp_path / "b.json.zst").write_bytes(cctx.compress(lines.encode()))  # JSON lines, rewound
    (tmp_path / "c.txt.zst").write_bytes(cctx.compress(b"x\nyz"))
    plain = ingest([tmp_path / "a.jsonl"], tmp_path / "plain").store
    z = ingest([tmp_path / "a.jsonl.zst"], tmp_path / "z").store
    j = ingest([tmp_path / "b.json.zst"], tmp_path / "j").store
    t = ingest([tmp_path / "c.txt.zst"], tmp_path / "t", lines=True).store
    assert _docs(z) == _docs(j) == _docs(plain) and _docs(t) == [[120], [121, 122]]
    good = cctx.compress(lines.encode())
    (tmp_path / "bad.jsonl.zst").write_bytes(good[: len(good) // 2] + b"\x00" * 64)
    issues = []
    ingest([tmp_path / "bad.jsonl.zst"], tmp_path / "bad", on_issue=issues.append)
    assert issues and all("bad.jsonl.zst" in i.where for i in issues)


def test_per_pattern_formats_source_files_next_to_jsonl(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "from json"}) + "\n")
    (tmp_path / "b.bas").write_text("print('from py')\n")  # .bas: not text by default
    inputs = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.bas")]
    with pytest.raises(ValueError, match="cannot tell the format"):
        ingest(inputs, tmp_path / "x")
    store = ingest(inputs, tmp_path / "s", format={"*.bas": "text"}).store
    assert [bytes(d.tolist()).decode() for d in store] == ["from json", "print('from py')\n"]
    with pytest.raises(ValueError, match="glob patterns"):
        ingest(inputs, tmp_path / "y", format={"*.bas": "python"})
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmpack",
            "build",
            *inputs,
            "-o",
            str(tmp_path / "c"),
            "--format-for",
            "*.bas=text",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmpack",
            "build",
            *inputs,
            "-o",
            str(tmp_path / "d"),
            "--format-for",
            "*.bas",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1 and "PATTERN=FORMAT" in r.stderr
