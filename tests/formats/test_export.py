"""Exports to other tools' formats, read back by the real megatron-core (``IndexedDataset``) and
by the EOS-separated opener; and the ``mmpack`` CLI on foreign stores.

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/formats/test_export.py``
"""

from __future__ import annotations

import filecmp
import gzip
import os

import numpy as np
import pytest
from _megatron import IndexedDataset, build_megatron, random_docs
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack.cli import main
from mmpack.errors import StoreExistsError
from mmpack.formats import export_flat, export_megatron

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))


def _store(tmp_path, docs, dtype=None, name="store"):
    return mmpack.build(tmp_path / name, docs, dtype=dtype, overwrite=True, fsync=False)


# ----------------------------------------------------------------------------- Megatron
@pytest.mark.parametrize(
    ("dtype", "megatron_dtype"),
    [("<u1", np.uint8), ("<u2", np.uint16), ("<u4", np.int32), ("<u8", np.int64)],
)
def test_export_megatron_is_read_back_identically_by_megatron(tmp_path, dtype, megatron_dtype):
    docs = random_docs(np.random.default_rng(0), 60, 200)
    store = _store(tmp_path, docs, dtype=dtype)
    bin_path, idx_path = export_megatron(store, tmp_path / "out")
    assert (bin_path.name, idx_path.name) == ("out.bin", "out.idx")
    theirs = IndexedDataset(str(tmp_path / "out"))
    assert theirs.index.dtype == megatron_dtype
    assert len(theirs) == len(docs)
    np.testing.assert_array_equal(theirs.document_indices, np.arange(len(docs) + 1))
    for j, d in enumerate(docs):
        np.testing.assert_array_equal(theirs[j], d, err_msg=str(j))
    back = mmpack.open(tmp_path / "out")
    for ours, d in zip(back, docs):
        np.testing.assert_array_equal(ours, d)


def test_megatron_round_trip_is_byte_identical(tmp_path):
    docs = random_docs(np.random.default_rng(1), 40, 50_000)
    prefix = build_megatron(tmp_path / "orig", docs)  # int32, one sequence per document
    export_megatron(mmpack.open(prefix), tmp_path / "copy")
    for ext in (".bin", ".idx"):
        assert filecmp.cmp(prefix + ext, tmp_path / f"copy{ext}", shallow=False), ext


def test_export_megatron_refuses_overwrite_and_unfit_ids_leaving_nothing(tmp_path):
    store = _store(tmp_path, [np.array([1, 2**31], dtype=np.uint32)], dtype="<u4")
    with pytest.raises(ValueError, match="does not fit Megatron's int32"):
        export_megatron(store, tmp_path / "big")
    assert not list(tmp_path.glob("*big*")), list(tmp_path.iterdir())  # no temp file either
    ok = _store(tmp_path, [np.array([1, 2])], name="ok")
    export_megatron(ok, tmp_path / "x")
    mtime = os.stat(tmp_path / "x.bin").st_mtime_ns
    with pytest.raises(StoreExistsError, match="x.bin exists"):
        export_megatron(ok, tmp_path / "x")
    assert os.stat(tmp_path / "x.bin").st_mtime_ns == mtime
    export_megatron(ok, tmp_path / "x.idx", overwrite=True)  # a file path names the prefix too


# ----------------------------------------------------------------------------- flat files
@given(st.lists(st.lists(st.integers(1, 9), max_size=6), max_size=12), st.booleans())
def test_export_flat_reopens_to_documents_plus_eos(tmp_path_factory, docs, header):
    tmp = tmp_path_factory.mktemp("flat")
    store = _store(tmp, [np.array(d, dtype=np.int64) for d in docs], dtype="<u2")
    path = export_flat(store, tmp / "flat.npy", eos=0, header=header, metadata=not header)
    expected = np.array([t for d in docs for t in [*d, 0]], dtype=np.uint16)
    flat = np.load(path) if header else np.fromfile(path, dtype=np.uint16)
    np.testing.assert_array_equal(flat, expected)
    opts = {"cache_dir": tmp / "cache"} | ({} if header else {"dtype": "uint16"})
    back = mmpack.open(path, format="eos-separated", eos=0, **opts)
    assert [d.tolist() for d in back] == [[*d, 0] for d in docs]
    if not header:  # OLMo-core's metadata: start,end per document, eos included
        with gzip.open(tmp / "flat.csv.gz", "rt") as f:
            rows = [tuple(map(int, line.split(","))) for line in f]
        assert rows == [(int(back.offsets[j]), int(back.offsets[j + 1])) for j in range(len(back))]
        # an EOS-separated store exports back to the identical file: no eos is doubled
        again = export_flat(back, tmp / "again.bin", eos=0, header=False)
        assert filecmp.cmp(path, again, shallow=False)


def test_export_flat_refuses_an_eos_inside_a_document(tmp_path):
    store = _store(tmp_path, [np.array([1, 2]), np.array([3, 0, 4])], dtype="<u2")
    with pytest.raises(ValueError, match="document 1 holds eos=0 at token 1"):
        export_flat(store, tmp_path / "f.npy", eos=0)
    assert not (tmp_path / "f.npy").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    with pytest.raises(ValueError, match="eos must be < 65536"):
        export_flat(store, tmp_path / "f.npy", eos=70_000)


# ----------------------------------------------------------------------------- CLI
def test_cli_on_megatron_and_flat_files(tmp_path, capsys):
    docs = random_docs(np.random.default_rng(2), 30, 500)
    prefix = build_megatron(tmp_path / "meg", docs, split=True)
    assert main(["info", prefix]) == 0
    out = capsys.readouterr().out
    assert "megatron v1, file dtype int32" in out and "documents    30" in out
    assert main(["show", prefix, "--seqlen", "8", "-i", "0"]) == 0
    first = np.concatenate(docs)[:8].tolist()
    assert str(first) in capsys.readouterr().out
    assert main(["pack", prefix, "--seqlen", "64", "--json"]) == 0
    assert main(["verify", prefix, "--format", "megatron"]) == 0
    assert "checksums recorded in" in capsys.readouterr().out
    assert main(["verify", prefix]) == 0
    assert "recorded" not in capsys.readouterr().out
    assert (
        main(["export", prefix, "--to", "olmo", "--eos", "500", "-o", str(tmp_path / "o.npy")]) == 0
    )
    assert (
        main(["export", prefix, "--to", "npy", "--eos", "500", "-o", str(tmp_path / "n.npy")]) == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "info",
                str(tmp_path / "o.npy"),
                "--format",
                "eos-separated",
                "--eos",
                "500",
                "--dtype",
                "uint32",
                "--json",
            ]
        )
        == 0
    )
    assert '"documents": 30' in capsys.readouterr().out
    assert main(["info", str(tmp_path / "n.npy"), "--eos", "500"]) == 0  # detected, header read
    assert main(["info", str(tmp_path / "o.npy"), "--dtype", "uint32", "--metadata"]) == 0
    assert (
        main(
            [
                "export",
                str(tmp_path / "n.npy"),
                "--eos",
                "500",
                "--to",
                "megatron",
                "-o",
                str(tmp_path / "back"),
            ]
        )
        == 0
    )
    back = mmpack.open(tmp_path / "back")
    assert [d.tolist() for d in back] == [[*d.tolist(), 500] for d in docs]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["export", "{meg}", "--to", "megatron", "-o", "{meg}"],
            "exists; pass --overwrite to replace it",
        ),
        (["export", "{meg}", "--to", "npy", "-o", "{tmp}/x.npy"], "--to npy needs --eos"),
        (["info", "{tmp}/n.npy"], "eos= is required"),
        (["info", "{meg}", "--dtype", "uint16"], "--dtype is for flat token files"),
        (["info", "{tmp}/nothing"], "no mmpack store"),
        (["info", "{meg}", "--eos", "3"], "--eos is for flat token files; "),
        (["show", "{meg}.idx", "--seqlen", "2", "-i", "0", "--metadata"], "--metadata is for"),
        (["info", "{tmp}/n.npy", "--metadata"], "no OLMo-core metadata file"),
    ],
)
def test_cli_expected_failures_are_one_line(tmp_path, capsys, argv, match):
    meg = build_megatron(tmp_path / "meg", [np.arange(3)])
    np.save(tmp_path / "n.npy", np.arange(4, dtype=np.uint16))
    argv = [a.format(meg=meg, tmp=tmp_path) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
