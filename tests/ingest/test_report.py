"""Ingest issues and the on_error policy (mmpack._src.ingest.report): warnings by default,
attributed to the caller and capped; "skip-some" refuses a build that skipped most records or
stored nothing of an input and keeps one with a few bad records; on_error's values are checked."""

from __future__ import annotations

import warnings

import pytest
from _ingest import quiet_ingest, texts_of
from _ingest import write_jsonl as _jsonl

from mmpack._src.ingest.pipeline import IngestError, IngestWarning
from mmpack.ingest import ingest


def test_issues_are_warnings_by_default_and_capped(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join('{"t": 1}\n' for _ in range(30)) + '{"text": "x"}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ingest(tmp_path / "a.jsonl", tmp_path / "s", progress=False, on_error="skip")
    caught = [w for w in caught if w.category is IngestWarning]
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 21
    assert msgs[0].endswith("a.jsonl:1: field 'text' is missing; skipped")
    assert msgs[-1].startswith("10 more input issues")
    assert report.docs_skipped == 30 and len(report.store) == 1
    assert all(w.filename == __file__ for w in caught)  # attributed to the caller


def test_skip_some_refuses_a_build_that_skipped_most_records(tmp_path):
    """Issue 13 item 16: a wrong field skipping 9 of 10 records used to build (exit 0)."""
    f = _jsonl(tmp_path / "d.jsonl", [{"body": f"x{k}"} for k in range(9)] + [{"text": "y"}])
    with pytest.raises(
        IngestError,
        match=r"9 of 10 records \(90%\) were skipped, more than half; "
        r"nothing is written.*on_error='skip'",
    ) as err:
        ingest(f, tmp_path / "s", progress=False, on_issue=lambda i: None)
    assert err.value.report.docs_skipped == 9
    assert not (tmp_path / "s").exists()
    report = ingest(f, tmp_path / "s", progress=False, on_issue=lambda i: None, on_error="skip")
    assert texts_of(report.store) == ["y"]


def test_skip_some_refuses_an_input_with_no_record_stored(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", [{"text": f"g{k}"} for k in range(30)])
    bad = _jsonl(tmp_path / "bad.jsonl", [{"content": f"b{k}"} for k in range(10)])
    with pytest.raises(
        IngestError,
        match=r"no record of the input .*bad\.jsonl could be stored "
        r"\(10 skipped; the first: .*bad\.jsonl:1: field 'text' "
        r"is missing\) \(is field='text' the right field\?\)",
    ):
        ingest([good, bad], tmp_path / "s", progress=False, on_issue=lambda i: None)
    assert not (tmp_path / "s").exists()
    report, _ = quiet_ingest([good, bad], tmp_path / "s", on_error="skip")
    assert report.docs_written == 30 and report.docs_skipped == 10


def test_skip_some_keeps_a_build_with_a_few_bad_records(tmp_path):
    # One bad file of three matched by one glob (one input), a one-record input lost among
    # others, and exactly half skipped: all build.
    for name, data in [("a.txt", b"aa"), ("b.txt", b"\xff"), ("c.txt", b"cc")]:
        (tmp_path / name).write_bytes(data)
    report = ingest(
        str(tmp_path / "*.txt"), tmp_path / "s", progress=False, on_issue=lambda i: None
    )
    assert texts_of(report.store) == ["aa", "cc"] and report.docs_skipped == 1
    report = ingest(
        [tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"],
        tmp_path / "t",
        progress=False,
        on_issue=lambda i: None,
    )
    assert report.docs_skipped == 1
    f = _jsonl(tmp_path / "half.jsonl", [{"text": "x"}, {"body": "y"}])
    report = ingest(f, tmp_path / "u", progress=False, on_issue=lambda i: None)
    assert report.docs_written == 1 and report.docs_skipped == 1


def test_on_error_values(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"on_error must be one of \('skip-some', 'skip', "
        r"'fail'\), got 'ignore'",
    ):
        ingest(iter(["x"]), tmp_path / "s", on_error="ignore")
