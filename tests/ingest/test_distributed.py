"""Distributed builds (mmpack._src.ingest.distributed): parts built by tasks on Dask (a LocalCluster on
127.0.0.1, started and closed by the tests) or serially, joined, identical in documents and tokens
to the single-process ``ingest`` of the same inputs; retried tasks leave one part each; a failed
build publishes nothing.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/test_distributed.py``
"""

from __future__ import annotations

import os
import subprocess
import sys

import dask.distributed as distributed
import numpy as np
import pytest
from _text_corpora import train_bpe
from _text_corpora import write_inputs as _write_inputs

import mmpack
from mmpack._src.ingest.pipeline import IngestError
from mmpack._src.joins.parts import JoinedStore
from mmpack.ingest import build_distributed, build_part, ingest, plan_tasks

pytestmark = pytest.mark.dask


def _same(a, b):
    assert len(a) == len(b) and a.num_tokens == b.num_tokens and a.dtype == b.dtype
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.read_range(0, a.num_tokens), b.read_range(0, b.num_tokens))


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as c:
        yield c


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("part_bytes", [1, 40_000, 1 << 30])
def test_serial_parts_equal_single_build(tmp_path, bpe, part_bytes):
    inputs = _write_inputs(tmp_path / "in")
    ref = ingest(inputs, tmp_path / "ref", tokenizer=bpe, workers=1, on_issue=lambda i: None)
    seen = []
    got = build_distributed(
        inputs,
        tmp_path / "out",
        engine="serial",
        tokenizer=bpe,
        part_bytes=part_bytes,
        on_issue=seen.append,
        on_part=lambda k, r: None,
    )
    assert isinstance(got.store, JoinedStore)
    _same(got.store, ref.store)
    assert (got.docs_read, got.docs_written, got.docs_skipped, got.tokens_written) == (
        ref.docs_read,
        ref.docs_written,
        ref.docs_skipped,
        ref.tokens_written,
    )
    assert [str(i) for i in seen] == [str(i) for i in ref.issues]
    assert len(got.store.parts) == len(plan_tasks(inputs, part_bytes=part_bytes))
    assert sorted(os.listdir(tmp_path)) == ["in", "out", "ref"]  # no staging left behind


def test_dask_two_workers_equal_single_build(tmp_path, bpe, cluster):
    inputs = _write_inputs(tmp_path / "in")
    ref = ingest(inputs, tmp_path / "ref", tokenizer=bpe, workers=1, on_issue=lambda i: None)
    done = []
    got = build_distributed(
        inputs,
        tmp_path / "out",
        engine="dask",
        scheduler=cluster.scheduler_address,
        tokenizer=bpe,
        part_bytes=1,
        on_issue=lambda i: None,
        on_part=lambda k, r: done.append(k),
    )
    _same(got.store, ref.store)
    assert sorted(done) == list(range(8)) and got.workers == 2
    assert got.store.verify()["parts"] == 8
    prov = got.store.meta["provenance"]
    assert prov["docs_skipped"] == 1 and len(prov["inputs"]) == 8
    reopened = mmpack.open(tmp_path / "out")
    assert reopened.part_locations[0] == "parts/part-00000"


def test_dask_joins_the_fields_of_parquet_and_datasets(tmp_path, cluster):
    from _fields import engines_join_the_fields

    engines_join_the_fields(tmp_path, "dask", cluster.scheduler_address)


def test_retried_task_leaves_one_part(tmp_path, cluster):
    import _flaky_part
    import cloudpickle

    cloudpickle.register_pickle_by_value(_flaky_part)
    inputs = _write_inputs(tmp_path / "in")
    ref = ingest(inputs, tmp_path / "ref", on_issue=lambda i: None)
    for engine, kw in (("serial", {}), ("dask", {"scheduler": cluster.scheduler_address})):
        out = tmp_path / f"out-{engine}"
        got = build_distributed(
            inputs,
            out,
            engine=engine,
            part_bytes=1,
            retries=1,
            part_function=_flaky_part.flaky_build_part,
            on_issue=lambda i: None,
            **kw,
        )
        assert (tmp_path / "attempted-part-00001").exists()  # the first attempt did fail
        (tmp_path / "attempted-part-00001").unlink()
        _same(got.store, ref.store)
        assert sorted(os.listdir(out / "parts")) == [f"part-{k:05d}" for k in range(8)]
    # the same part written twice is one identical part
    part = tmp_path / "again"
    first = build_part([inputs[1]], str(part), {"tokenizer": "byte"})
    second = build_part([inputs[1]], str(part), {"tokenizer": "byte"})
    assert first["fingerprint"] == second["fingerprint"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".again")] == []


def test_overwrite_replaces_a_distributed_build_but_no_users_files(tmp_path):
    """A distributed build is a join: ``overwrite=True`` replaces it (and an empty folder) like
    any store, but not a join folder that also holds a user's file.  The replaceable rule has
    one home (``mmpack._src.store.publish.check_replaceable``); it used to refuse a join at the
    swap, after the whole build."""
    inputs = _write_inputs(tmp_path / "in", n_files=3, bad_in=-1)
    first = build_distributed(inputs, tmp_path / "out", engine="serial", part_bytes=1)
    again = build_distributed(
        inputs[:1], tmp_path / "out", engine="serial", part_bytes=1, overwrite=True
    )
    assert isinstance(again.store, JoinedStore) and len(again.store) < len(first.store)
    (tmp_path / "empty").mkdir()
    build_distributed(inputs, tmp_path / "empty", engine="serial", overwrite=True)
    (tmp_path / "out" / "keep.txt").write_text("a user's file")
    with pytest.raises(mmpack.errors.StoreExistsError, match="keep.txt"):
        build_distributed(inputs, tmp_path / "out", engine="serial", overwrite=True)
    assert (tmp_path / "out" / "keep.txt").read_text() == "a user's file"
    with pytest.raises(FileExistsError, match="keep.txt"):
        mmpack.build(tmp_path / "out", [[1, 2]], overwrite=True)


def test_failed_build_publishes_nothing(tmp_path, cluster):
    inputs = _write_inputs(tmp_path / "in")
    for engine, kw in (("serial", {}), ("dask", {"scheduler": cluster.scheduler_address})):
        with pytest.raises(IngestError, match="invalid JSON"):
            build_distributed(
                inputs, tmp_path / "out", engine=engine, part_bytes=1, on_error="fail", **kw
            )
        assert sorted(os.listdir(tmp_path)) == ["in"]
    mmpack.build(tmp_path / "out", [[1, 2]])
    with pytest.raises(mmpack.errors.StoreExistsError):
        build_distributed(inputs, tmp_path / "out", engine="serial")
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "keep.txt").write_text("a user's file")
    with pytest.raises(mmpack.errors.StoreExistsError, match="not a store"):
        build_distributed(inputs, tmp_path / "user", engine="serial", overwrite=True)
    assert (tmp_path / "user" / "keep.txt").read_text() == "a user's file"
    replaced = build_distributed(
        inputs, tmp_path / "out", engine="serial", overwrite=True, on_issue=lambda i: None
    )
    assert len(replaced.store) > 1
    with pytest.raises(ValueError, match="engine"):
        build_distributed(inputs, tmp_path / "x", engine="ray")
    with pytest.raises(TypeError, match="workers"):
        build_distributed(inputs, tmp_path / "x", engine="serial", workers=3)


def test_cli_build_with_dask_local_cluster(tmp_path):
    inputs = _write_inputs(tmp_path / "in")
    ref = ingest(inputs, tmp_path / "ref", on_issue=lambda i: None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmpack",
            "build",
            *inputs,
            "-o",
            str(tmp_path / "out"),
            "--engine",
            "dask",
            "--workers",
            "2",
            "--part-mb",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode == 0, r.stderr
    assert "engine dask" in r.stdout and "skipped: " in r.stderr
    _same(mmpack.open(tmp_path / "out"), ref.store)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmpack",
            "build",
            *inputs,
            "-o",
            str(tmp_path / "o2"),
            "--scheduler",
            "tcp://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode == 1 and "--engine dask" in r.stderr and "Traceback" not in r.stderr


def test_template_and_tokenizer_record_reach_the_join(tmp_path, bpe):
    inputs = _write_inputs(tmp_path / "in")
    ref = ingest(
        inputs,
        tmp_path / "ref",
        tokenizer=bpe,
        template="$A <|endoftext|>",
        workers=1,
        on_issue=lambda i: None,
    )
    got = build_distributed(
        inputs,
        tmp_path / "out",
        engine="serial",
        tokenizer=bpe,
        template="$A <|endoftext|>",
        part_bytes=1,
        on_issue=lambda i: None,
    )
    _same(got.store, ref.store)
    assert got.store.meta["tokenizer"]["template"] == "$A <|endoftext|>"
    assert got.store[0][-1] == got.store.meta["tokenizer"]["special_ids"]["eot"]


def test_progress_shows_parts_documents_tokens(tmp_path, capsys):
    inputs = _write_inputs(tmp_path / "in")
    got = build_distributed(
        inputs,
        tmp_path / "out",
        engine="serial",
        part_bytes=1,
        progress=True,
        on_issue=lambda i: None,
    )
    err = capsys.readouterr().err
    assert "building parts" in err and "parts 8/8" in err
    assert f"{got.docs_written:,} docs" in err and f"{got.tokens_written:,} tokens" in err


# ----------------------------------------------------------------------------- staging, limits
_KILLED_BUILD = """
import sys, time
from mmpack.ingest import build_distributed

def never_done(inputs, part_path, options):
    time.sleep(600)

build_distributed(sys.argv[1], sys.argv[2], engine="serial", part_function=never_done)
"""


def test_a_killed_builds_staging_folder_is_removed_by_the_next_build(tmp_path):
    import fcntl
    import signal
    import time

    source = tmp_path / "a.txt"
    source.write_text("one document\n")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, str(source), str(out)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.mmpack-build-*/parts")):
            assert time.monotonic() < deadline and proc.poll() is None, "no staging folder"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (stale,) = tmp_path.glob(".out.mmpack-build-*")
    # kept: a live build of the same output (its lock held), and any other output's folder
    live = tmp_path / f".out.mmpack-build-{os.getpid()}-0123abcd"
    live.mkdir()
    fd = os.open(live / ".mmpack-lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    other = tmp_path / f".out2.mmpack-build-{proc.pid}-0123abcd"
    other.mkdir()
    try:
        report = build_distributed(str(source), out, engine="serial")
    finally:
        os.close(fd)
    assert not stale.exists() and live.is_dir() and other.is_dir()
    assert len(report.store) == 1 and sorted(os.listdir(out)) == sorted(
        ["mmpack-join.json", report.store.meta["offsets"]["file"], "parts"]
    )
    build_distributed(str(source), out, engine="serial", overwrite=True)  # replaceable as built


_MANY_PARTS_BUILD = """
import os, resource, shutil, sys
from pathlib import Path
import mmpack
from mmpack.ingest import build_distributed

root, n = Path(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
(root / "in").mkdir()
for k in range(n):
    (root / "in" / f"{k:05d}.txt").write_text(f"document {k}\\n")
template = mmpack.build(root / "template", [list(b"part")], fsync=False)

def copy_part(inputs, part_path, options):  # one store per task, quickly: a copy
    shutil.copytree(template.path, part_path)
    return {"docs_read": 1, "docs_written": 1, "docs_skipped": 0, "empty_skipped": 0,
            "tokens_written": 4, "issues": [], "issues_total": 0,
            "fingerprint": template.fingerprint, "seconds": 0.0}

report = build_distributed(str(root / "in" / "*.txt"), root / "out", engine="serial",
                           part_bytes=1, part_function=copy_part)
store = mmpack.open(root / "out")
assert len(store) == n and store.read_range(0, store.num_tokens).tobytes() == b"part" * n
print("parts", len(store.parts))
"""


def test_a_build_of_1100_parts_joins_under_1024_open_files(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _MANY_PARTS_BUILD, str(tmp_path), "1100"],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["parts", "1100"]
    assert not list(tmp_path.glob(".out.mmpack-build-*"))
