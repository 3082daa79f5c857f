"""Task planning for distributed ingestion: the input files, in order, cut into tasks by size.

Owns :func:`plan_tasks` (and the input-size measure the driver's progress bar shares).  The
inputs are expanded exactly as :func:`mmpack.ingest.pipeline.ingest` expands them (paths in the
order given, each glob's matches sorted); the file list is then cut, in order, into tasks of
about ``part_bytes`` of input: small files are grouped, a file is never split.  Cost: one
``stat`` per file (a saved-dataset folder: one per file inside it) and one glob per pattern.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PART_BYTES", "plan_tasks", "size_of"]

DEFAULT_PART_BYTES = 64 << 20
"""Input bytes per task unless ``part_bytes`` says otherwise (64 MiB)."""


def plan_tasks(inputs: Any, *, part_bytes: int = DEFAULT_PART_BYTES) -> list[list[str]]:
    """Cut the input files, in order, into tasks of about ``part_bytes`` bytes each.

    Parameters
    ----------
    inputs : path, glob, or list of paths/globs
        As for :func:`~mmpack.ingest.pipeline.ingest` (in-memory iterables cannot be sent to
        workers: build those with ``ingest``).

    Returns
    -------
    list of list of str
        The files (or saved-dataset folders) of each task, in input order.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TypeError(
            "a distributed build takes a path, a glob or a non-empty list of them, got "
            f"{type(inputs).__name__}; build in-memory inputs with mmpack.ingest.pipeline.ingest"
        )
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"part_bytes must be a positive integer, got {part_bytes!r}")
    files = _expand(inputs)
    tasks: list[list[str]] = []
    size = 0
    for f in files:
        if not tasks or size >= part_bytes:
            tasks.append([])
            size = 0
        tasks[-1].append(os.path.abspath(f))
        size += size_of(Path(f))
    return tasks


def _expand(inputs: list[Any] | tuple[Any, ...]) -> list[str]:
    """The paths in the order given, each glob's matches sorted (files and dataset folders)."""
    files: list[str] = []
    for item in inputs:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"inputs must be paths or globs, got {type(item).__name__}")
        item = os.fspath(item)
        if glob.has_magic(item):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no file matches {item!r}")
            files.extend(m for m in matches if Path(m).is_file() or _is_dataset_dir(Path(m)))
        elif not Path(item).exists():
            raise FileNotFoundError(f"input {item!r} does not exist")
        else:
            files.append(item)
    return files


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder; 0 if it cannot be read."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _is_dataset_dir(path: Path) -> bool:
    return path.is_dir() and any(
        (path / m).is_file() for m in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
