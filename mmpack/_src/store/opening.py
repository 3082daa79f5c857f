"""The steps every kind of store shares when it is opened: the dispatch to the opener an
adapter registered (:func:`call_opener`, :data:`mmpack._src.store.registry.OPENERS`), the one "open
while nothing swaps it" loop (:func:`open_while_unchanged`) and reading a local store's metadata.

A writer may swap a folder (a rebuild with ``overwrite=True``, an append to a join) between
reading its record and mapping its files; :func:`open_while_unchanged` reads the record again
after the open and retries (at most 5 tries), so an open never mixes two versions of a store.
:func:`mmpack.open` (``mmpack.open``) is built from these steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mmpack._src.store.backends._memmap import MemmapBackend
from mmpack._src.store.backends._zarr import ZarrBackend
from mmpack._src.store.registry import OPENERS, load
from mmpack.errors import FormatError, MmpackError, StateMismatchError, StoreNotFoundError

__all__ = [
    "as_path",
    "call_opener",
    "is_mmpack_folder",
    "open_while_unchanged",
    "read_raw_meta",
]

_T = TypeVar("_T")
_TRIES = 5


def open_while_unchanged(
    path: Path,
    read: Callable[[Path], Any],
    open_one: Callable[[Any], _T],
    *,
    recheck: bool,
) -> _T:
    """``open_one(read(path))``, retried while ``path`` is being replaced.

    A writer may swap the folder (a rebuild with ``overwrite=True``, an append to a join) between
    reading its record and mapping its files.  A failure of ``open_one`` is raised only if the
    record still reads the same afterwards; otherwise the open is tried again (at most 5 times).
    With ``recheck``, a successful open is also returned only if the record still reads the same.

    Parameters
    ----------
    path : Path
        The folder opened.
    read : callable
        ``read(path)`` returns the record (metadata, manifest) or raises ``MmpackError`` /
        ``OSError``; records are compared with ``==``.
    open_one : callable
        Opens the store from a record.
    recheck : bool
        Read the record again after a successful open (two reads per open instead of one).

    Raises
    ------
    FormatError
        ``path`` kept being replaced for 5 tries.
    """

    def now() -> Any:
        try:
            return read(path)
        except (MmpackError, OSError):
            return None

    for _ in range(_TRIES):
        raw = read(path)
        try:
            store = open_one(raw)
        except (FormatError, StateMismatchError, OSError):  # (a Zarr store's first read)
            if now() != raw:
                continue
            raise
        if not recheck or now() == raw:
            return store
    raise FormatError(f"{str(path)!r} kept being replaced while it was being opened")


def call_opener(kind: str, location: Any, **options: Any) -> Any:
    """The store the opener registered for ``kind`` opens at ``location`` (a ``TokenStore``)."""
    entry = OPENERS.get(kind)
    if entry is None:
        if kind == "url":
            raise ValueError(f"{location!r} is a URL; this mmpack opens local stores only")
        names = ", ".join(repr(k) for k in sorted({*OPENERS, "mmpack"} - {"url"}))
        raise ValueError(f"format={kind!r} is not one of {names} (or None to detect it)")
    return load(entry)(location, **options)


def is_mmpack_folder(path: Path) -> bool:
    # A missing path still goes to the detectors: a Megatron prefix is not itself a file.
    return (path / "mmpack.json").exists() or (path / "zarr.json").exists()


def read_raw_meta(path: Path) -> Any:
    """The metadata record of the local mmpack store at ``path`` (its ``mmpack.json`` or Zarr
    attributes), as stored; :class:`StoreNotFoundError` / :class:`FormatError` /
    ``PermissionError`` naming the path otherwise."""
    if not path.exists():
        raise StoreNotFoundError(f"no mmpack store at {str(path)!r}: the path does not exist")
    if not path.is_dir():
        raise FormatError(f"{str(path)!r} is a file; an mmpack store is a folder")
    try:
        raw = MemmapBackend.read_meta(path)
        if raw is None:
            raw = ZarrBackend.read_meta(path)
    except PermissionError as exc:
        raise PermissionError(f"cannot read the store at {str(path)!r}: {exc}") from None
    if raw is None:
        raise FormatError(
            f"{str(path)!r} is not an mmpack store: it has neither mmpack.json nor a Zarr group "
            "with mmpack attributes (an interrupted build leaves no store; rebuild it)"
        )
    return raw


def as_path(path: Any, name: str) -> Path:
    """``path`` as a :class:`~pathlib.Path`; :class:`TypeError` naming argument ``name`` unless
    it is a ``str`` or ``os.PathLike``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)
