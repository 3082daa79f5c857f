"""The tokenizer worker pool (mmpack._src.ingest.workers): the same store, byte for byte, and the
same issues with one worker or two."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _ingest import quiet_ingest
from _text_corpora import DATA

import mmpack

STORE_FILES = ("tokens.bin", "offsets.bin", "mmpack.json")


def store_bytes(path: Path) -> dict[str, bytes]:
    """Every file of the store; the metadata without the provenance's build time (which is
    the only thing that differs between two builds of the same inputs)."""
    out = {name: (path / name).read_bytes() for name in STORE_FILES}
    meta = json.loads(out["mmpack.json"])
    assert meta["provenance"].pop("time")
    out["mmpack.json"] = json.dumps(meta, sort_keys=True).encode()
    return out


@pytest.mark.slow
def test_same_store_with_one_and_two_workers(tmp_path, corpus, bpe_file):
    root, texts = corpus
    built = {}
    for run, workers in [("a", 1), ("b", 1), ("c", 2), ("d", 2)]:
        report, _ = quiet_ingest(
            root / "docs.jsonl", tmp_path / run, tokenizer=bpe_file, workers=workers, batch_size=37
        )
        assert report.workers == workers and report.docs_written == len(texts)
        built[run] = store_bytes(tmp_path / run)
    assert built["a"] == built["b"] == built["c"] == built["d"]
    store = mmpack.open(tmp_path / "a")
    assert store.dtype == np.uint16


def test_byte_level_store_identical_with_two_workers_and_same_issues(tmp_path):
    bad = DATA / "bad_records.jsonl"
    results = []
    for run, workers in [("a", 1), ("b", 2), ("c", 2)]:
        report, issues = quiet_ingest(
            [bad, bad, bad], tmp_path / run, workers=workers, batch_size=2
        )
        results.append(
            (
                store_bytes(tmp_path / run),
                [str(i) for i in issues],
                report.docs_written,
                report.docs_skipped,
            )
        )
    assert results[0] == results[1] == results[2]
    assert len(results[0][1]) == 24
