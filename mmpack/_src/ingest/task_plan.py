"""Task planning for distributed ingestion: the input files, in order, cut into tasks by size.

Owns :func:`plan_tasks` (inputs are measured by :func:`mmpack._src.ingest.inputs.size_of`).  The
inputs are expanded exactly as :func:`mmpack.ingest.ingest` expands them (paths in the
order given, each glob's matches sorted); the file list is then cut, in order, into tasks of
about ``part_bytes`` of input: small files are grouped, a file is never split.  Cost: one
``stat`` per file (a saved-dataset folder: one per file inside it) and one glob per pattern.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmpack._src.ingest.inputs import _paths_of, size_of

__all__ = ["DEFAULT_PART_BYTES", "plan_tasks"]

DEFAULT_PART_BYTES = 64 << 20
"""Input bytes per task unless ``part_bytes`` says otherwise (64 MiB)."""


def plan_tasks(
    inputs: Any, *, part_bytes: int = DEFAULT_PART_BYTES, output: Any = None
) -> list[list[str]]:
    """Cut the input files, in order, into tasks of about ``part_bytes`` bytes each.

    Parameters
    ----------
    inputs : path, glob, or list of paths/globs
        As for :func:`~mmpack.ingest.ingest` (in-memory iterables cannot be sent to
        workers: build those with ``ingest``).
    part_bytes : int
        Input bytes per task.
    output : path, optional
        The store being built: a glob's matches inside it (or in its builds' temporary
        folders) are left out, and a path named inside it is refused, as ``ingest`` does.

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
            f"{type(inputs).__name__}; build in-memory inputs with mmpack.ingest.ingest"
        )
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"part_bytes must be a positive integer, got {part_bytes!r}")
    files = _expand(inputs, None if output is None else Path(output))
    tasks: list[list[str]] = []
    size = 0
    for f in files:
        if not tasks or size >= part_bytes:
            tasks.append([])
            size = 0
        tasks[-1].append(os.path.abspath(f))
        size += size_of(Path(f))
    return tasks


def _expand(inputs: list[Any] | tuple[Any, ...], output: Path | None) -> list[str]:
    """The paths in the order given, each glob's matches sorted (files and dataset folders),
    nothing of ``output`` among them (:func:`mmpack._src.ingest.inputs._paths_of`)."""
    files: list[str] = []
    for item in inputs:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"inputs must be paths or globs, got {type(item).__name__}")
        files.extend(str(p) for p in _paths_of(os.fspath(item), output))
    return files
