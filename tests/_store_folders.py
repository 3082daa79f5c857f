"""The store backends and a folder's listing, for the tests of building and publishing a store."""

from __future__ import annotations

from pathlib import Path

BACKENDS = ["memmap", "zarr"]


def listing(folder: Path) -> list[str]:
    """The sorted names of the entries of ``folder``."""
    return sorted(p.name for p in folder.iterdir())
