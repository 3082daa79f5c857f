"""Progress bars (``mmpack._src.core.progress``): a total and an ETA for every long operation (local
and distributed builds, ``verify``, ``export``, uploads, copies), the build's total from the
inputs' bytes on disk (compressed sizes, positions in the compressed file), off in library calls
unless asked, on in the command only when stderr is a terminal, and never in captured output.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/core/test_progress.py``
"""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmpack
import mmpack._src.core.progress as progress_module
from mmpack._src.core.progress import Progress, progress_bar
from mmpack._src.ingest.batching import _batches, _InputMeter
from mmpack._src.ingest.inputs import _resolve_inputs
from mmpack._src.ingest.report import IngestReport
from mmpack.cli import main
from mmpack.formats import export_flat, export_megatron
from mmpack.ingest import build_distributed, copy_store, ingest

_ETA = re.compile(r"100%.*<")  # a total (a percentage) and an estimated time left


def _lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{int(x)}" for x in rng.integers(0, 500, size=30)) for _ in range(n)]


@pytest.fixture
def as_terminal(monkeypatch):
    """stderr taken for a terminal (what ``progress=None`` asks about)."""
    monkeypatch.setattr(progress_module, "stderr_is_tty", lambda: True)


# ----------------------------------------------------------------------------- the bar
def test_progress_argument(capsys, monkeypatch):
    with progress_bar(False, 10, desc="off") as bar:
        bar.update(10)
        assert not bar.enabled
    assert capsys.readouterr().err == ""
    with progress_bar(None, 10, desc="auto") as bar:  # stderr is captured: not a terminal
        bar.update(10)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress_module, "stderr_is_tty", lambda: True)
    with progress_bar(None, 2048, desc="shown") as bar:
        bar.update(1024)
        bar.advance_to(2048)
        bar.advance_to(5)  # never backwards
        bar.note("3 docs")
        assert bar.n == 2048
    err = capsys.readouterr().err
    assert "shown" in err and _ETA.search(err) and "2.00k/2.00k" in err and "3 docs" in err
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        progress_bar("yes", 1, desc="x")


def test_a_shared_bar_is_advanced_and_left_open(capsys):
    with progress_bar(True, 30, desc="outer") as outer:
        for _ in range(3):
            with progress_bar(outer, None, desc="inner") as inner:
                inner.update(10)
        assert outer.n == 30 and outer.enabled
        outer.update(0)
    err = capsys.readouterr().err
    assert "outer" in err and "inner" not in err and "100%" in err
    assert isinstance(progress_bar(outer, 1, desc="x"), Progress)


# ----------------------------------------------------------------------------- the build's total
def _meter_positions(sources):
    report = IngestReport(path=None, tokenizer="byte", workers=1)
    meter = _InputMeter(sources)
    return meter, [b.read_to for b in _batches(sources, report, False, 256, 1 << 20, meter)]


def test_the_total_is_the_inputs_bytes_on_disk(tmp_path):
    text = "\n".join(_lines(12_000)) + "\n"  # a compressed file larger than a read-ahead
    (tmp_path / "a.txt").write_text(text)
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write(text)
    import zstandard as zstd

    (tmp_path / "c.txt.zst").write_bytes(zstd.ZstdCompressor().compress(text.encode()))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _lines(900)))
    pq.write_table(pa.table({"text": _lines(3000)}), tmp_path / "e.parquet", row_group_size=500)
    names = ["a.txt", "b.txt.gz", "c.txt.zst", "d.jsonl", "e.parquet"]
    sizes = [(tmp_path / n).stat().st_size for n in names]
    assert sizes[1] < sizes[0] / 2 and sizes[2] < sizes[0] / 2  # compressed sizes, not text's
    sources = _resolve_inputs([tmp_path / n for n in names], field="text", lines=True, fmt=None)
    meter, positions = _meter_positions(sources)
    assert meter.unit == "B" and meter.total == sum(sizes)
    assert positions == sorted(positions) and positions[-1] == meter.total
    bounds = np.cumsum([0, *sizes])
    for k in range(len(names)):  # every file is seen part-way, not only at its end
        inside = [p for p in positions if bounds[k] < p < bounds[k + 1]]
        assert inside, names[k]


def test_in_memory_inputs_count_documents(tmp_path):
    class Rows:  # a datasets-like object of known length
        def __len__(self):
            return 30

        def iter(self, batch_size):
            yield {"text": _lines(30)}

    meter, positions = _meter_positions(
        _resolve_inputs(Rows(), field="text", lines=False, fmt=None)
    )
    assert (meter.unit, meter.total) == (" docs", 30) and positions[-1] == 30
    gen = _resolve_inputs(iter(_lines(20)), field="text", lines=False, fmt=None)
    meter, positions = _meter_positions(gen)
    assert (meter.unit, meter.total) == (" docs", None) and positions[-1] == 20


def test_a_build_shows_bytes_with_a_total_and_an_eta(tmp_path, capsys):
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write("\n".join(_lines(3000)))
    report = ingest(tmp_path / "a.txt.gz", tmp_path / "s", lines=True, progress=True)
    err = capsys.readouterr().err
    assert "building" in err and _ETA.search(err) and "B/s" in err
    assert f"{report.docs_written:,} docs" in err and "tokens/s" in err
    ingest(iter(_lines(10)), tmp_path / "t", progress=True)  # a generator: no total
    err = capsys.readouterr().err
    assert "building" in err and "%" not in err and "docs/s" in err


def test_library_calls_are_quiet_by_default_even_on_a_terminal(tmp_path, capsys, as_terminal):
    (tmp_path / "a.txt").write_text("abc")
    store = ingest(tmp_path / "a.txt", tmp_path / "s").store
    store.verify()
    export_megatron(store, tmp_path / "meg")
    copy_store(store.location, tmp_path / "c")
    build_distributed(tmp_path / "a.txt", tmp_path / "d", engine="serial")
    assert capsys.readouterr().err == ""


def test_distributed_build_progress(tmp_path, capsys):
    for k in range(3):
        (tmp_path / f"{k}.txt").write_text("\n".join(_lines(50, k)))
    build_distributed(
        str(tmp_path / "*.txt"), tmp_path / "d", engine="serial", part_bytes=1, progress=True
    )
    err = capsys.readouterr().err
    assert "building parts" in err and _ETA.search(err) and "parts 3/3" in err


# ----------------------------------------------------------------------------- store operations
def _store(tmp_path, backend="memmap"):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 60_000, size=int(n)) for n in rng.integers(0, 4000, size=300)]
    return mmpack.build(tmp_path / f"s-{backend}", docs, backend=backend)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_verify_shows_the_stores_bytes(tmp_path, capsys, backend):
    store = _store(tmp_path, backend)
    res = store.verify(progress=True)
    err = capsys.readouterr().err
    assert res["bytes"] == store.nbytes and "verifying" in err and _ETA.search(err)


def test_a_join_verifies_with_one_bar(tmp_path, capsys):
    a = _store(tmp_path, "memmap")
    b = _store(tmp_path, "zarr")
    joined = mmpack.join([a.location, b.location], tmp_path / "j")
    joined.verify(progress=True)
    err = capsys.readouterr().err
    assert err.count("verifying") >= 1 and _ETA.search(err)
    totals = set(re.findall(r"\|\s*[\d.]+[kMGT]?/([\d.]+[kMGT]?) \[", err))
    assert len(totals) == 1, err  # one bar over the parts and the join's offsets


def test_export_and_other_tools_files(tmp_path, capsys):
    store = _store(tmp_path)
    export_megatron(store, tmp_path / "meg", progress=True)
    export_flat(store, tmp_path / "flat.npy", eos=65535, progress=True)
    err = capsys.readouterr().err
    assert err.count("exporting") >= 2 and _ETA.search(err)
    mmpack.open(tmp_path / "meg").verify(progress=True)
    assert _ETA.search(capsys.readouterr().err)


def test_copy_and_upload_bars(tmp_path, capsys):
    store = _store(tmp_path)
    copy_store(store.location, (tmp_path / "remote").as_uri(), progress=True)
    err = capsys.readouterr().err
    for step in ("copying", "uploading", "verifying"):
        assert step in err
    assert len(_ETA.findall(err)) >= 3


# ----------------------------------------------------------------------------- the command
@pytest.fixture
def text_file(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(_lines(200)))
    return tmp_path / "a.txt"


def _commands(tmp_path, text_file, flag):
    store = str(tmp_path / "s")
    return [
        ["build", str(text_file), "-o", store, "--lines", *flag],
        ["verify", store, *flag],
        ["export", store, "--to", "megatron", "-o", str(tmp_path / "m"), *flag],
        ["cp", store, str(tmp_path / "c"), *flag],
        ["build", str(text_file), "-o", str(tmp_path / "d"), "--engine", "serial", *flag],
    ]


def test_the_command_is_quiet_when_stderr_is_not_a_terminal(tmp_path, text_file, capsys):
    for argv in _commands(tmp_path, text_file, []):
        assert main(argv) == 0, argv
        assert capsys.readouterr().err == "", argv


def test_the_command_shows_bars_on_a_terminal(tmp_path, text_file, capsys, as_terminal):
    for argv in _commands(tmp_path, text_file, []):
        assert main(argv) == 0, argv
        assert _ETA.search(capsys.readouterr().err), argv


def test_no_progress_silences_a_terminal(tmp_path, text_file, capsys, as_terminal):
    for argv in _commands(tmp_path, text_file, ["--no-progress"]):
        assert main(argv) == 0, argv
        assert capsys.readouterr().err == "", argv


def test_progress_asks_for_bars_anywhere(tmp_path, text_file, capsys):
    for argv in _commands(tmp_path, text_file, ["--progress"]):
        assert main(argv) == 0, argv
        assert _ETA.search(capsys.readouterr().err), argv
