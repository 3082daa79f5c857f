"""``mmpack info`` and ``mmpack show``, run as users run them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _cli import assert_one_line_error, mmpack_cmd

import mmpack
import mmpack.errors
from mmpack.cli import main
from mmpack.ingest import build_distributed


def test_info(corpus, tmp_path):
    root, texts = corpus
    mmpack_cmd("build", "records.jsonl", "--field", "content", "-o", tmp_path / "s", cwd=root)
    res = mmpack_cmd("info", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    n = len(texts) - 6
    tokens = sum(len(t.encode()) for t in texts[6:])
    assert f"documents    {n:,} (0 empty)" in out
    assert f"tokens       {tokens:,} (uint8, 1 byte each)" in out
    assert "backend      memmap" in out and "on disk" in out and "histogram" in out
    assert "p50" in out and "p99" in out
    res = mmpack_cmd("info", tmp_path / "s", "--json")
    info = json.loads(res.stdout)
    assert info["documents"] == n and info["tokens"] == tokens and info["dtype"] == "uint8"
    lens = mmpack.open(tmp_path / "s").doc_lens
    assert info["doc_length"]["max"] == lens.max()
    assert info["doc_length"]["p50"] == pytest.approx(np.quantile(lens, 0.5))
    assert info["bytes_on_disk"] >= tokens + 8 * (n + 1)


def test_info_counts_each_file_of_a_joined_store_once(tmp_path, capsys):
    """A distributed build keeps its parts inside the join folder: they were counted once in the
    folder and again as parts (1.3 MiB for 0.67 MiB of files)."""
    for k in range(3):
        (tmp_path / f"in{k}.txt").write_text(f"document {k} " * 500)
    assert (
        main(
            [
                "build",
                str(tmp_path / "in0.txt"),
                "-o",
                str(tmp_path / "one"),
                "--engine",
                "serial",
                "--no-progress",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.rstrip().endswith("(1 part, engine serial)")
    report = build_distributed(
        sorted(map(str, tmp_path.glob("in*.txt"))),
        tmp_path / "three",
        engine="serial",
        part_bytes=1,
    )
    assert len(report.store.parts) == 3
    for built in ("one", "three"):
        assert _info_json(tmp_path / built, capsys)["bytes_on_disk"] == _files_bytes(
            tmp_path / built
        )
    a = mmpack.build(tmp_path / "a", [[1, 2, 3]] * 50)
    b = mmpack.build(tmp_path / "b", [[4, 5]] * 70)
    mmpack.join([a.path, b.path, a.path], tmp_path / "j")  # parts outside it, one named twice
    info = _info_json(tmp_path / "j", capsys)
    assert info["bytes_on_disk"] == _files_bytes(tmp_path / "j", a.path, b.path)


def test_show_windows_the_seed_example(seed_store):
    res = mmpack_cmd("show", seed_store, "--seqlen", 8, "--stride", 4, "-i", 27, "--eot", 420)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "window 27 of 28 (seqlen 8, stride 4, eot 420, pad 0)"
    # The stream is 118 tokens; window 27 is S[108:116]: the last document's tokens 0..7.
    assert lines[1] == "input_ids      [0, 1, 2, 3, 4, 5, 6, 7]"
    assert "doc 9 tokens 0..8" in res.stdout
    res = mmpack_cmd("show", seed_store, "--seqlen", 8, "--stride", 4, "-i", 28, "--eot", 420)
    assert_one_line_error(res, "out of range", "28 samples")


def test_show_packed_and_decode(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        "".join(
            json.dumps({"text": t}) + "\n" for t in ["alpha beta", "gamma", "delta epsilon zeta"]
        )
    )
    res = mmpack_cmd("build", tmp_path / "a.jsonl", "-o", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    res = mmpack_cmd(
        "show", tmp_path / "s", "--packed", "--seqlen", 40, "--eot", 256, "-i", 0, "--decode"
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("packed row 0 of 1 (seqlen 40, bfd, eot 256, pad 0)")
    # Best-fit decreasing: longest first (18, 10, 5 tokens), each followed by its eot, then
    # the padding as the last segment.
    assert "cu_seqlens     [0, 19, 30, 36, 40]" in out
    assert (
        "from           doc 2 tokens 0..18 + eot; doc 0 tokens 0..10 + eot; "
        "doc 1 tokens 0..5 + eot" in out
    )
    segments = out.split("--- positions ")[1:]
    assert [s.split("\n", 1)[1] for s in segments[:3]] == [
        "delta epsilon zeta<|endoftext|>\n",
        "alpha beta<|endoftext|>\n",
        "gamma<|endoftext|>\n",
    ]
    assert segments[3] == "36..40 ---\n" + "\x00" * 4 + "\n"  # pad id 0


def test_show_packed_marks_the_eot_where_the_row_has_one(tmp_path):
    """A document exactly ``seqlen`` long fills a row without its eot (which comes in a
    zero-length piece of its own): ``show --packed`` says so, as the row's tokens do."""
    mmpack.build(tmp_path / "s", [[1] * 8, [2, 3]])
    froms = []
    for i in range(3):
        res = mmpack_cmd("show", tmp_path / "s", "--packed", "--seqlen", 8, "--eot", 99, "-i", i)
        if res.returncode != 0:
            break
        froms += [line for line in res.stdout.splitlines() if line.startswith("from ")]
    pieces = sorted(p.strip() for line in froms for p in line[len("from ") :].split(";"))
    assert pieces == ["doc 0 tokens 0..8", "doc 0 tokens 8..8 + eot", "doc 1 tokens 0..2 + eot"]


def _files_bytes(*folders):
    """Bytes of every file under ``folders``, each file counted once."""
    seen = {
        f.resolve(): f.stat().st_size for d in folders for f in Path(d).rglob("*") if f.is_file()
    }
    return sum(seen.values())


def _info_json(store, capsys):
    capsys.readouterr()
    assert main(["info", str(store), "--json"]) == 0
    return json.loads(capsys.readouterr().out)
