"""Opening a store by location: the registry of kinds of store and the dispatch of
:func:`open_store` (``mmpack.open``), plus the one "open while nothing swaps it" loop and the one
"reopen after unpickling" check that every kind of store shares.

:data:`OPENERS` maps a kind (``"url"``, or a ``format=`` name) to ``"module:function"``, imported
on first use; :data:`DETECTORS` are asked, in order, what a local path that holds no mmpack store
is.  A local mmpack folder is opened here: its metadata is read, the files mapped and checked
(O(num_docs) for the offsets, milliseconds whatever the corpus), and the metadata read again: a
rebuild that swapped the folder in between is retried (:func:`open_while_unchanged`, at most 5
tries), so an open never mixes two versions of a store.  :func:`reopen_pickled` reopens a
store from its pickled location and refuses one whose fingerprint changed.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mmpack.errors import FormatError, MmpackError, StateMismatchError, StoreNotFoundError
from mmpack.store.backends._memmap import MemmapBackend
from mmpack.store.backends._zarr import ZarrBackend
from mmpack.store.format import StoreMeta

if TYPE_CHECKING:
    from mmpack.store.reader import TokenStore

__all__ = [
    "DETECTORS",
    "OPENERS",
    "as_path",
    "open_store",
    "open_while_unchanged",
    "read_raw_meta",
    "reopen_pickled",
]

_T = TypeVar("_T")
_TRIES = 5

OPENERS: dict[str, str] = {
    "url": "mmpack.store.remote.opener:open_url",
    "parts": "mmpack.store.parts:open_join",
    "megatron": "mmpack.store.foreign.megatron:open_megatron",
    "eos-separated": "mmpack.store.foreign.eos_separated:open_eos_separated",
}
"""Openers of stores that are not a local mmpack folder, by kind: ``"url"`` for locations with a
scheme (``s3://``, ``gs://``, ``az://``, ``file://``, ``https://``), and one entry per
``format=`` name.  Each value is ``"module:function"``, imported on first use; the function takes
``(location, **options)`` and returns a :class:`TokenStore`.  Adding a kind of store is one line
here plus its module."""

DETECTORS: tuple[str, ...] = (
    "mmpack.store.parts:detect_join",
    "mmpack.store.foreign.megatron:detect_megatron",
    "mmpack.store.foreign.eos_separated:detect_npy",
)
"""``"module:function"`` entries asked, in order, what a local path that holds no mmpack store
is: each returns a ``format=`` name of :data:`OPENERS` or None."""


def open_store(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    verify_reads: bool = False,
    **options: Any,
) -> TokenStore:
    """Open the store at ``path`` read-only.

    Opening checks the structure (metadata, file types and sizes, the offsets, Zarr chunks),
    never the tokens' content: that is :meth:`TokenStore.verify`, or, with ``verify_reads=True``,
    each 16 MiB token block the first time a read touches it (the offsets at open).

    Parameters
    ----------
    path : str or os.PathLike
        A local store folder, or a URL (see :data:`OPENERS`).
    format : str, optional
        ``None`` (default) detects the kind of store; ``"mmpack"`` requires mmpack's own layout;
        other names open stores written by other tools in place (see :data:`OPENERS`).
    verify_reads : bool
        Local mmpack stores: check each token block's checksum the first time a read touches it.
    **options
        Passed to the opener of that kind (e.g. ``storage_options`` for a URL).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``.
    FormatError
        ``path`` is not a store, or its metadata disagrees with its files.
    """
    if verify_reads:
        options["verify_reads"] = True  # every opener decides whether it can
    if isinstance(path, str) and "://" in path:
        return _call_opener("url", path, format=format, **options)
    if format not in (None, "mmpack"):
        return _call_opener(format, path, **options)
    path = as_path(path, "path")
    if format is None and not _is_mmpack_folder(path):
        for entry in DETECTORS:
            kind = _load(entry)(path)
            if kind is not None:
                return _call_opener(kind, path, **options)
    options.pop("verify_reads", None)
    if options:
        raise TypeError(f"unexpected options for a local mmpack store: {sorted(options)}")
    # Absolute now: a later os.chdir must not point the store (its Zarr chunks, its plan cache)
    # at another folder.  Links are kept (not resolved): the path names what the user named.
    path = Path(os.path.abspath(path))
    from mmpack.store.reader import TokenStore  # reader imports this module

    # A rebuild with overwrite=True may swap the folder between reading the metadata and
    # mapping the files: re-read the metadata afterwards and retry if it changed.
    return open_while_unchanged(
        path,
        read_raw_meta,
        lambda raw: TokenStore(
            path, StoreMeta.from_json(raw, path), raw, verify_reads=bool(verify_reads)
        ),
        recheck=True,
    )


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
        except (FormatError, OSError):
            if now() != raw:
                continue
            raise
        if not recheck or now() == raw:
            return store
    raise FormatError(f"{str(path)!r} kept being replaced while it was being opened")


def reopen_pickled(
    location: Any, fingerprint: str, what: str, change: str, /, **options: Any
) -> TokenStore:
    """Reopen a pickled store at ``location`` (``open_store(location, **options)``) and refuse it
    unless its fingerprint is still ``fingerprint``.

    Raises
    ------
    StateMismatchError
        The content changed since pickling; the message reads ``"{what} at {location} {change}
        after this object was pickled (fingerprint <then> then, <now> now)"``.
    """
    current = open_store(location, **options)
    if current.fingerprint != fingerprint:
        raise StateMismatchError(
            f"{what} at {location} {change} after this object was pickled "
            f"(fingerprint {fingerprint} then, {current.fingerprint} now)"
        )
    return current


def _load(entry: str) -> Any:
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def _call_opener(kind: str, location: Any, **options: Any) -> TokenStore:
    entry = OPENERS.get(kind)
    if entry is None:
        if kind == "url":
            raise ValueError(f"{location!r} is a URL; this mmpack opens local stores only")
        names = ", ".join(repr(k) for k in sorted({*OPENERS, "mmpack"} - {"url"}))
        raise ValueError(f"format={kind!r} is not one of {names} (or None to detect it)")
    return _load(entry)(location, **options)


def _is_mmpack_folder(path: Path) -> bool:
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
