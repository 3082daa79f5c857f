"""The mmpack command as users run it, for the CLI tests: a subprocess of the real entry point, the
one-line error it prints, and the seed example's documents."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
