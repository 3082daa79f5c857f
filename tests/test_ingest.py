"""Ingestion: every input format, bad records reported with their place and skipped (or fatal),
deterministic parallel tokenization, bounded reading, and exact round trips.

Run: ``.venv/bin/python -m pytest tests/test_ingest.py -q``.
"""

from __future__ import annotations

import gzip
import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _text_corpora import DATA, stdlib_texts, train_bpe

import mmpack
from mmpack.errors import StoreExistsError
from mmpack.ingest.pipeline import IngestError, IngestIssue, IngestWarning, ingest
from mmpack.store.writer import StoreWriter
from mmpack.ingest.tokenizer import ByteTokenizer, load_tokenizer

STORE_FILES = ("tokens.bin", "offsets.bin", "mmpack.json")


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


def texts_of(store, tok=None):
    tok = tok or ByteTokenizer()
    return [tok.decode(store[j]) for j in range(len(store))]


def quiet_ingest(*args, **kwargs):
    issues = []
    kwargs.setdefault("progress", False)
    report = ingest(*args, on_issue=issues.append, **kwargs)
    return report, issues


def assert_counts_add_up(report):
    assert report.docs_read == report.docs_written + report.docs_skipped + report.empty_skipped
    assert len(report.store) == report.docs_written
    assert report.store.num_tokens == report.tokens_written


# ----------------------------------------------------------------------------- formats
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
    pq.write_table(pa.table({"text": texts, "n": list(range(2500))}), tmp_path / "a.parquet",
                   row_group_size=700)
    pq.write_table(pa.table({"content": pa.array([b"bin\xc3\xa9", b"ok"], pa.binary())}),
                   tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": pa.array(["large"], pa.large_string())}),
                   tmp_path / "c.parquet")
    report, issues = quiet_ingest([tmp_path / "a.parquet", tmp_path / "c.parquet"],
                                  tmp_path / "s", batch_size=300)
    assert texts_of(report.store) == texts + ["large"]
    assert issues == []
    report, _ = quiet_ingest(tmp_path / "b.parquet", tmp_path / "t", field="content")
    assert texts_of(report.store) == ["biné", "ok"]


def test_format_override_and_unknown_extension(tmp_path):
    (tmp_path / "code.py").write_text("print('hi')\n")
    with pytest.raises(ValueError, match=r"code\.py.*format="):
        ingest(tmp_path / "code.py", tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
    report, _ = quiet_ingest(tmp_path / "code.py", tmp_path / "s", format="text")
    assert texts_of(report.store) == ["print('hi')\n"]
    (tmp_path / "rec.dat").write_text('{"text": "x"}\n')
    report, _ = quiet_ingest(tmp_path / "rec.dat", tmp_path / "t", format="jsonl")
    assert texts_of(report.store) == ["x"]


def test_missing_inputs_and_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        ingest(str(tmp_path / "*.jsonl"), tmp_path / "s")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest(tmp_path / "nope.txt", tmp_path / "s")
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="not a saved Hugging Face dataset"):
        ingest(tmp_path / "dir", tmp_path / "s")
    with pytest.raises(TypeError, match=r"iter\(texts\)"):
        ingest([["not", "a path"]], tmp_path / "s")
    with pytest.raises(ValueError, match="on_error"):
        ingest(iter(["x"]), tmp_path / "s", on_error="ignore")
    with pytest.raises(ValueError, match="workers"):
        ingest(iter(["x"]), tmp_path / "s", workers=0)
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- bad records
def test_bad_records_are_reported_with_file_and_line_and_skipped(tmp_path):
    bad_json = DATA / "bad_records.jsonl"
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    inputs = [tmp_path / "good.txt", tmp_path / "latin1.txt", tmp_path / "empty.txt",
              bad_json, tmp_path / "empty.jsonl"]
    report, issues = quiet_ingest(inputs, tmp_path / "s")
    where = [(i.where.replace(str(tmp_path) + "/", "").replace(str(DATA) + "/", ""), i.skipped)
             for i in issues]
    assert where == [
        ("latin1.txt", 1),
        ("bad_records.jsonl:2", 1),   # invalid UTF-8
        ("bad_records.jsonl:3", 1),   # invalid JSON
        ("bad_records.jsonl:4", 1),   # not an object
        ("bad_records.jsonl:5", 1),   # field missing
        ("bad_records.jsonl:6", 1),   # a number
        ("bad_records.jsonl:7", 1),   # null
        ("bad_records.jsonl:8", 1),   # a list
        ("bad_records.jsonl:10", 1),  # a lone surrogate: cannot be tokenized
        ("empty.jsonl", 0),           # a notice, nothing lost
    ]
    reasons = [i.reason for i in issues]
    assert "invalid UTF-8 at byte 3" in reasons[0]
    assert "invalid UTF-8" in reasons[1]
    assert "invalid JSON" in reasons[2]
    assert "not an object" in reasons[3]
    assert reasons[4] == "field 'text' is missing"
    assert reasons[5] == "field 'text' holds a number, not a string"
    assert reasons[6] == "field 'text' is null"
    assert "holds a list" in reasons[7]
    assert "cannot tokenize" in reasons[8] and "surrogate" in reasons[8]
    assert "no records" in reasons[9]
    assert texts_of(report.store) == ["fine", "", "first good", "last good ✓"]
    assert (report.docs_read, report.docs_written, report.docs_skipped) == (13, 4, 9)
    assert report.issues == issues and report.issues_total == 10
    assert_counts_add_up(report)


def test_bad_parquet_files(tmp_path):
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "nofield.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3, 4]}), tmp_path / "ints.parquet")
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff"], pa.binary())}),
                   tmp_path / "bin.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    report, issues = quiet_ingest(str(tmp_path / "*.parquet"), tmp_path / "s")
    got = {(i.where.replace(str(tmp_path) + "/", ""), i.skipped) for i in issues}
    assert got == {("bin.parquet row 1", 1), ("ints.parquet", 4), ("junk.parquet", 1),
                   ("nofield.parquet", 2), ("nulls.parquet row 1", 1)}
    assert texts_of(report.store) == ["ok", "a", "c"]
    assert (report.docs_read, report.docs_skipped) == (12, 9)
    assert_counts_add_up(report)


def test_on_error_fail_writes_nothing(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(IngestError, match=r"a\.jsonl:2: field 'text' holds a number"):
        ingest(tmp_path / "a.jsonl", tmp_path / "s", on_error="fail", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]  # no store, no temp folder
    # Notices are not errors.
    (tmp_path / "e.jsonl").write_text("")
    report = ingest(tmp_path / "e.jsonl", tmp_path / "s", on_error="fail", progress=False,
                    on_issue=lambda i: None)
    assert len(report.store) == 0


def test_issues_are_warnings_by_default_and_capped(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join('{"t": 1}\n' for _ in range(30)) + '{"text": "x"}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ingest(tmp_path / "a.jsonl", tmp_path / "s", progress=False)
    caught = [w for w in caught if w.category is IngestWarning]
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 21
    assert msgs[0].endswith("a.jsonl:1: field 'text' is missing; skipped")
    assert msgs[-1].startswith("10 more input issues")
    assert report.docs_skipped == 30 and len(report.store) == 1
    assert all(w.filename == __file__ for w in caught)  # attributed to the caller


def test_empty_documents_kept_or_skipped(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n{"text": "x"}\n{"text": ""}\n')
    report, _ = quiet_ingest(tmp_path / "a.jsonl", tmp_path / "s")
    assert report.store.doc_lens.tolist() == [0, 1, 0]
    report, _ = quiet_ingest(tmp_path / "a.jsonl", tmp_path / "t", skip_empty=True)
    assert report.store.doc_lens.tolist() == [1]
    assert (report.docs_read, report.empty_skipped, report.docs_skipped) == (3, 2, 0)
    assert_counts_add_up(report)


# ----------------------------------------------------------------------------- in-memory inputs
def test_iterables_of_texts_and_dicts(tmp_path):
    report, issues = quiet_ingest((t for t in ["a", "b"]), tmp_path / "s")
    assert texts_of(report.store) == ["a", "b"]
    report, issues = quiet_ingest(iter([{"text": "x"}, {"body": "y"}, b"z\xc3\xa9", 5, "w"]),
                                  tmp_path / "t")
    assert texts_of(report.store) == ["x", "zé", "w"]
    assert [i.where for i in issues] == ["list_iterator[1]", "list_iterator[3]"]


class FakeDataset:
    """Duck-typed ``datasets.Dataset``: ``len`` and ``.iter(batch_size=)`` over column dicts."""

    def __init__(self, rows):
        self.rows = rows
        self.batch_sizes = []

    def __len__(self):
        return len(self.rows)

    def iter(self, batch_size):
        self.batch_sizes.append(batch_size)
        for lo in range(0, len(self.rows), batch_size):
            chunk = self.rows[lo : lo + batch_size]
            yield {k: [r[k] for r in chunk] for k in chunk[0]}


def test_datasets_like_objects(tmp_path):
    rows = [{"text": f"doc {i}", "n": i} for i in range(2500)]
    rows[1234]["text"] = None
    ds = FakeDataset(rows)
    report, issues = quiet_ingest(ds, tmp_path / "s")
    assert ds.batch_sizes == [1000]
    assert len(report.store) == 2499 and [i.where for i in issues] == ["FakeDataset[1234]"]
    assert texts_of(report.store)[1233:1235] == ["doc 1233", "doc 1235"]
    # A DatasetDict: every split, in name order.
    splits = {"train": FakeDataset([{"text": "t"}]), "test": FakeDataset([{"text": "e"}])}
    report, _ = quiet_ingest(splits, tmp_path / "t")
    assert texts_of(report.store) == ["e", "t"]
    # A missing column skips the whole dataset, loudly.
    report, issues = quiet_ingest(FakeDataset([{"body": "x"}] * 3), tmp_path / "u")
    assert len(report.store) == 0 and issues[0].skipped == 3 and "no column 'text'" in str(issues[0])


def test_saved_dataset_folder_loads_datasets_lazily(tmp_path, monkeypatch):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="needs the `datasets` package"):
        ingest(folder, tmp_path / "s")
    loaded = []

    def load_from_disk(path):
        loaded.append(path)
        return FakeDataset([{"text": "from disk"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_from_disk=load_from_disk))
    report, _ = quiet_ingest(folder, tmp_path / "s")
    assert loaded == [str(folder)] and texts_of(report.store) == ["from disk"]


# ----------------------------------------------------------------------------- determinism
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
        report, _ = quiet_ingest(root / "docs.jsonl", tmp_path / run, tokenizer=bpe_file,
                                 workers=workers, batch_size=37)
        assert report.workers == workers and report.docs_written == len(texts)
        built[run] = store_bytes(tmp_path / run)
    assert built["a"] == built["b"] == built["c"] == built["d"]
    store = mmpack.open(tmp_path / "a")
    assert store.dtype == np.uint16


def test_byte_level_store_identical_with_two_workers_and_same_issues(tmp_path):
    bad = DATA / "bad_records.jsonl"
    results = []
    for run, workers in [("a", 1), ("b", 2), ("c", 2)]:
        report, issues = quiet_ingest([bad, bad, bad], tmp_path / run, workers=workers,
                                      batch_size=2)
        results.append((store_bytes(tmp_path / run), [str(i) for i in issues],
                        report.docs_written, report.docs_skipped))
    assert results[0] == results[1] == results[2]
    assert len(results[0][1]) == 24


def test_reading_is_bounded_by_the_batches_in_flight(tmp_path, monkeypatch):
    """The input is consumed lazily: when the first batch is written, at most
    ``2 * workers + 1`` batches have been read (never the whole corpus)."""
    read = [0]

    def gen():
        for i in range(5000):
            read[0] += 1
            yield f"document {i}"

    seen = []
    original = StoreWriter.add_batch

    def spy(self, tokens, lengths):
        seen.append(read[0])
        return original(self, tokens, lengths)

    monkeypatch.setattr(StoreWriter, "add_batch", spy)
    for run, workers in [("a", 1), ("b", 2)]:
        seen.clear()
        report, _ = quiet_ingest(gen(), tmp_path / run, workers=workers, batch_size=100)
        assert report.docs_written == 5000 and len(seen) == 50
        assert seen[0] <= (2 * workers + 1) * 100 + 1
        read[0] = 0


# ----------------------------------------------------------------------------- round trips
def test_round_trip_byte_level(tmp_path, corpus):
    root, texts = corpus
    report, _ = quiet_ingest(root / "docs.jsonl", tmp_path / "s")
    assert texts_of(report.store) == texts
    assert report.store.num_tokens == sum(len(t.encode()) for t in texts)


def test_round_trip_bpe(tmp_path, corpus, bpe_file):
    root, texts = corpus
    report, _ = quiet_ingest(root / "docs.jsonl", tmp_path / "s", tokenizer=bpe_file, workers=1)
    tok = load_tokenizer(bpe_file)
    assert texts_of(report.store, tok) == texts
    assert report.store.num_tokens < 0.6 * sum(len(t.encode()) for t in texts)


# ----------------------------------------------------------------------------- the rest
def test_overwrite_backend_and_report(tmp_path):
    (tmp_path / "a.txt").write_text("abc")
    report, _ = quiet_ingest(tmp_path / "a.txt", tmp_path / "s", backend="zarr")
    assert report.store.backend == "zarr" and texts_of(report.store) == ["abc"]
    with pytest.raises(StoreExistsError):
        ingest(tmp_path / "a.txt", tmp_path / "s", progress=False)
    (tmp_path / "a.txt").write_text("abcd")
    report, _ = quiet_ingest(tmp_path / "a.txt", tmp_path / "s", overwrite=True)
    assert texts_of(mmpack.open(tmp_path / "s")) == ["abcd"]
    assert report.tokenizer.startswith("byte-level") and report.seconds > 0
    summary = report.summary()
    assert "read 1 documents: wrote 1 (4 tokens, uint8)" in summary and "1 worker" in summary
    assert str(IngestIssue("f.txt:3", "bad")) == "f.txt:3: bad"


def test_progress_bar_on_stderr(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("abc")
    ingest(tmp_path / "a.txt", tmp_path / "s", progress=True)
    err = capsys.readouterr().err
    assert "tokenizing" in err and "docs" in err and "tokens/s" in err
    ingest(tmp_path / "a.txt", tmp_path / "t")  # default: stderr is not a terminal here
    assert capsys.readouterr().err == ""
