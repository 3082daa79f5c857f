"""The ``mmpack`` command, run as users run it: a subprocess of the real entry point
(``python -m mmpack`` and the installed ``mmpack`` script) on small real corpora.

Run: ``.venv/bin/python -m pytest tests/cli/test_commands.py -q``.
"""

from __future__ import annotations

import argparse
import errno
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _text_corpora import DATA, stdlib_texts, train_bpe

import mmpack
import mmpack.errors
from mmpack import ResumableSampler
from mmpack._src.cli.commands import build_parser
from mmpack.cli import compare_packing, main
from mmpack.ingest import build_distributed, load_tokenizer

SEED_LENGTHS = [15, 13, 11, 13, 15, 8, 14, 8, 11, 10]  # the seed's table, with their eot
SEED_DOCS = [list(range(n - 1)) for n in SEED_LENGTHS]
SUBCOMMANDS = ["build", "info", "show", "pack", "verify", "demo", "bench"]


def mmpack_cmd(*args, cwd=None, script=False, timeout=120):
    cmd = [_script()] if script else [sys.executable, "-m", "mmpack"]
    return subprocess.run(
        cmd + [str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def _script() -> str:
    path = Path(sys.executable).with_name("mmpack")
    return str(path) if path.exists() else shutil.which("mmpack")


def assert_one_line_error(res, *fragments):
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("mmpack: error: ")
    assert "Traceback" not in res.stderr
    for frag in fragments:
        assert frag in lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text files, JSONL and Parquet made of real text, plus bad files of every kind."""
    root = tmp_path_factory.mktemp("corpus")
    texts = stdlib_texts(150_000, skip=30)
    (root / "docs").mkdir()
    for k, t in enumerate(texts[:6]):
        (root / "docs" / f"{k:02d}.txt").write_text(t, encoding="utf-8")
    with open(root / "records.jsonl", "w", encoding="utf-8") as f:
        for t in texts[6:]:
            f.write(json.dumps({"content": t}) + "\n")
    pq.write_table(pa.table({"content": texts[:4], "n": [1, 2, 3, 4]}), root / "table.parquet")
    (root / "docs" / "zz_latin1.txt").write_bytes("naïve".encode("latin-1"))
    (root / "empty.jsonl").write_text("")
    shutil.copy(DATA / "bad_records.jsonl", root / "bad.jsonl")
    pq.write_table(pa.table({"content": [1, 2, 3]}), root / "numbers.parquet")
    return root, texts


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def seed_store(tmp_path_factory):
    return mmpack.build(tmp_path_factory.mktemp("seed") / "s", SEED_DOCS).path


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


# ----------------------------------------------------------------------------- info, show, pack
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


# ----------------------------------------------------------------------------- show --position
def _served(store, capsys, *argv):
    """``show --position ...`` in process: (exit code, the sample it names, stdout, stderr)."""
    code = main(["show", str(store), *map(str, argv)])
    out, err = capsys.readouterr()
    found = re.search(r"-> sample (\d+)$", out.splitlines()[0]) if code == 0 else None
    return code, int(found.group(1)) if found else None, out, err


def _run_order(n, epochs, world, drop_last=False, **options):
    """The naive list model of a run: every (global position -> sample) over ``epochs``, from
    each rank's own iterator, interleaved as the ranks consume the epoch order together."""
    served = []
    for epoch in range(epochs):
        shares = []
        for rank in range(world):
            sampler = ResumableSampler(
                n, rank=rank, world_size=world, drop_last=drop_last, **options
            )
            sampler.set_epoch(epoch)
            shares.append([int(i) for i in sampler])
        served += [shares[g % world][g // world] for g in range(world * len(shares[0]))]
    return served


@pytest.mark.parametrize(
    "world, shuffle, packed, drop_last",
    [
        (1, "true", False, False),
        (3, "true", True, False),
        (4, "false", False, True),
        (2, "blocks", False, False),
        (3, "blocks", True, True),
    ],
)
def test_show_position_names_what_the_run_served(
    seed_store, capsys, world, shuffle, packed, drop_last
):
    view = ["--seqlen", 8, "--stride", 3, "--eot", 420] + (["--packed"] if packed else [])
    ds = (
        mmpack.PackedDataset(seed_store, 8, eot=420)
        if packed
        else mmpack.WindowDataset(seed_store, 8, 3, eot=420)
    )
    run = ["--seed", 11, "--shuffle", shuffle, "--world-size", world]
    options: dict = {"seed": 11, "shuffle": {"true": True, "false": False}.get(shuffle, shuffle)}
    if shuffle == "blocks":
        run += ["--block-bytes", 16, "--window-blocks", 2]
        options.update(block_bounds=ds.block_bounds(16), window_blocks=2)
    if drop_last:
        run.append("--drop-last")
    want = _run_order(len(ds), 2, world, drop_last, **options)  # what the ranks served, in turn
    n, served = len(ds), len(want) // 2  # global positions per epoch, positions served per epoch
    for p in sorted({0, 1, n - 1, n, 2 * n - 1, 2 * n // 3}):
        e, g = divmod(p, n)  # the sampler's global position: epoch e, epoch position g
        code, got, out, err = _served(seed_store, capsys, *view, *run, "--position", p)
        if g >= served:  # dropped by --drop-last: served by no rank
            assert code == 1 and "no rank served it" in err, err
            continue
        assert code == 0, err
        assert got == want[e * served + g], p
        # the rest is what show -i prints of that sample
        assert main(["show", str(seed_store), *map(str, view), "-i", str(got)]) == 0
        assert out.split("\n", 1)[1] == capsys.readouterr().out
        # --epoch: a position of that epoch; --rank: that rank's own samples
        assert _served(seed_store, capsys, *view, *run, "--epoch", e, "--position", g)[1] == got
        t, r = divmod(g, world)
        own = e * (served // world) + t
        argv = [*view, *run, "--rank", r, "--position", own]
        assert _served(seed_store, capsys, *argv)[1] == got


def test_show_position_refusals_are_one_line(seed_store, capsys):
    view = ["--seqlen", 8, "--eot", 420]
    cases = [
        (["-i", 0, "--seed", 3], "--seed describes the run of --position"),
        (["--position", 0, "--block-bytes", 64], "--block-bytes is for --shuffle blocks"),
        (["--position", 20, "--epoch", 0], "past epoch 0, which has 14 positions"),
        (["--position", 0, "--rank", 2, "--world-size", 2], "--rank 2 needs --world-size"),
        (["--position", 0, "--world-size", 20, "--drop-last"], "give no rank any"),
    ]
    for argv, message in cases:
        code, _, _, err = _served(seed_store, capsys, *view, *argv)
        assert code == 1 and err.count("\n") == 1 and message in err, err
    with pytest.raises(SystemExit):  # argparse: -i and --position are exclusive
        main(["show", str(seed_store), "--seqlen", "8", "-i", "0", "--position", "0"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert_one_line_error(  # as users run it
        mmpack_cmd("show", seed_store, *view, "--position", 14, "--epoch", 0), "past epoch 0"
    )


def test_show_position_takes_the_state_a_loader_saved(seed_store, capsys, tmp_path):
    """The loader's state as the loop saves it (torch.save, or its JSON), over a view, over
    Stages (a position of the stage it was saved in) and over a mixture (down to its index)."""
    import torch

    import mmpack.torch
    from mmpack import Mixture
    from mmpack.torch import stage_seed

    view = ["--seqlen", 8, "--stride", 3, "--eot", 420]
    ds = mmpack.WindowDataset(seed_store, 8, 3, eot=420)
    short = mmpack.WindowDataset(seed_store, 4, eot=420)

    def saved(loader, name, batches):
        for k, _ in enumerate(loader):
            if k + 1 == batches:
                break
        state = loader.state_dict()
        torch.save(state, tmp_path / f"{name}.pt")
        (tmp_path / f"{name}.json").write_text(json.dumps(state))
        return [str(tmp_path / f"{name}{suffix}") for suffix in (".pt", ".json")]

    over_view = saved(mmpack.torch.loader(ds, 2, seed=11, rank=1, world_size=2), "view", 3)
    want = _run_order(len(ds), 2, 2, seed=11)
    stages = mmpack.Stages([(6, short, 2), (40, ds, 2)], seed=4)
    over_stages = saved(mmpack.torch.loader(stages), "stages", 5)  # 2 steps into stage 1
    stage_order = _run_order(len(ds), 2, 1, seed=stage_seed(4, 1))
    mix = Mixture([ds, ds], [1, 1])
    over_mixture = saved(mmpack.torch.loader(mix, 2), "mixture", 1)
    for path in (*over_view, *over_stages):
        for p in (0, 5, len(ds) + 1):
            code, got, out, err = _served(
                seed_store, capsys, *view, "--state", path, "--position", p
            )
            assert code == 0, err
            if path in over_view:
                e, g = divmod(p, len(ds))
                assert got == want[e * (len(want) // 2) + g] and "rank " in out
            else:
                assert got == stage_order[p] and out.startswith(f"position {p}: stage 1")
    for path in over_mixture:
        code, _, _, err = _served(seed_store, capsys, *view, "--state", path, "--position", 3)
        assert code == 1 and f"n={len(mix)}" in err, err  # not the view's run
        argv = [*view, "--state", path, "--index-only", "--position", 3]
        code, _, out, err = _served(seed_store, capsys, *argv)
        index = int(list(ResumableSampler(len(mix), seed=0))[3])
        assert code == 0 and out.count("\n") == 1, err
        assert f"-> sample {index} of the run's dataset ({len(mix)} samples" in out
    (tmp_path / "other.json").write_text(json.dumps({"step": 3}))
    (tmp_path / "junk.bin").write_bytes(bytes(range(200, 256)))
    for path, message in ((tmp_path / "other.json", "lacks the fields"),
                          (tmp_path / "junk.bin", "neither JSON nor a torch.save file")):  # fmt: skip
        code, _, _, err = _served(seed_store, capsys, *view, "--state", path, "--position", 0)
        assert code == 1 and message in err and "give the state your loop saved" in err, err
        assert err.count("\n") == 1


def _stream_positions(n, epoch, state):
    """The naive list model of epoch ``epoch``'s stream: its global positions in serving order,
    the state's replays inserted where it says, its skipped positions removed."""
    raw = [epoch * n + j for j in range(n)]
    for e, at, a, b in state["replays"]:
        if e == epoch:
            raw[at:at] = list(range(a, b))
    return [p for p in raw if not any(a <= p < b for a, b in state["skips"])]


def test_show_position_follows_a_states_skips_and_replays(seed_store, capsys, tmp_path):
    view = ["--seqlen", 8, "--stride", 3, "--eot", 420]
    n, world = len(mmpack.WindowDataset(seed_store, 8, 3, eot=420)), 2
    run = ResumableSampler(n, seed=11, world_size=world)
    drawn = iter(run)
    [next(drawn) for _ in range(3)]  # the ranks have consumed positions 0..5
    run.replay(1, 4)  # e.g. after a restore: served again next
    run.skip(7, 10)  # a loss spike's positions, never served
    run.skip(n + 2, n + 4)  # and two of epoch 1
    state = run.state_dict()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    shares = []  # what each rank's own iterator serves over two epochs, from epoch 0's start
    for rank in range(world):
        sampler = ResumableSampler(n, seed=11, world_size=world, rank=rank)
        sampler.load_state_dict({**state, "rank": rank, "position": 0, "offset": 0})
        own = [int(i) for i in sampler]
        sampler.set_epoch(1)
        shares.append((own, [int(i) for i in sampler]))
    for p in range(2 * n):
        e = p // n
        code, got, out, err = _served(seed_store, capsys, *view, "--state", path, "--position", p)
        positions = _stream_positions(n, e, state)
        if p not in positions:
            assert code == 1 and "is skipped" in err and "no rank served it" in err, err
            continue
        assert code == 0, err
        s = positions.index(p)  # served first in the epoch's own order, then replayed
        assert got == shares[s % world][e][s // world], p
        assert f"stream index {s} (global position {p})," in out
    for rank in range(world):
        own = shares[rank][0] + shares[rank][1]
        for t in range(len(own)):
            argv = [*view, "--state", path, "--rank", rank, "--position", t]
            code, got, out, err = _served(seed_store, capsys, *argv)
            assert code == 0 and got == own[t], (rank, t, err)
            e, u = (0, t) if t < len(shares[rank][0]) else (1, t - len(shares[rank][0]))
            positions = _stream_positions(n, e, state)
            s = u * world + rank
            replayed = s < len(positions) and positions.index(positions[s]) != s
            assert (", a replay)" in out) == replayed, out
    code, _, _, err = _served(
        seed_store, capsys, *view, "--state", path, "--seed", 1, "--position", 0
    )
    assert code == 1 and "--seed is recorded by --state" in err, err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**state, "n": n + 1}))
    code, _, _, err = _served(seed_store, capsys, *view, "--state", other, "--position", 0)
    assert code == 1 and f"n={n + 1}" in err and err.count("\n") == 1, err


def test_pack_compares_algorithms_and_baselines(seed_store):
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for name in (
        "best-fit decreasing",
        "online best fit",
        "next fit",
        "pad (1 doc/row)",
        "concat + chunk",
    ):
        assert name in out
    # the seed store records no tokenizer: by default (eot 'store'), as its views, no eot
    assert "108 tokens to place (without an eot), seqlen 16" in out
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--eot", 420)
    assert "118 tokens to place (with an eot (420) per document), seqlen 16" in res.stdout
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--json", "--no-eot")
    got = json.loads(res.stdout)
    lens = mmpack.open(seed_store).doc_lens
    want = compare_packing(lens, 16, add_eot=False, algorithms=("bfd", "online", "nextfit"))
    assert [m["method"] for m in got["methods"]] == ["bfd", "online", "nextfit", "pad", "chunk"]
    for g, w in zip(got["methods"], want):
        assert (g["rows"], g["tokens"], g["padding"]) == (w["rows"], w["tokens"], w["padding"])
    pad = got["methods"][3]
    assert pad["rows"] == 10 and pad["tokens"] == 108  # one row per document, no eot


def test_compare_packing_baselines_by_hand():
    rows = {r["method"]: r for r in compare_packing([3, 0, 9, 4], 5, add_eot=True)}
    # slots 4, 1, 10, 5 -> 20 tokens; padding: 1 + 1 + 2 + 1 rows
    assert (rows["pad"]["rows"], rows["pad"]["tokens"], rows["pad"]["docs_cut"]) == (5, 20, 1)
    # chunk: [0,4) [4,5) [5,15) [15,20) over rows of 5 -> only the 10-slot document is cut
    assert (rows["chunk"]["rows"], rows["chunk"]["docs_cut"]) == (4, 1)
    assert rows["chunk"]["efficiency"] == 1.0 and rows["pad"]["efficiency"] == 20 / 25
    assert rows["bfd"]["tokens"] == 20 and rows["bfd"]["rows"] >= 4
    drop = {r["method"]: r for r in compare_packing([3, 0, 9, 4], 5, long_docs="drop")}
    assert drop["pad"]["tokens"] == 10 == drop["bfd"]["tokens"]


# ----------------------------------------------------------------------------- verify, errors
def test_verify_ok_and_corrupt(tmp_path):
    store = mmpack.build(tmp_path / "s", [np.arange(1000) % 200, [1, 2, 3]])
    res = mmpack_cmd("verify", store.path)
    assert res.returncode == 0 and ": ok, 2 checksum blocks" in res.stdout
    assert store.fingerprint in res.stdout
    tokens = tmp_path / "s" / "tokens.bin"
    data = bytearray(tokens.read_bytes())
    data[500] ^= 0xFF
    tokens.write_bytes(bytes(data))
    res = mmpack_cmd("verify", store.path)
    assert_one_line_error(res, "tokens block 0", "checksum")


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


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["build", "x.txt"],  # -o is required
        ["build", "x.txt", "-o", "s", "--workers", "0"],
        ["build", "x.txt", "-o", "s", "--on-error", "maybe"],
        ["show", "s", "-i", "0"],  # --seqlen is required
        ["show", "s", "--seqlen", "-3", "-i", "0"],
        ["pack", "s", "--seqlen", "many"],
        ["info"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("mmpack")
    assert "error:" in err


def test_bad_arguments_exit_2_in_a_subprocess():
    res = mmpack_cmd("show", "s", "--seqlen", "x", "-i", "0")
    assert res.returncode == 2
    assert "argument --seqlen: expected an integer, got 'x'" in res.stderr


def test_build_missing_input_and_bad_tokenizer(tmp_path):
    res = mmpack_cmd("build", str(tmp_path / "*.jsonl"), "-o", tmp_path / "s")
    assert_one_line_error(res, "no file matches")
    (tmp_path / "a.txt").write_text("x")
    res = mmpack_cmd(
        "build", tmp_path / "a.txt", "-o", tmp_path / "s", "--tokenizer", tmp_path / "missing.json"
    )
    assert_one_line_error(res, "missing.json", "does not exist")


# ----------------------------------------------------------------------------- help, script
@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_complete_help(sub, capsys):
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: mmpack {sub}")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in subparsers.choices[sub]._actions:
        assert action.help and action.help != argparse.SUPPRESS, (sub, action.dest)


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


# ----------------------------------------------------------------------------- demo
@pytest.mark.slow
def test_demo(tmp_path):
    t0 = time.perf_counter()
    res = mmpack_cmd("demo", "--out", tmp_path, script=True, timeout=300)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "== 1. Build" in out and "uint8" in out
    assert "seqlen 8, stride 4: 28 samples" in out
    for method in ("bfd", "online", "pad", "chunk"):
        assert method in out
    assert "seqlen 2048:" in out and "seqlen 8192:" in out and "cu_seqlens [0," in out
    assert "p50" in out and "M tokens/s" in out
    store = mmpack.open(tmp_path / "stdlib")
    assert store.dtype == np.uint8 and len(store) > 1000
    assert elapsed < 60


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
    import mmpack._src.store.writer

    def fail(self, *args, **kwargs):
        raise OSError(err, os.strerror(err), str(self._tmp / "tokens.bin"))

    monkeypatch.setattr(mmpack.store.StoreWriter, "add_batch", fail)
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


@pytest.mark.parametrize(
    ("argv", "flag", "text"),
    [
        (
            ["show", "s", "--seqlen", str(2**31), "-i", "0"],
            "--seqlen",
            "<= 2147483647 (cu_seqlens are int32)",
        ),
        (["pack", "s", "--seqlen", str(2**31)], "--seqlen", "<= 2147483647"),
        (
            ["show", "s", "--seqlen", "8", "-i", "0", "--eot", str(2**63)],
            "--eot",
            "(ids are int64)",
        ),
        (["show", "s", "--seqlen", "8", "-i", "0", "--pad-id", str(2**63)], "--pad-id", "int64"),
        (["show", "s", "--seqlen", "8", "-i", "0", "--stride", str(2**70)], "--stride", "int64"),
    ],
)
def test_out_of_range_values_name_their_flag(argv, flag, text, capsys):
    """These reached the library, whose messages spoke Python (`seqlen=2147483648 does not fit`,
    `eot=9223372036854775808 does not fit in int64`)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in last and text in last and f"{flag[2:]}=" not in last
