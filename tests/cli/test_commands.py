"""The ``mmpack`` command, run as users run it: a subprocess of the real entry point
(``python -m mmpack`` and the installed ``mmpack`` script) on small real corpora.

Run: ``.venv/bin/python -m pytest tests/cli/test_commands.py -q``.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import time

import numpy as np
import pytest
from _cli import SUBCOMMANDS, assert_one_line_error, mmpack_cmd

import mmpack
import mmpack.errors
from mmpack._src.cli.commands import build_parser
from mmpack.cli import main
from mmpack.ingest import load_tokenizer


# ----------------------------------------------------------------------------- build
def test_build_reports_bad_records_and_counts(corpus, tmp_path):
    root, texts = corpus
    res = mmpack_cmd(
        "build",
        "docs/*.txt",
        "records.jsonl",
        "table.parquet",
        "bad.jsonl",
        "empty.jsonl",
        "numbers.parquet",
        "-o",
        tmp_path / "s",
        "--field",
        "content",
        "--on-error",
        "skip",
        cwd=root,
    )
    assert res.returncode == 0, res.stderr
    err = res.stderr.strip().splitlines()
    # bad.jsonl keeps its texts under "text": with --field content no record of it has one.
    assert err[0] == "mmpack: skipped: docs/zz_latin1.txt: invalid UTF-8 at byte 2"
    assert err[1] == "mmpack: skipped: bad.jsonl:1: field 'content' is missing"
    assert err[2].startswith("mmpack: skipped: bad.jsonl:2: invalid UTF-8 at byte")
    assert err[3].startswith("mmpack: skipped: bad.jsonl:3: invalid JSON")
    assert err[4].startswith("mmpack: skipped: bad.jsonl:4: the record is a list")
    assert err[6] == "mmpack: skipped: bad.jsonl:6: field 'content' is missing"
    assert err[-2] == "mmpack: note: empty.jsonl: the file holds no records"
    assert err[-1].startswith("mmpack: skipped: numbers.parquet: column 'content' has type int64")
    assert len(err) == 1 + 10 + 2
    n_good = 6 + (len(texts) - 6) + 4
    out = res.stdout.strip()
    assert out.startswith(f"read {n_good + 1 + 10 + 3} documents: wrote {n_good} (")
    assert f"skipped {1 + 10 + 3} with errors and 0 empty" in out
    store = mmpack.open(tmp_path / "s")
    tok = load_tokenizer(None)
    assert [tok.decode(store[j]) for j in range(len(store))] == texts[:6] + texts[6:] + texts[:4]


def test_build_on_error_fail_leaves_nothing(corpus, tmp_path):
    root, _ = corpus
    res = mmpack_cmd(
        "build",
        root / "records.jsonl",
        root / "bad.jsonl",
        "-o",
        tmp_path / "s",
        "--field",
        "content",
        "--on-error",
        "fail",
        "--no-progress",
    )
    assert_one_line_error(res, "bad.jsonl:1: field 'content' is missing", "(--on-error fail)")
    assert "on_error" not in res.stderr
    assert not (tmp_path / "s").exists() and os.listdir(tmp_path) == []


def test_build_lines_skip_empty_overwrite(tmp_path):
    (tmp_path / "l.txt").write_text("a\n\nb\n")
    res = mmpack_cmd("build", tmp_path / "l.txt", "--lines", "-o", tmp_path / "s")
    assert res.returncode == 0 and "wrote 3" in res.stdout
    res = mmpack_cmd("build", tmp_path / "l.txt", "--lines", "-o", tmp_path / "s")
    assert_one_line_error(res, "exists; pass --overwrite to replace it")
    res = mmpack_cmd(
        "build",
        tmp_path / "l.txt",
        "--lines",
        "--skip-empty",
        "--overwrite",
        "--backend",
        "zarr",
        "-o",
        tmp_path / "s",
    )
    assert res.returncode == 0 and "wrote 2" in res.stdout and "1 empty" in res.stdout
    store = mmpack.open(tmp_path / "s")
    assert store.backend == "zarr" and store.doc_lens.tolist() == [1, 1]


@pytest.mark.parametrize("engine", ["local", "serial"])
@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_rebuild_never_reads_its_output(tmp_path, capsys, engine, backend):
    """`build 'in/**/*.json*' -o in/out --overwrite` read the store it replaced (mmpack.json, and
    with --format-for '*.bin=text' its tokens.bin) as documents."""
    (tmp_path / "in").mkdir()
    for k in range(2):
        (tmp_path / "in" / f"{k}.jsonl").write_text(
            "".join(json.dumps({"text": f"doc {k}.{j}"}) + "\n" for j in range(3))
        )
    out = tmp_path / "in" / "out"
    base = ["-o", str(out), "--engine", engine, "--backend", backend, "--no-progress"]
    base += ["--on-error", "skip"]
    expected = [f"doc {k}.{j}" for k in range(2) for j in range(3)]
    tok = load_tokenizer(None)
    for pattern in ("in/**/*.json*", "in/**/*"):
        for _ in range(2):  # the second build replaces the first, which lies under the glob
            argv = [*base, "--overwrite", "--format-for", "*.bin=text", "--format-for", "*=jsonl"]
            assert main(["build", str(tmp_path / pattern), *argv]) == 0, capsys.readouterr().err
            assert "skipped 0 with errors" in capsys.readouterr().out
            store = mmpack.open(out)
            assert [tok.decode(d) for d in store] == expected
    inside = (
        out / "parts"
        if engine == "serial"
        else out / ("tokens.bin" if backend == "memmap" else "zarr.json")
    )
    for named in (inside, out):
        argv = ["build", str(tmp_path / "in" / "0.jsonl"), str(named), *base, "--overwrite"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(
            f"mmpack: error: input {str(named)!r} lies inside --output {str(out)}"
        )
        assert "output=" not in err and len(err.strip().splitlines()) == 1
    assert [tok.decode(d) for d in mmpack.open(out)] == expected  # untouched


@pytest.mark.slow
def test_build_bpe_same_bytes_with_one_and_two_workers(corpus, bpe, tmp_path, monkeypatch):
    root, texts = corpus
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the provenance's build time
    for name, workers in [("w1", 1), ("w2", 2)]:
        res = mmpack_cmd(
            "build",
            root / "records.jsonl",
            "--field",
            "content",
            "--tokenizer",
            bpe,
            "--workers",
            workers,
            "--batch-size",
            3,
            "--no-progress",
            "-o",
            tmp_path / name,
        )
        assert res.returncode == 0, res.stderr
        assert res.stderr == "" and f"({workers} worker" in res.stdout
    for f in ("tokens.bin", "offsets.bin", "mmpack.json", "tokenizer.json"):
        assert (tmp_path / "w1" / f).read_bytes() == (tmp_path / "w2" / f).read_bytes()
    store = mmpack.open(tmp_path / "w2")
    tok = load_tokenizer(bpe)
    assert store.dtype == np.uint16
    assert [tok.decode(store[j]) for j in range(len(store))] == texts[6:]
    # show --decode with the same tokenizer gives the text back.
    res = mmpack_cmd(
        "show", tmp_path / "w2", "--seqlen", 64, "-i", 0, "--decode", "--tokenizer", bpe
    )
    assert res.returncode == 0, res.stderr
    decoded = res.stdout.split("--- positions 0..64 ---\n", 1)[1]
    assert decoded.rstrip("\n") == tok.decode(store[0][:64])
    assert texts[6].startswith(decoded.rstrip("\n")[:40])


# ----------------------------------------------------------------------------- verify, errors
def test_missing_store_is_one_line_exit_1(tmp_path):
    res = mmpack_cmd("info", tmp_path / "nope")
    assert_one_line_error(res, "no mmpack store", "nope")
    assert res.stdout == ""


@pytest.mark.parametrize(
    "command",
    [
        ["info"],
        ["verify"],
        ["pack", "--seqlen", "8"],
        ["show", "--seqlen", "8", "-i", "0"],
    ],
)
def test_every_command_reports_a_missing_or_foreign_store_in_one_line(tmp_path, command, capsys):
    """In-process (the subprocess path is covered above): exit code 1 and one line."""
    (tmp_path / "folder").mkdir()
    for target, fragment in [("nope", "no mmpack store"), ("folder", "is not an mmpack store")]:
        assert main([command[0], str(tmp_path / target), *command[1:]]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mmpack: error: ") and fragment in err


def test_corrupt_metadata_is_one_line_exit_1(seed_store, tmp_path):
    shutil.copytree(seed_store, tmp_path / "s")
    (tmp_path / "s" / "mmpack.json").write_text("{ not json")
    assert_one_line_error(mmpack_cmd("info", tmp_path / "s"))


def test_build_missing_input_and_bad_tokenizer(tmp_path):
    res = mmpack_cmd("build", str(tmp_path / "*.jsonl"), "-o", tmp_path / "s")
    assert_one_line_error(res, "no file matches")
    (tmp_path / "a.txt").write_text("x")
    res = mmpack_cmd(
        "build", tmp_path / "a.txt", "-o", tmp_path / "s", "--tokenizer", tmp_path / "missing.json"
    )
    assert_one_line_error(res, "missing.json", "does not exist")


# ----------------------------------------------------------------------------- help, script
def test_the_installed_script_and_top_level_help(seed_store):
    t0 = time.perf_counter()
    res = mmpack_cmd("--help", script=True)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0
    for sub in SUBCOMMANDS:
        assert sub in res.stdout
    assert elapsed < 10
    res = mmpack_cmd("info", seed_store, script=True)
    assert res.returncode == 0 and "documents    10 (0 empty)" in res.stdout


def test_bench_passes_its_arguments_on():
    res = mmpack_cmd("bench", "--", "--help")
    assert res.returncode == 0 and "usage: python -m benchmarks" in res.stdout


# ----------------------------------------------------------------------------- issue 13
def test_messages_name_flags_not_python_parameters(tmp_path):
    """Issue 13 item 16: messages said `pass overwrite=True`, `or pass format=`,
    `(on_error='fail')`."""
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "q.bas").write_text("10 PRINT")
    res = mmpack_cmd("build", tmp_path / "a.txt", "-o", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    res = mmpack_cmd("build", tmp_path / "a.txt", "-o", tmp_path / "s")
    assert_one_line_error(res, "exists; pass --overwrite to replace it")
    res = mmpack_cmd("build", tmp_path / "q.bas", "-o", tmp_path / "t")
    assert_one_line_error(res, "pass --text-ext .bas to read it as text, or --format (one of")
    for res in (
        mmpack_cmd("build", tmp_path / "a.txt", "-o", tmp_path / "s"),
        mmpack_cmd("build", tmp_path / "q.bas", "-o", tmp_path / "t"),
    ):
        assert "=True" not in res.stderr and "format=" not in res.stderr
    # The library keeps its Python spelling.
    with pytest.raises(mmpack.errors.StoreExistsError, match=r"pass overwrite=True"):
        mmpack.build(tmp_path / "s", [[1]])


def test_flag_speller_maps_every_build_parameter():
    from mmpack.errors import Param

    spell = __import__("mmpack._src.cli.commands", fromlist=["_flag_speller"])._flag_speller(
        build_parser()._subparsers._group_actions[0].choices["build"]
    )
    assert spell(Param("overwrite", True)) == "--overwrite"
    assert spell(Param("on_error", "skip")) == "--on-error skip"
    assert spell(Param("field", "content")) == "--field content"
    assert spell(Param("format")) == "--format"
    assert spell(Param("text_extensions", [".a", ".b"])) == "--text-ext .a,.b"
    assert spell(Param("dtype", "uint8")) == "dtype='uint8'"  # no such flag: Python spelling
    show = build_parser()._subparsers._group_actions[0].choices["show"]
    spell = __import__("mmpack._src.cli.commands", fromlist=["_flag_speller"])._flag_speller(show)
    assert spell(Param("eot", None)) == "--no-eot" and spell(Param("eot", 7)) == "--eot 7"
    assert spell(Param("eot", "store")) == "--eot store" and spell(Param("eot")) == "--eot"
    assert spell(Param("check_vocab", False)) == "--no-check-vocab"
    assert spell(Param("pad_id", 3)) == "--pad-id 3"


def test_more_messages_name_flags(tmp_path, bpe, capsys):
    """Messages that reached the command in Python terms: `pass overwrite=True` from a
    distributed build, `overwrite replaces only ...`, `template='tokenizer'`, `eot=300 is
    outside the vocabulary ... check_vocab=False`, `pass mixed_tokenizers=True`."""

    def error(*argv):
        capsys.readouterr()
        assert main([str(a) for a in argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("mmpack: error: ") and len(err.strip().splitlines()) == 1, err
        assert not re.search(r"\b[a-z_]+=", err), err  # no Python keyword spelling
        return err

    (tmp_path / "a.txt").write_text("some text")
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    assert main(["build", str(tmp_path / "a.txt"), "-o", str(tmp_path / "s"), "--no-progress"]) == 0
    serial = ("--engine", "serial", "--no-progress")
    assert "exists; pass --overwrite to replace it" in error(
        "build", tmp_path / "a.txt", "-o", tmp_path / "s", *serial
    )
    for engine in (("--no-progress",), serial):
        assert "refusing to replace it: --overwrite replaces only an mmpack store" in error(
            "build", tmp_path / "a.txt", "-o", tmp_path / "user", "--overwrite", *engine
        )
    assert "--template tokenizer: the byte-level tokenizer has no post-processor" in error(
        "build", tmp_path / "a.txt", "-o", tmp_path / "t", "--template", "tokenizer"
    )
    err = error("show", tmp_path / "s", "--seqlen", 4, "-i", 0, "--eot", 300)
    assert "--eot 300 is outside the vocabulary of the store's tokenizer (257 ids" in err
    assert "pass --eot store to use the tokenizer's own id, or --no-check-vocab if" in err
    argv = ["show", str(tmp_path / "s"), "--seqlen", "4", "-i", "0", "--eot", "300"]
    assert main([*argv, "--no-check-vocab"]) == 0
    assert "eot 300" in capsys.readouterr().out
    assert (
        main(
            [
                "build",
                str(tmp_path / "a.txt"),
                "-o",
                str(tmp_path / "b"),
                "--tokenizer",
                str(bpe),
                "--no-progress",
            ]
        )
        == 0
    )
    parts = [str(tmp_path / "s"), str(tmp_path / "b")]
    err = error("join", *parts, "-o", tmp_path / "j")
    assert "different tokenizers" in err and "pass --mixed-tokenizers if that is intended" in err
    assert main(["join", *parts, "-o", str(tmp_path / "j"), "--mixed-tokenizers"]) == 0


def test_wrong_field_fails_unless_skip_is_explicit(tmp_path):
    """Issue 13 item 16: a wrong --field that skipped 9 of 10 records exited 0."""
    with open(tmp_path / "d.jsonl", "w") as f:
        f.writelines(json.dumps({"text": f"t{k}"}) + "\n" for k in range(9))
        f.write(json.dumps({"content": "c"}) + "\n")
    res = mmpack_cmd("build", tmp_path / "d.jsonl", "--field", "content", "-o", tmp_path / "s")
    assert res.returncode == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 9 + 1 and "Traceback" not in res.stderr
    assert err[-1] == (
        "mmpack: error: 9 of 10 records (90%) were skipped, more than half; "
        "nothing is written. Pass --on-error skip to build from the rest"
    )
    assert os.listdir(tmp_path) == ["d.jsonl"]
    res = mmpack_cmd(
        "build",
        tmp_path / "d.jsonl",
        "--field",
        "content",
        "-o",
        tmp_path / "s",
        "--on-error",
        "skip",
    )
    assert res.returncode == 0 and "wrote 1 (" in res.stdout


def test_an_input_with_no_record_stored_fails(corpus, tmp_path):
    root, _ = corpus
    res = mmpack_cmd(
        "build",
        "records.jsonl",
        "bad.jsonl",
        "--field",
        "content",
        "--no-progress",
        "-o",
        tmp_path / "s",
        cwd=root,
    )
    assert res.returncode == 1 and not (tmp_path / "s").exists()
    assert res.stderr.strip().splitlines()[-1] == (
        "mmpack: error: no record of the input bad.jsonl could be stored (10 skipped; the first: "
        "bad.jsonl:1: field 'content' is missing) (is --field content the right field?); nothing "
        "is written. Pass --on-error skip to build without its records"
    )


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_damaged_gzip_counts_documents_and_stores_none(tmp_path, how):
    lines = [f"line {i} " + "y" * (i % 29) for i in range(3000)]
    raw = gzip.compress(("\n".join(lines) + "\n").encode())
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        b = bytearray(raw)
        b[len(b) // 2] ^= 0x10
        raw = bytes(b)
    (tmp_path / "bad.txt.gz").write_bytes(raw)
    (tmp_path / "good.txt").write_text("g1\ng2\n")
    res = mmpack_cmd(
        "build",
        tmp_path / "good.txt",
        tmp_path / "bad.txt.gz",
        "--lines",
        "-o",
        tmp_path / "s",
        "--no-progress",
    )
    assert res.returncode == 1 and not (tmp_path / "s").exists()
    assert "skipped whole" in res.stderr and "Pass --on-error skip" in res.stderr
    res = mmpack_cmd(
        "build",
        tmp_path / "good.txt",
        tmp_path / "bad.txt.gz",
        "--lines",
        "-o",
        tmp_path / "s",
        "--no-progress",
        "--on-error",
        "skip",
    )
    assert res.returncode == 0, res.stderr
    [issue] = res.stderr.strip().splitlines()
    n = int(issue.split("none of its documents stored (")[1].split(" records")[0])
    assert n > 0
    assert res.stdout.startswith(f"read {2 + n} documents: wrote 2 (")
    assert f"skipped {n} with errors (1 unreadable file skipped whole)" in res.stdout
    assert [bytes(d).decode() for d in mmpack.open(tmp_path / "s")] == ["g1", "g2"]


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC, errno.EACCES])
def test_read_only_and_full_disk_are_one_line(tmp_path, monkeypatch, capsys, err):
    """Issue 13 item 16: an OSError such as ENOSPC printed a traceback.  The error is injected
    where the build writes its tokens (the tests run as root on a roomy disk)."""
    from mmpack.store import StoreWriter

    def fail(self, *args, **kwargs):
        raise OSError(err, os.strerror(err), str(self._tmp / "tokens.bin"))

    monkeypatch.setattr(StoreWriter, "add_batch", fail)
    (tmp_path / "a.txt").write_text("x")
    assert main(["build", str(tmp_path / "a.txt"), "-o", str(tmp_path / "s"), "--no-progress"]) == 1
    out = capsys.readouterr()
    [line] = out.err.strip().splitlines()
    assert line.startswith(f"mmpack: error: {os.strerror(err)}: '") and "Errno" not in line
    assert line.endswith(
        ("(the file system is read-only)", "(the disk is full)", "(permission denied)")
    )
    assert os.listdir(tmp_path) == ["a.txt"]  # nothing published, no temporary folder left


def test_source_files_are_text_without_format(tmp_path):
    (tmp_path / "m.py").write_text("import os\n")
    (tmp_path / "r.rst").write_text("Title\n")
    (tmp_path / "q.bas").write_text("10 PRINT\n")
    (tmp_path / "d.jsonl").write_text('{"text": "j"}\n')
    res = mmpack_cmd(
        "build",
        "*.py",
        "*.rst",
        "*.bas",
        "d.jsonl",
        "--text-ext",
        ".bas",
        "-o",
        "s",
        "--no-progress",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert [bytes(d).decode() for d in mmpack.open(tmp_path / "s")] == [
        "import os\n",
        "Title\n",
        "10 PRINT\n",
        "j",
    ]


def test_eot_is_an_id_in_show_and_pack(seed_store):
    """Issue 13 item 16: `show --eot ID` took an id but `pack --eot` was a switch; the switch
    spelling (`pack --eot` without an id) is refused now, as in `show`."""
    base = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--json", "--eot", 7)
    with_id = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--json", "--eot", 420)
    assert with_id.returncode == 0, with_id.stderr
    a, b = json.loads(base.stdout), json.loads(with_id.stdout)
    assert [m["rows"] for m in a["methods"]] == [m["rows"] for m in b["methods"]]
    assert (a["add_eot"], a["eot"], b["add_eot"], b["eot"]) == (True, 7, True, 420)
    none = json.loads(mmpack_cmd("pack", seed_store, "--seqlen", 16, "--json", "--no-eot").stdout)
    assert (none["add_eot"], none["eot"]) == (False, None)
    for command in (["pack"], ["show", "-i", "0"]):
        res = mmpack_cmd(*command, seed_store, "--seqlen", 8, "--eot")
        assert res.returncode == 2 and "--eot: expected one argument" in res.stderr
    res = mmpack_cmd("show", seed_store, "--seqlen", 8, "-i", 0, "--no-eot")
    assert res.returncode == 0 and "eot None" in res.stdout


def test_every_eot_and_pad_flag_takes_the_same_values(tmp_path):
    """Issue 23 item 21: `pack --eot store` and `show --pad-id store` were refused though
    `show --eot store` worked, and the out-of-vocabulary hint named `check_vocab=False`, which
    no flag spelled.  `--eot ID|store`, `--no-eot` and `--pad-id ID|store` now mean the same in
    every subcommand (default `store`, as the views), and the hint names the flags."""
    tok = {"kind": "byte", "identity": "byte", "source": None, "vocab_size": 300}
    store = mmpack.build(tmp_path / "s", [[1, 2, 3], [4, 5], [6]])
    meta = json.loads((tmp_path / "s" / "mmpack.json").read_text())
    meta["tokenizer"] = tok | {"special_ids": {"eot": 256, "pad": 257}}
    (tmp_path / "s" / "mmpack.json").write_text(json.dumps(meta))
    assert mmpack.open(tmp_path / "s").fingerprint == store.fingerprint  # not part of it
    for argv in (["--eot", "store"], [], ["--eot", 256]):
        res = mmpack_cmd("pack", tmp_path / "s", "--seqlen", 4, "--json", *argv)
        assert res.returncode == 0, res.stderr
        assert (json.loads(res.stdout)["add_eot"], json.loads(res.stdout)["eot"]) == (True, 256)
    for argv in (["--eot", "store", "--pad-id", "store"], []):
        res = mmpack_cmd("show", tmp_path / "s", "--seqlen", 4, "-i", 1, *argv)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines()[0] == "window 1 of 2 (seqlen 4, stride 4, eot 256, pad 257)"
        res = mmpack_cmd("show", tmp_path / "s", "--packed", "--seqlen", 4, "-i", 0, *argv)
        assert "eot 256, pad 257)" in res.stdout.splitlines()[0]
    res = mmpack_cmd("show", tmp_path / "s", "--seqlen", 4, "-i", 0, "--eot", 1000)
    assert_one_line_error(
        res, "--eot 1000 is outside the vocabulary", "pass --eot store", "or --no-check-vocab"
    )
    assert "check_vocab" not in res.stderr
    res = mmpack_cmd("show", tmp_path / "s", "--seqlen", 4, "-i", 0, "--pad-id", 999)
    assert_one_line_error(res, "--pad-id 999 is outside", "--pad-id store", "--no-check-vocab")
    res = mmpack_cmd(
        "show", tmp_path / "s", "--seqlen", 4, "-i", 0, "--eot", 1000, "--no-check-vocab"
    )
    assert res.returncode == 0 and "eot 1000, pad 257)" in res.stdout
    info = mmpack_cmd("info", tmp_path / "s")
    assert "views        eot 256, pad 257 by default" in info.stdout
    plain = mmpack.build(tmp_path / "plain", [[1, 2, 3]])
    info = json.loads(mmpack_cmd("info", plain.path, "--json").stdout)
    assert info["view_defaults"] == {"eot": None, "pad_id": 0}
    res = mmpack_cmd("show", plain.path, "--seqlen", 2, "-i", 0, "--eot", "store")
    assert res.returncode == 0 and "eot None, pad 0)" in res.stdout  # nothing recorded: none


def test_a_closed_pipe_is_not_an_error(seed_store, monkeypatch, capfd):
    """`mmpack info STORE | head -1`: BrokenPipeError is an OSError, yet not an error to report
    (the OSError handler must not catch it first)."""
    import mmpack._src.cli.commands

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(mmpack._src.cli.commands, "_cmd_info", closed)
    assert main(["info", str(seed_store)]) == 0
    assert capfd.readouterr().err == ""
