"""The input readers (mmpack._src.ingest.readers): text files one document each (or one a line),
JSON, JSON lines and gzip, Parquet string and binary columns read in batches."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _ingest import assert_counts_add_up, quiet_ingest, texts_of


def test_text_files_one_document_each_in_sorted_glob_order(tmp_path):
    for name, text in [("b.txt", "second"), ("a.txt", "first ✓"), ("c.md", "# third\n")]:
        (tmp_path / name).write_text(text, encoding="utf-8")
    report, issues = quiet_ingest(str(tmp_path / "*.txt"), tmp_path / "s")
    assert texts_of(report.store) == ["first ✓", "second"]
    assert issues == [] and report.store.dtype == np.uint8
    # Explicit paths keep their order; a glob's matches are sorted.
    report, _ = quiet_ingest([tmp_path / "c.md", str(tmp_path / "[ab].txt")], tmp_path / "t")
    assert texts_of(report.store) == ["# third\n", "first ✓", "second"]
    assert_counts_add_up(report)


def test_text_lines_mode(tmp_path):
    (tmp_path / "l.txt").write_bytes(b"one\r\ntwo\n\nthree\xe2\x9c\x93\nno newline at end")
    report, issues = quiet_ingest(tmp_path / "l.txt", tmp_path / "s", lines=True)
    assert texts_of(report.store) == ["one", "two", "", "three✓", "no newline at end"]
    assert issues == []


def test_jsonl_json_array_json_lines_and_gzip(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "a1"}\n\n   \n{"text": "a2", "x": 1}\n')
    (tmp_path / "b.json").write_text(json.dumps([{"text": "b1"}, {"text": "b2"}], indent=2))
    (tmp_path / "c.json").write_text('{"text": "c1"}\n{"text": "c2"}\n')
    (tmp_path / "e.json").write_text(json.dumps({"text": "e1", "meta": {"a": 1}}, indent=2))
    (tmp_path / "f.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "f1"}\n{"text": "f2"}\n')
    (tmp_path / "g.txt").write_bytes(b"\xef\xbb\xbfg1")
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write('{"body": "d1"}\n{"body": "d2"}\n')
    report, issues = quiet_ingest(str(tmp_path / "[abcef].json*"), tmp_path / "s")
    assert texts_of(report.store) == ["a1", "a2", "b1", "b2", "c1", "c2", "e1", "f1", "f2"]
    assert issues == []
    (tmp_path / "h.json").write_text('{"text": "h1",\n "broken": }')
    report, issues = quiet_ingest([tmp_path / "g.txt", tmp_path / "h.json"], tmp_path / "u")
    assert texts_of(report.store) == ["g1"]  # the byte-order mark is not text
    assert [(i.where, i.skipped) for i in issues] == [(str(tmp_path / "h.json"), 1)]
    assert "the whole file is skipped" in issues[0].reason
    report, _ = quiet_ingest(tmp_path / "d.jsonl.gz", tmp_path / "t", field="body")
    assert texts_of(report.store) == ["d1", "d2"]


def test_parquet_string_binary_and_batched(tmp_path):
    texts = [f"row {i} " + "é" * (i % 7) for i in range(2500)]  # several record batches
    pq.write_table(
        pa.table({"text": texts, "n": list(range(2500))}),
        tmp_path / "a.parquet",
        row_group_size=700,
    )
    pq.write_table(
        pa.table({"content": pa.array([b"bin\xc3\xa9", b"ok"], pa.binary())}),
        tmp_path / "b.parquet",
    )
    pq.write_table(
        pa.table({"text": pa.array(["large"], pa.large_string())}), tmp_path / "c.parquet"
    )
    report, issues = quiet_ingest(
        [tmp_path / "a.parquet", tmp_path / "c.parquet"], tmp_path / "s", batch_size=300
    )
    assert texts_of(report.store) == texts + ["large"]
    assert issues == []
    report, _ = quiet_ingest(tmp_path / "b.parquet", tmp_path / "t", field="content")
    assert texts_of(report.store) == ["biné", "ok"]
