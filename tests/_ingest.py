"""Ingestion helpers for the ingest tests: a quiet ingest collecting its issues, a store's texts,
the report's counts checked, records written as JSON lines."""

from __future__ import annotations

import json

from mmpack.ingest import ByteTokenizer, ingest


def texts_of(store, tok=None):
    """The store's documents decoded by ``tok`` (bytes by default)."""
    tok = tok or ByteTokenizer()
    return [tok.decode(store[j]) for j in range(len(store))]


def quiet_ingest(*args, **kwargs):
    """``ingest`` collecting the issues; ``on_error="skip"`` unless given, since these tests feed
    inputs made mostly of bad records on purpose (the default refuses them: see the tests of
    ``on_error="skip-some"``)."""
    issues = []
    kwargs.setdefault("progress", False)
    kwargs.setdefault("on_error", "skip")
    report = ingest(*args, on_issue=issues.append, **kwargs)
    return report, issues


def assert_counts_add_up(report):
    """The report's counts agree with each other and with the store it wrote."""
    assert report.docs_read == report.docs_written + report.docs_skipped + report.empty_skipped
    assert len(report.store) == report.docs_written
    assert report.store.num_tokens == report.tokens_written


def write_jsonl(path, records):
    """``records`` as JSON lines at ``path``; the path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
