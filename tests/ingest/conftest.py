"""Fixtures of the ingest tests: a trained BPE tokenizer, a corpus of real documents and the chat
tests' tokenizer (with its chat template)."""

from __future__ import annotations

import json

import pytest
from _chat import make_tokenizer
from _text_corpora import stdlib_texts, train_bpe


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """About 300 real documents (stdlib sources cut into pieces) as text files and JSONL."""
    root = tmp_path_factory.mktemp("corpus")
    texts = []
    for src in stdlib_texts(400_000, skip=20):
        parts = src.split("\n\n\n")  # top-level definitions, roughly
        texts.extend(p for p in parts if p)
    texts = texts[:300]
    with open(root / "docs.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "id": len(t)}) + "\n")
    return root, texts


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()
