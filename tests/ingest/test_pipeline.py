"""Ingestion: bad records reported with their place and skipped (or fatal), in-memory inputs,
exact round trips and damaged files taken out whole.  The input formats are tested in
test_readers and test_inputs, bounded reading in test_batching, parallel tokenization in
test_workers, the issues' warnings and the on_error policy in test_report.

Run: ``.venv/bin/python -m pytest tests/ingest/test_pipeline.py -q``.
"""

from __future__ import annotations

import gzip
import json
import sys
import types
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _ingest import assert_counts_add_up, quiet_ingest, texts_of
from _text_corpora import DATA
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack._src.ingest.pipeline import IngestError
from mmpack.errors import StoreExistsError
from mmpack.ingest import IngestIssue, ingest, load_tokenizer


# ----------------------------------------------------------------------------- bad records
def test_bad_records_are_reported_with_file_and_line_and_skipped(tmp_path):
    bad_json = DATA / "bad_records.jsonl"
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    inputs = [
        tmp_path / "good.txt",
        tmp_path / "latin1.txt",
        tmp_path / "empty.txt",
        bad_json,
        tmp_path / "empty.jsonl",
    ]
    report, issues = quiet_ingest(inputs, tmp_path / "s")
    where = [
        (i.where.replace(str(tmp_path) + "/", "").replace(str(DATA) + "/", ""), i.skipped)
        for i in issues
    ]
    assert where == [
        ("latin1.txt", 1),
        ("bad_records.jsonl:2", 1),  # invalid UTF-8
        ("bad_records.jsonl:3", 1),  # invalid JSON
        ("bad_records.jsonl:4", 1),  # not an object
        ("bad_records.jsonl:5", 1),  # field missing
        ("bad_records.jsonl:6", 1),  # a number
        ("bad_records.jsonl:7", 1),  # null
        ("bad_records.jsonl:8", 1),  # a list
        ("bad_records.jsonl:10", 1),  # a lone surrogate: cannot be tokenized
        ("empty.jsonl", 0),  # a notice, nothing lost
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
    pq.write_table(
        pa.table({"text": pa.array([b"ok", b"\xff"], pa.binary())}), tmp_path / "bin.parquet"
    )
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    report, issues = quiet_ingest(str(tmp_path / "*.parquet"), tmp_path / "s")
    got = {(i.where.replace(str(tmp_path) + "/", ""), i.skipped) for i in issues}
    assert got == {
        ("bin.parquet row 1", 1),
        ("ints.parquet", 4),
        ("junk.parquet", 1),
        ("nofield.parquet", 2),
        ("nulls.parquet row 1", 1),
    }
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
    report = ingest(
        tmp_path / "e.jsonl",
        tmp_path / "s",
        on_error="fail",
        progress=False,
        on_issue=lambda i: None,
    )
    assert len(report.store) == 0


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
    report, issues = quiet_ingest(
        iter([{"text": "x"}, {"body": "y"}, b"z\xc3\xa9", 5, "w"]), tmp_path / "t"
    )
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
    # A DatasetDict: one split is used; of several, the one named by split=, else refused.
    splits = {"train": FakeDataset([{"text": "t"}]), "test": FakeDataset([{"text": "e"}])}
    with pytest.raises(ValueError, match=r"dict holds several splits \(test, train\)"):
        quiet_ingest(splits, tmp_path / "t")
    report, _ = quiet_ingest(splits, tmp_path / "t", split="train")
    assert texts_of(report.store) == ["t"]
    report, _ = quiet_ingest({"test": splits["test"]}, tmp_path / "one")
    assert texts_of(report.store) == ["e"]
    # A missing column skips the whole dataset, loudly.
    report, issues = quiet_ingest(FakeDataset([{"body": "x"}] * 3), tmp_path / "u")
    assert (
        len(report.store) == 0 and issues[0].skipped == 3 and "no column 'text'" in str(issues[0])
    )


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

    monkeypatch.setitem(
        sys.modules, "datasets", types.SimpleNamespace(load_from_disk=load_from_disk)
    )
    report, _ = quiet_ingest(folder, tmp_path / "s")
    assert loaded == [str(folder)] and texts_of(report.store) == ["from disk"]


def test_a_missing_dependency_names_the_extra_to_install(tmp_path, monkeypatch):
    """Issue 14: an optional dependency that is not installed raises MissingDependencyError (an
    ImportError and an MmpackError) naming the pip extra that brings it."""
    from mmpack.errors import MissingDependencyError, MmpackError

    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependencyError, match=r'pip install -e "\.\[ingest\]"') as info:
        ingest(tmp_path / "t.parquet", tmp_path / "s")
    assert isinstance(info.value, ImportError) and isinstance(info.value, MmpackError)
    assert (info.value.name, info.value.extra) == ("pyarrow", "ingest")
    monkeypatch.setitem(sys.modules, "datasets", None)
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_info.json").write_text("{}")
    with pytest.raises(MissingDependencyError, match=r"\(pip install datasets\)"):
        ingest(tmp_path / "saved", tmp_path / "s")


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
    assert "read 1 document: wrote 1 (4 tokens, uint8)" in summary and "(1 worker)" in summary
    assert str(IngestIssue("f.txt:3", "bad")) == "f.txt:3: bad"


def test_progress_bar_on_stderr(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("abc")
    ingest(tmp_path / "a.txt", tmp_path / "s", progress=True)
    err = capsys.readouterr().err
    assert "building" in err and "100%" in err and "docs" in err and "tokens/s" in err
    ingest(tmp_path / "a.txt", tmp_path / "t")  # default: no bar in a library call
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- damaged files
def _lines(n):
    return [f"line {i} " + "x" * (i % 37) for i in range(n)]


def _damage(raw: bytes, how: str) -> bytes:
    if how == "truncated":
        return raw[: len(raw) // 2]
    b = bytearray(raw)
    b[len(b) // 2] ^= 0x01  # one flipped bit in the deflate stream
    return bytes(b)


def _decodable_prefix(data: bytes) -> bytes:
    """Naive reference: what a gzip decoder outputs before it detects the damage (fed one byte at
    a time, so the output up to the failure is kept)."""
    d = zlib.decompressobj(31)
    out = []
    for k in range(len(data)):
        try:
            out.append(d.decompress(data[k : k + 1]))
        except zlib.error:
            break
    return b"".join(out)


def _records_in(prefix: bytes, fmt: str) -> int:
    rows = prefix.split(b"\n")
    if fmt == "jsonl":
        return sum(1 for r in rows if r.strip())
    return len(rows) - (rows[-1] == b"")


@pytest.mark.parametrize("how", ["flipped", "truncated"])
@pytest.mark.parametrize("fmt", ["lines", "jsonl"])
def test_damaged_gzip_is_all_or_nothing(tmp_path, fmt, how):
    """Issue 13 item 2: the lines decoded before the CRC failure (garbage included) were stored
    while the report said 'skipped 1'; a truncated file kept half its lines.  Now none of its
    documents is stored and the issue counts the documents decoded before the damage."""
    good, other = _lines(300), _lines(2000)
    if fmt == "lines":
        name, payload = "d.txt.gz", ("\n".join(other) + "\n").encode()
        (tmp_path / "good.txt").write_text("\n".join(good) + "\n")
        first = tmp_path / "good.txt"
    else:
        name, payload = (
            "d.jsonl.gz",
            "".join(json.dumps({"text": t}) + "\n" for t in other).encode(),
        )
        (tmp_path / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in good))
        first = tmp_path / "good.jsonl"
    bad = _damage(gzip.compress(payload), how)
    (tmp_path / name).write_bytes(bad)
    n_lost = _records_in(_decodable_prefix(bad), fmt)
    assert n_lost > 0
    report, issues = quiet_ingest([first, tmp_path / name], tmp_path / "s", lines=True)
    assert texts_of(report.store) == good
    assert [(i.skipped, i.file_lost) for i in issues] == [(n_lost, True)]
    assert issues[0].where == str(tmp_path / name) and "skipped whole" in issues[0].reason
    assert (report.docs_read, report.docs_written, report.docs_skipped) == (
        len(good) + n_lost,
        len(good),
        n_lost,
    )
    assert report.files_lost == 1 and "1 unreadable file skipped whole" in report.summary()
    assert_counts_add_up(report)
    # The default policy refuses a build that lost a file; nothing is written.
    with pytest.raises(IngestError, match=r"skipped whole.*nothing is written.*on_error='skip'"):
        ingest(
            [first, tmp_path / name],
            tmp_path / "t",
            lines=True,
            progress=False,
            on_issue=lambda i: None,
        )
    assert not (tmp_path / "t").exists()


def test_damaged_gzip_one_document_per_file_counts_one(tmp_path):
    (tmp_path / "a.txt").write_text("kept")
    (tmp_path / "b.txt.gz").write_bytes(_damage(gzip.compress(b"lost " * 1000), "truncated"))
    report, issues = quiet_ingest(str(tmp_path / "*.txt*"), tmp_path / "s")
    assert texts_of(report.store) == ["kept"]
    assert [(i.skipped, i.file_lost) for i in issues] == [(1, True)]
    assert_counts_add_up(report)


class _FailingReader:
    """A binary file that raises EIO after ``after`` lines (an I/O error part-way)."""

    def __init__(self, f, after):
        self.f, self.after = f, after

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __iter__(self):
        for k, line in enumerate(self.f):
            if k == self.after:
                raise OSError(5, "Input/output error")
            yield line


def _fail_reading(monkeypatch, name, after):
    import mmpack._src.ingest.readers as ingest_mod

    real = ingest_mod._open_binary

    def fake(path):
        f = real(path)
        return _FailingReader(f, after) if path.name == name else f

    monkeypatch.setattr(ingest_mod, "_open_binary", fake)


def test_file_failing_part_way_is_taken_out_whole(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("a1\na2\n")
    (tmp_path / "b.txt").write_text("".join(f"b{k}\n" for k in range(50)))
    (tmp_path / "c.txt").write_text("c1\n")
    _fail_reading(monkeypatch, "b.txt", after=20)
    report, issues = quiet_ingest(str(tmp_path / "*.txt"), tmp_path / "s", lines=True)
    assert texts_of(report.store) == ["a1", "a2", "c1"]
    assert [(i.where, i.skipped, i.file_lost) for i in issues] == [
        (str(tmp_path / "b.txt"), 20, True)
    ]
    assert "Input/output error" in issues[0].reason
    assert_counts_add_up(report)


def test_file_failing_after_its_documents_left_stops_the_build(tmp_path, monkeypatch):
    """When some of a file's documents were already passed on (a batch left), the file cannot be
    taken out: the build stops and writes nothing, whatever on_error says."""
    (tmp_path / "b.txt").write_text("".join(f"b{k}\n" for k in range(50)))
    _fail_reading(monkeypatch, "b.txt", after=20)
    with pytest.raises(
        IngestError,
        match=r"b\.txt: cannot read it \(Input/output error\) after "
        r"20 records.*never stored in part",
    ):
        quiet_ingest(tmp_path / "b.txt", tmp_path / "s", lines=True, batch_size=8)
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- damaged Parquet
def test_parquet_failing_part_way_is_taken_out_whole(tmp_path, monkeypatch):
    pq.write_table(pa.table({"text": ["p0", "p1", "p2"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": [f"q{k}" for k in range(3000)]}), tmp_path / "b.parquet")
    real = pq.ParquetFile.iter_batches

    def failing(self, *args, **kwargs):  # b.parquet (3000 rows): a page fails after 1024 rows
        for k, rb in enumerate(real(self, *args, **kwargs)):
            if k == 1 and self.metadata.num_rows == 3000:
                raise pa.ArrowInvalid("Couldn't deserialize thrift: corrupt page")
            yield rb

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", failing)
    report, issues = quiet_ingest(
        [tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "s", batch_size=5000
    )
    assert texts_of(report.store) == ["p0", "p1", "p2"]
    assert [(i.skipped, i.file_lost) for i in issues] == [(1024, True)]
    assert "cannot read it as Parquet past row 1024 (Couldn't deserialize" in issues[0].reason
    assert_counts_add_up(report)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not gzip at all", "Not a gzipped file"),
        (b"", "the file is empty: not even a gzip header"),
    ],
)
def test_unreadable_gzip_is_lost_with_no_documents_counted(tmp_path, data, reason):
    """A .gz cut to nothing read as an empty file: its loss was a mere note."""
    (tmp_path / "a.txt").write_text("kept\n")
    (tmp_path / "b.txt.gz").write_bytes(data)
    report, issues = quiet_ingest(
        [tmp_path / "a.txt", tmp_path / "b.txt.gz"], tmp_path / "s", lines=True
    )
    assert texts_of(report.store) == ["kept"]
    assert [(i.skipped, i.file_lost, i.is_error) for i in issues] == [(0, True, True)]
    assert reason in issues[0].reason


@given(
    lines=st.lists(st.text(alphabet="abc xyz✓\t", max_size=30), min_size=1, max_size=300),
    jsonl=st.booleans(),
    how=st.sampled_from(["flip", "truncate"]),
    where=st.floats(0, 1),
    bit=st.integers(0, 7),
)
def test_any_damage_to_a_gzip_stores_all_of_it_or_none(
    tmp_path_factory, lines, jsonl, how, where, bit
):
    """Property, against the naive byte-at-a-time decoder: whatever byte is flipped (header, data
    or trailer) or wherever the file is cut, the store holds the good file's documents and either
    every document of the damaged file, unchanged (a flip the format does not check, such as the
    header's mtime), or none of them, with the issue counting the records of the decodable
    prefix."""
    tmp = tmp_path_factory.mktemp("gz")
    if jsonl:
        payload = "".join(json.dumps({"text": t}) + "\n" for t in lines).encode()
        (tmp / "good.jsonl").write_text(json.dumps({"text": "good"}) + "\n")
        name, good, fmt = "d.jsonl.gz", tmp / "good.jsonl", "jsonl"
    else:
        payload = "".join(t.replace("\n", " ") + "\n" for t in lines).encode()
        (tmp / "good.txt").write_text("good\n")
        name, good, fmt = "d.txt.gz", tmp / "good.txt", "lines"
    raw = gzip.compress(payload, mtime=0)
    k = min(int(where * len(raw)), len(raw) - 1)
    if how == "flip":
        bad = bytearray(raw)
        bad[k] ^= 1 << bit
        bad = bytes(bad)
    else:
        bad = raw[:k]
    (tmp / name).write_bytes(bad)
    report, issues = quiet_ingest([good, tmp / name], tmp / "s", lines=True)
    assert_counts_add_up(report)
    if not issues:
        assert texts_of(report.store) == ["good", *lines]
    else:
        [issue] = issues
        assert texts_of(report.store) == ["good"]
        assert issue.file_lost and issue.skipped == _records_in(_decodable_prefix(bad), fmt)


@given(m=st.integers(0, 30), n=st.integers(1, 40), data=st.data(), batch_size=st.integers(1, 50))
def test_a_read_error_never_stores_part_of_a_file(
    tmp_path_factory, monkeypatch_session, m, n, data, batch_size
):
    """Property: an I/O error after ``k`` lines of b.txt (after m lines of a.txt, in batches of
    ``batch_size``) takes b.txt out whole while none of its lines has left the batch being filled
    (``m % batch_size + k < batch_size``), else stops the build with nothing written; b.txt is
    never stored in part."""
    k = data.draw(st.integers(0, n - 1))
    tmp = tmp_path_factory.mktemp("eio")
    (tmp / "a.txt").write_text("".join(f"a{j}\n" for j in range(m)))
    (tmp / "b.txt").write_text("".join(f"b{j}\n" for j in range(n)))
    with monkeypatch_session.context() as mp:
        _fail_reading(mp, "b.txt", after=k)
        if m % batch_size + k < batch_size:
            report, issues = quiet_ingest(
                [tmp / "a.txt", tmp / "b.txt"], tmp / "s", lines=True, batch_size=batch_size
            )
            assert texts_of(report.store) == [f"a{j}" for j in range(m)]
            assert [(i.skipped, i.file_lost) for i in issues][-1] == (k, True)
            assert_counts_add_up(report)
        else:
            with pytest.raises(IngestError, match="never stored in part"):
                quiet_ingest(
                    [tmp / "a.txt", tmp / "b.txt"], tmp / "s", lines=True, batch_size=batch_size
                )
            assert not (tmp / "s").exists()


@pytest.fixture(scope="module")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_nothing_of_the_output_or_its_temporary_folders_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("abc")
    quiet_ingest("a.txt", "out")
    stale = tmp_path / ".out.mmpack-tmp-999999-0123abcd"  # a dead build's folder beside it
    stale.mkdir()
    (stale / "left.txt").write_text("left")
    (tmp_path / "out.txt").write_text("a sibling, not the output")
    for named in ("out", "out/tokens.bin", "./out/../out/mmpack.json", str(stale / "left.txt")):
        with pytest.raises(ValueError, match=r"lies inside output='out', the store this build"):
            quiet_ingest(["a.txt", named], "out", overwrite=True)
    (tmp_path / "link").symlink_to(tmp_path / "out")
    with pytest.raises(ValueError, match="lies inside output="):
        quiet_ingest(["a.txt", "link/offsets.bin"], tmp_path / "out", overwrite=True)
    for pattern in ("out/*", ".*/*.txt", "**/*.bin"):
        with pytest.raises(FileNotFoundError, match=r"matches only the store being built"):
            quiet_ingest(["a.txt", pattern], "out", overwrite=True)
    report, _ = quiet_ingest(["*.txt", "out/../*.txt"], "out", overwrite=True)
    assert texts_of(report.store) == ["abc", "a sibling, not the output"] * 2
