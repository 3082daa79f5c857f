"""The tree speaks of itself only: no file of the package, its docs, benchmarks, tests or build
files names an absolute path of a machine (a home folder, a checkout, an interpreter install).
Paths a test makes live under pytest's ``tmp_path``; the docs use relative paths."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TOPS = "home|root|Users|work|opt|srv|mnt"
_INSTALLS = ("py" + "env", "site-" + "packages")  # joined here so this file does not match
MACHINE_PATH = re.compile(rf"(?<![\w.])/(?:{_TOPS})/[\w.]|\.{_INSTALLS[0]}/|{_INSTALLS[1]}/")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p]


def test_no_file_names_a_path_of_a_machine():
    hits = []
    for path in _tracked():
        if path.suffix not in {
            ".py",
            ".md",
            ".toml",
            ".txt",
            ".yml",
            ".yaml",
            ".cfg",
            ".ipynb",
            ".json",
            "",
        }:
            continue
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "paths of a machine:\n" + "\n".join(hits)


def test_the_pattern_sees_machine_paths():
    # built from parts, so that this file names no path itself
    homes = [("home", "me", "x"), ("root", ".cache"), ("work", "checkout", "m")]
    for bad in ["see " + "/".join(("", *parts)) for parts in homes] + [".py" + "env/versions/3.11"]:
        assert MACHINE_PATH.search(bad), bad
    for fine in ("docs/guide/views.md", "s3://bucket" + "/wor" + "k/x", "mmpack._src.store/opt"):
        assert not MACHINE_PATH.search(fine), fine
