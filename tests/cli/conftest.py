"""Fixtures of the CLI tests: a corpus of real text with bad files of every kind, a trained BPE
tokenizer, the seed example's store."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _cli import SEED_DOCS
from _text_corpora import DATA, stdlib_texts, train_bpe

import mmpack


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text files, JSONL and Parquet made of real text, plus bad files of every kind."""
    root = tmp_path_factory.mktemp("corpus")
    texts = stdlib_texts(150_000, skip=30)
    (root / "docs").mkdir()
    for k, t in enumerate(texts[:6]):
        (root / "docs" / f"{k:02d}.txt").write_text(t, encoding="utf-8")
    with open(root / "records.jsonl", "w", encoding="utf-8") as f:
        for t in texts[6:]:
            f.write(json.dumps({"content": t}) + "\n")
    pq.write_table(pa.table({"content": texts[:4], "n": [1, 2, 3, 4]}), root / "table.parquet")
    (root / "docs" / "zz_latin1.txt").write_bytes("naïve".encode("latin-1"))
    (root / "empty.jsonl").write_text("")
    shutil.copy(DATA / "bad_records.jsonl", root / "bad.jsonl")
    pq.write_table(pa.table({"content": [1, 2, 3]}), root / "numbers.parquet")
    return root, texts


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def seed_store(tmp_path_factory):
    return mmpack.build(tmp_path_factory.mktemp("seed") / "s", SEED_DOCS).path
