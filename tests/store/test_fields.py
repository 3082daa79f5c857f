"""Per-document fields (mmpack._src.store.fields): written by build, read as store.fields on every
layout (local memmap and Zarr, file:// and S3 in both layouts, joins), part of the fingerprint,
checked by verify, kept by shuffle_docs, cp and joins, shown by mmpack info."""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest
from _contract import assert_views_equal
from _s3 import BUCKET
from _zarr_stores import _small

import mmpack
from mmpack.errors import FormatError
from mmpack.ingest import copy_store


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    _small(monkeypatch)


def corpus(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = [
        rng.integers(0, 60000, size=int(rng.integers(0, 90))).astype(np.uint16) for _ in range(n)
    ]
    fields = {
        "source": [int(v) for v in rng.integers(0, 4, size=n)],
        "quality": [float(v) for v in rng.random(n)],
        "lang": [["en", "fr", "de"][int(v)] for v in rng.integers(0, 3, size=n)],
    }
    return docs, fields


def _url() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/f"


def _joined(tmp, docs, fields, **_):
    cut = [0, len(docs) // 3, 2 * len(docs) // 3, len(docs)]
    parts = [
        mmpack.build(
            tmp / f"p{k}",
            docs[a:b],
            fields={n: v[a:b] for n, v in fields.items()},
            fsync=False,
        )
        for k, (a, b) in enumerate(zip(cut, cut[1:]))
    ]
    return mmpack.join([p.location for p in parts], tmp / "joined")


LAYOUTS = {
    "memmap": lambda tmp, docs, fields, **_: mmpack.build(tmp / "s", docs, fields=fields),
    "zarr": lambda tmp, docs, fields, **_: mmpack.build(
        tmp / "z", docs, fields=fields, backend="zarr"
    ),
    "file-url": lambda tmp, docs, fields, **_: mmpack.build(f"file://{tmp}/f", docs, fields=fields),
    "s3-memmap": lambda tmp, docs, fields, s3: mmpack.build(
        _url(), docs, fields=fields, storage_options=s3.options
    ),
    "s3-zarr": lambda tmp, docs, fields, s3: mmpack.build(
        _url(), docs, fields=fields, backend="zarr", storage_options=s3.options
    ),
    "joined-parts": _joined,
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_keeps_the_fields(layout, s3_server, tmp_path):
    docs, fields = corpus()
    reference = mmpack.build(tmp_path / "reference", docs, fields=fields, fsync=False)
    store = LAYOUTS[layout](tmp_path, docs, fields, s3=s3_server)
    if layout != "joined-parts":
        assert store.fingerprint == reference.fingerprint
    assert dict(store.fields.kinds) == {"source": "int", "quality": "float", "lang": "category"}
    np.testing.assert_array_equal(store.fields["source"], fields["source"])
    np.testing.assert_array_equal(store.fields["quality"], fields["quality"])
    cats = store.field_categories("lang")
    assert cats == ("de", "en", "fr")
    assert [cats[c] for c in store.fields["lang"]] == fields["lang"]
    assert not store.fields["source"].flags.writeable
    store.verify()
    # a subset of every layout reads as a store built from just its documents
    sub = store.where(lang="fr", source=store.fields["source"][0])
    keep = [
        j
        for j in range(len(docs))
        if fields["lang"][j] == "fr" and fields["source"][j] == fields["source"][0]
    ]
    np.testing.assert_array_equal(sub.parent_doc_ids, keep)
    just = mmpack.build(tmp_path / "just", [docs[j] for j in keep], fsync=False)
    assert_views_equal(sub, just, seqlen=16, every_row=False, same_fingerprint=False)
    np.testing.assert_array_equal(sub.fields["quality"], np.array(fields["quality"])[keep])


def test_fields_enter_the_fingerprint_and_nothing_else_changes(tmp_path):
    docs = [[1, 2], [3]]
    plain = mmpack.build(tmp_path / "a", docs)
    one = mmpack.build(tmp_path / "b", docs, fields={"source": [0, 1]})
    other = mmpack.build(tmp_path / "c", docs, fields={"source": [0, 2]})
    renamed = mmpack.build(tmp_path / "d", docs, fields={"origin": [0, 1]})
    fps = {s.fingerprint for s in (plain, one, other, renamed)}
    assert len(fps) == 4
    assert plain.fields == {} and len(plain.fields) == 0
    assert one.tokens is not None  # the layout is the plain store's
    assert (tmp_path / "b" / "field.source.bin").stat().st_size == 16


def test_a_damaged_field_fails_verify_and_a_missing_one_is_named(tmp_path):
    store = mmpack.build(tmp_path / "s", [[1], [2], [3]], fields={"q": [0.5, 1.5, 2.5]})
    path = tmp_path / "s" / "field.q.bin"
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="field 'q'.*fails its checksum"):
        mmpack.open(tmp_path / "s").verify()
    path.unlink()
    with pytest.raises(FormatError, match="field file is missing"):
        mmpack.open(tmp_path / "s").fields["q"]
    del store


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_nbytes_and_verify_count_the_field_columns(backend, tmp_path):
    docs, fields = corpus(40)
    store = mmpack.build(tmp_path / "s", docs, fields=fields, backend=backend, fsync=False)
    plain = store.num_tokens * 2 + 41 * 8
    assert store.nbytes == plain + 40 * (8 + 8 + 4)  # int64, float64, int32 category codes
    assert store.verify()["bytes"] == store.nbytes


def test_shuffled_documents_keep_their_fields(tmp_path):
    docs, fields = corpus(60, seed=3)
    fields["id"] = list(range(60))
    store = mmpack.build(tmp_path / "s", docs, fields=fields, shuffle_docs=7)
    ids = store.fields["id"]
    assert sorted(ids.tolist()) == list(range(60)) and ids.tolist() != list(range(60))
    for j in range(60):
        np.testing.assert_array_equal(store[j], docs[int(ids[j])])
        assert store.fields["source"][j] == fields["source"][int(ids[j])]
        cats = store.field_categories("lang")
        assert cats[store.fields["lang"][j]] == fields["lang"][int(ids[j])]


def test_copies_keep_the_fields(tmp_path):
    docs, fields = corpus(20, seed=4)
    src = mmpack.build(tmp_path / "s", docs, fields=fields)
    for dst, kw in ((tmp_path / "c", {}), (tmp_path / "z", {"backend": "zarr"})):
        copy = copy_store(src, dst, **kw)
        assert copy.fingerprint == src.fingerprint
        np.testing.assert_array_equal(copy.fields["lang"], src.fields["lang"])
    copy = copy_store(src, f"file://{tmp_path}/remote")
    np.testing.assert_array_equal(copy.fields["quality"], fields["quality"])
    # a subset copies as a store of its documents, with their fields
    sub = copy_store(src.where(lang="en"), tmp_path / "en")
    assert set(sub.field_categories("lang")) == {"de", "en", "fr"}
    assert (sub.fields["lang"] == sub.field_categories("lang").index("en")).all()


def test_joins_concatenate_fields_and_refuse_other_field_sets(tmp_path):
    a = mmpack.build(tmp_path / "a", [[1], [2]], fields={"lang": ["fr", "en"], "n": [1, 2]})
    b = mmpack.build(tmp_path / "b", [[3]], fields={"lang": ["zh"], "n": [3]})
    c = mmpack.build(tmp_path / "c", [[3]], fields={"lang": ["zh"]})
    d = mmpack.build(tmp_path / "d", [[3]], fields={"lang": ["zh"], "n": [0.5]})
    joined = mmpack.join([a.location, b.location], tmp_path / "j")
    assert joined.field_categories("lang") == ("en", "fr", "zh")
    np.testing.assert_array_equal(joined.fields["lang"], [1, 0, 2])
    np.testing.assert_array_equal(joined.fields["n"], [1, 2, 3])
    for other in (c, d):
        with pytest.raises(ValueError, match="part 1 has fields"):
            mmpack.join([a.location, other.location], tmp_path / "k")
        assert not (tmp_path / "k").exists()


def test_info_shows_the_fields(tmp_path, capsys):
    from mmpack.cli import main

    docs, fields = corpus(10, seed=5)
    mmpack.build(tmp_path / "s", docs, fields=fields)
    assert main(["info", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "field        lang: category (int32): 3 categories" in out
    assert "field        quality: float (float64): min" in out
    assert main(["info", "--json", str(tmp_path / "s")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fields"]["source"]["kind"] == "int"
    assert sum(info["fields"]["lang"]["top"].values()) <= 10


def test_overwrite_replaces_a_store_with_fields(tmp_path):
    mmpack.build(tmp_path / "s", [[1]], fields={"a": [1]})
    again = mmpack.build(tmp_path / "s", [[1], [2]], fields={"b": ["x", "y"]}, overwrite=True)
    assert list(again.fields) == ["b"]
    assert not (tmp_path / "s" / "field.a.bin").exists()


def test_bad_field_values_write_nothing(tmp_path):
    for fields, exc in (
        ({"a": [1, 2, 3]}, ValueError),
        ({"a": [[1], [2]]}, TypeError),
        ({"a": ["x" * 2000, "y"]}, ValueError),
        ({"a": [2**64, 1]}, ValueError),
        ({"1a": [1, 2]}, ValueError),
        ({"a": "xy"}, TypeError),
    ):
        with pytest.raises(exc):
            mmpack.build(tmp_path / "s", [[1], [2]], fields=fields)
        assert os.listdir(tmp_path) == []


def _jsonl(path, n=30):
    with open(path, "w") as f:
        for i in range(n):
            rec = {"text": f"doc {i}" + " x" * (i % 5), "source": i % 3, "lang": "enfr"[i % 2] * 2}
            rec["quality"] = i / 7
            if i == 5:
                del rec["lang"]  # a bad record: skipped, reported
            f.write(json.dumps(rec) + "\n")


def _check_ingested(store, skipped=(5,)):
    cats = store.field_categories("lang")
    seen = []
    for j in range(len(store)):
        i = int(bytes(store[j].astype(np.uint8)).decode().split()[1])
        seen.append(i)
        assert store.fields["source"][j] == i % 3
        assert cats[store.fields["lang"][j]] == "enfr"[i % 2] * 2
        assert store.fields["quality"][j] == i / 7
    assert sorted(seen) == [i for i in range(30) if i not in skipped]


def test_ingestion_collects_the_named_keys(tmp_path):
    from mmpack.ingest import ingest

    _jsonl(tmp_path / "a.jsonl")
    issues = []
    report = ingest(
        [tmp_path / "a.jsonl"],
        tmp_path / "s",
        fields=["source", "lang", "quality"],
        workers=2,
        batch_size=4,
        shuffle_docs=2,
        on_issue=issues.append,
    )
    assert len(issues) == 1 and "field 'lang' (named by fields=) is missing" in str(issues[0])
    _check_ingested(report.store)


def test_ingestion_fields_through_the_cli_and_the_serial_engine(tmp_path, capsys):
    from mmpack.cli import main

    _jsonl(tmp_path / "a.jsonl")
    _jsonl(tmp_path / "b.jsonl")
    assert (
        main(
            [
                "build",
                str(tmp_path / "a.jsonl"),
                "-o",
                str(tmp_path / "s"),
                "--fields",
                "source,lang,quality",
            ]
        )
        == 0
    )
    _check_ingested(mmpack.open(tmp_path / "s"))
    assert (
        main(
            [
                "build",
                str(tmp_path / "a.jsonl"),
                str(tmp_path / "b.jsonl"),
                "-o",
                str(tmp_path / "d"),
                "--fields",
                "source,lang,quality",
                "--engine",
                "serial",
                "--part-mb",
                "1",
            ]
        )
        == 0
    )
    joined = mmpack.open(tmp_path / "d")
    assert len(joined) == 58 and joined.fields["source"].shape == (58,)
    capsys.readouterr()
    assert (
        main(["build", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "e"), "--fields", "text"])
        != 0
    )
    assert "names a key twice, or the text field" in capsys.readouterr().err
