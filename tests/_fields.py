"""Per-document fields at ingestion, checked through one engine: shared by the serial, Dask and
distributed suites."""

from __future__ import annotations

import numpy as np
from _chat import save_dataset, write_jsonl, write_parquet

import mmpack
from mmpack.ingest import build_distributed, ingest


def engines_join_the_fields(tmp_path, engine: str, scheduler: str | None = None) -> None:
    """One part per input (a Parquet file, a saved dataset), joined by ``engine``: the fields
    of the JSON lines build of both (the Dask case runs in tests/ingest/test_distributed.py,
    on its cluster)."""
    _write_all(tmp_path)
    ref = ingest(
        [tmp_path / "a.jsonl", tmp_path / "a.jsonl"],
        tmp_path / "ref",
        fields=FIELDS,
        on_issue=_quiet,
    ).store
    report = build_distributed(
        [tmp_path / "a.parquet", tmp_path / "saved"],
        tmp_path / "out",
        engine=engine,
        scheduler=scheduler,
        part_bytes=1,
        fields=FIELDS,
        on_issue=_quiet,
    )
    assert len(report.store.parts) == 2 and report.docs_skipped == 2
    _same(mmpack.open(tmp_path / "out"), ref)
    assert report.store.meta["provenance"]["fields"] == FIELDS


FIELDS = ["source", "lang", "quality"]


def _write_all(tmp) -> None:
    """The same records as JSON lines, a Parquet file and a saved dataset."""
    write_jsonl(tmp / "a.jsonl", _records())
    write_parquet(tmp / "a.parquet", _records())
    save_dataset(tmp / "saved", _records())


def _same(a, b) -> None:
    """The same documents and the same fields (values, kinds, categories)."""
    assert len(a) == len(b) and a.num_tokens == b.num_tokens
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.read_range(0, a.num_tokens), b.read_range(0, b.num_tokens))
    assert sorted(a.fields) == sorted(b.fields) and a.fields.kinds == b.fields.kinds
    for name in a.fields:
        np.testing.assert_array_equal(a.fields[name], b.fields[name])
        assert a.field_categories(name) == b.field_categories(name)


def _quiet(_issue) -> None:
    pass


def _records(n: int = 24) -> list[dict]:
    out = []
    for i in range(n):
        rec = {"text": f"doc {i}" + " x" * (i % 5), "source": i % 3, "lang": "enfr"[i % 2] * 2}
        rec["quality"] = i / 7
        if i == 5:
            rec["lang"] = None  # a bad record: skipped, reported
        out.append(rec)
    return out
