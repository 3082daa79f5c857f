"""Input discovery (mmpack._src.ingest.inputs): a format by override or by extension (source and
markup files are text; text_extensions chooses more), missing inputs and folders refused."""

from __future__ import annotations

import pytest
from _ingest import quiet_ingest, texts_of
from _ingest import write_jsonl as _jsonl

from mmpack.ingest import ingest


def test_format_override_and_unknown_extension(tmp_path):
    (tmp_path / "code.bas").write_text("PRINT 'hi'\n")
    with pytest.raises(ValueError, match=r"code\.bas.*text_extensions=\['\.bas'\].*format="):
        ingest(tmp_path / "code.bas", tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
    report, _ = quiet_ingest(tmp_path / "code.bas", tmp_path / "s", format="text")
    assert texts_of(report.store) == ["PRINT 'hi'\n"]
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


def test_source_and_markup_files_are_text_by_default(tmp_path):
    """Issue 13 item 16: .py / .rst needed format='text', which then applied to every input."""
    (tmp_path / "m.py").write_text("import os\n")
    (tmp_path / "r.rst").write_text("Title\n=====\n")
    _jsonl(tmp_path / "d.jsonl", [{"text": "json text"}])
    (tmp_path / "q.bas").write_text("10 PRINT\n")
    report, issues = quiet_ingest(
        [tmp_path / "m.py", tmp_path / "r.rst", tmp_path / "d.jsonl"], tmp_path / "s"
    )
    assert texts_of(report.store) == ["import os\n", "Title\n=====\n", "json text"]
    assert issues == []
    report, _ = quiet_ingest(
        [tmp_path / "q.bas", tmp_path / "d.jsonl"], tmp_path / "t", text_extensions=["BAS"]
    )
    assert texts_of(report.store) == ["10 PRINT\n", "json text"]
    report, _ = quiet_ingest(tmp_path / "d.jsonl", tmp_path / "u", text_extensions=[".jsonl"])
    assert texts_of(report.store) == ['{"text": "json text"}\n']
    with pytest.raises(TypeError, match="text_extensions must be an iterable"):
        ingest(tmp_path / "m.py", tmp_path / "v", text_extensions=".py")
    with pytest.raises(ValueError, match="text_extensions must hold extensions"):
        ingest(tmp_path / "m.py", tmp_path / "v", text_extensions=["."])
