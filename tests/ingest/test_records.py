"""Per-document fields at ingestion from every input: the columns of Parquet files and saved
Hugging Face datasets, and the keys (or columns) of chat records, stored as ``store.fields``
equal to the JSON lines build of the same records (Python API and CLI, tokenizer workers, the
serial and Dask engines, an S3 output); the provenance names the fields and ``loss_on``."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from _chat import PAIRS, RECORDS, make_tokenizer, save_dataset, write_jsonl, write_parquet
from _fields import FIELDS, _quiet, _same, _write_all, engines_join_the_fields
from _s3 import BUCKET, use_server_env

import mmpack
from mmpack.cli import main
from mmpack.ingest import build_chat, build_distributed, chat_documents, ingest


@pytest.mark.parametrize("src", ["a.parquet", "saved"])
def test_columns_equal_the_keys_of_json_lines(tmp_path, src):
    """Fields from a Parquet file's columns and a saved dataset's, with two tokenizer workers:
    the JSON lines build's store (same fingerprint); the null is a bad record named by row."""
    _write_all(tmp_path)
    ref = ingest(tmp_path / "a.jsonl", tmp_path / "ref", fields=FIELDS, on_issue=_quiet).store
    issues = []
    report = ingest(
        tmp_path / src,
        tmp_path / "got",
        fields=FIELDS,
        workers=2,
        batch_size=4,
        on_issue=issues.append,
    )
    _same(report.store, ref)
    assert report.store.fingerprint == ref.fingerprint
    assert report.docs_skipped == 1 and len(issues) == 1
    where = f"{tmp_path / 'a.parquet'} row 5" if src == "a.parquet" else f"{tmp_path / src}[5]"
    assert str(issues[0]).startswith(f"{where}: column 'lang' (named by fields=) is null")
    assert report.store.meta["provenance"]["fields"] == FIELDS


def test_the_cli_reads_fields_from_parquet_and_saved_datasets(tmp_path, capsys):
    _write_all(tmp_path)
    built = {}
    for src in ("a.jsonl", "a.parquet", "saved"):
        argv = ["build", str(tmp_path / src), "-o", str(tmp_path / f"s-{src}")]
        assert main([*argv, "--fields", "source,lang,quality", "--workers", "2"]) == 0
        built[src] = mmpack.open(tmp_path / f"s-{src}")
    _same(built["a.parquet"], built["a.jsonl"])
    _same(built["saved"], built["a.jsonl"])
    capsys.readouterr()
    assert main(["info", str(tmp_path / "s-saved")]) == 0
    assert "--fields source,lang,quality" in capsys.readouterr().out
    argv = ["build", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "bad")]
    assert main([*argv, "--fields", "source,kind"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a.parquet'} has no column 'kind' (named by --fields" in err
    assert "Traceback" not in err and not (tmp_path / "bad").exists()


def test_the_serial_engine_joins_the_fields_of_parquet_and_datasets(tmp_path):
    engines_join_the_fields(tmp_path, "serial")


def test_a_missing_column_is_refused_before_any_part_is_built(tmp_path):
    _write_all(tmp_path)
    write_parquet(tmp_path / "b.parquet", [{"text": "x", "source": 1}])
    with pytest.raises(ValueError, match=r"b.parquet has no column 'lang' \(named by fields="):
        build_distributed(
            [tmp_path / "a.parquet", tmp_path / "b.parquet"],
            tmp_path / "out",
            engine="serial",
            part_bytes=1,
            fields=FIELDS,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.jsonl",
        "a.parquet",
        "b.parquet",
        "saved",
    ]


def test_parquet_and_dataset_fields_reach_an_s3_store(tmp_path, s3_server, monkeypatch):
    """``mmpack build a.parquet -o s3://... --fields`` and ``ingest`` of a saved dataset to a
    URL: the fields of the JSON lines build, read back from S3."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    use_server_env(monkeypatch, s3_server)
    _write_all(tmp_path)
    ref = ingest(tmp_path / "a.jsonl", tmp_path / "ref", fields=FIELDS, on_issue=_quiet).store
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/f"
    argv = ["build", str(tmp_path / "a.parquet"), "-o", url, "--fields", "source,lang,quality"]
    assert main(argv) == 0
    _same(mmpack.open(url), ref)
    ingest(tmp_path / "saved", url + "-api", fields=FIELDS, workers=2, on_issue=_quiet)
    _same(mmpack.open(url + "-api"), ref)


# ------------------------------------------------------------------------------ chat records
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tok"
    make_tokenizer().save_pretrained(path)
    return path


def _tagged(records):
    """Each conversation with a source and a language of its own."""
    return [{**r, "source": k % 3, "lang": ["en", "fr"][k % 2]} for k, r in enumerate(records)]


def _chat_same(store, records, folder, loss_on="assistant") -> None:
    plain = [{k: v for k, v in r.items() if k not in ("source", "lang")} for r in records]
    docs = list(chat_documents(plain, folder, loss_on=loss_on))
    assert len(store) == len(docs)
    for j, doc in enumerate(docs):
        np.testing.assert_array_equal(store[j], doc["input_ids"])
        np.testing.assert_array_equal(store.loss_mask[j], doc["loss_mask"])
    assert store.fields["source"].tolist() == [r["source"] for r in records]
    cats = store.field_categories("lang")
    assert [cats[c] for c in store.fields["lang"]] == [r["lang"] for r in records]


def test_a_chat_corpus_with_fields_through_the_cli(folder, tmp_path, capsys):
    records = _tagged(RECORDS * 2)
    write_jsonl(tmp_path / "c.jsonl", records)
    argv = ["build", str(tmp_path / "c.jsonl"), "-o", str(tmp_path / "s"), "--tokenizer"]
    assert main([*argv, str(folder), "--loss-on", "assistant", "--fields", "source,lang"]) == 0
    store = mmpack.open(tmp_path / "s")
    _chat_same(store, records, folder)
    prov = store.meta["provenance"]
    assert prov["loss_on"] == "assistant" and prov["fields"] == ["source", "lang"]
    capsys.readouterr()
    assert main(["info", str(tmp_path / "s")]) == 0
    assert "--loss-on assistant, --fields source,lang" in capsys.readouterr().out
    argv = ["build", str(tmp_path / "c.jsonl"), "-o", str(tmp_path / "d"), "--tokenizer"]
    assert main([*argv, str(folder), "--loss-on", "all", "--fields", "source,messages"]) == 1
    assert "names a key twice, or a key of the chat records" in capsys.readouterr().err


def test_chat_fields_from_parquet_datasets_workers_and_engines(folder, tmp_path):
    records = _tagged(RECORDS * 3)
    write_jsonl(tmp_path / "c.jsonl", records)
    write_parquet(tmp_path / "c.parquet", records)
    save_dataset(tmp_path / "saved", records)
    keys = ["source", "lang"]
    for k, (src, opts) in enumerate(
        [
            ("c.parquet", {"workers": 2, "batch_size": 2}),
            ("saved", {"workers": 2, "batch_size": 5}),
            ("c.jsonl", {"engine": "serial"}),
        ]
    ):
        report = build_chat(tmp_path / src, tmp_path / f"s{k}", folder, fields=keys, **opts)
        _chat_same(report.store, records, folder)
        assert report.store.meta["provenance"]["loss_on"] == "assistant"
    pairs = _tagged(PAIRS)
    store = build_chat(iter(pairs), tmp_path / "p", folder, loss_on="completion", fields=keys).store
    _chat_same(store, pairs, folder, loss_on="completion")


def test_a_chat_record_lacking_a_field_is_a_bad_record(folder, tmp_path):
    records = _tagged(RECORDS * 2)
    del records[2]["lang"]
    records[3]["source"] = [1, 2]
    write_jsonl(tmp_path / "c.jsonl", records)
    issues = []
    report = build_chat(
        tmp_path / "c.jsonl",
        tmp_path / "s",
        folder,
        fields=["source", "lang"],
        on_issue=issues.append,
    )
    assert report.docs_skipped == 2
    assert [str(i) for i in issues] == [
        f"{tmp_path / 'c.jsonl'}:3: field 'lang' (named by fields=) is missing",
        f"{tmp_path / 'c.jsonl'}:4: field 'source' (named by fields=) holds a list, not a "
        "number or a string",
    ]
    assert json.loads(json.dumps(report.store.fields.summary()))  # the fields are there
    _chat_same(report.store, records[:2] + records[4:], folder)
