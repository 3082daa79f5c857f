"""The kinds of store the core does not know itself, registered by the adapters beside it.

The store core reads and writes mmpack's local layout only.  Object storage
(:mod:`mmpack._src.remote`), other tools' formats (:mod:`mmpack.formats`) and joined stores
(:mod:`mmpack._src.joins`) register here when their package is imported (``import mmpack`` imports
the three package ``__init__`` files, which import nothing heavy), so the core never imports an
adapter and an adapter is added without editing the core.

Entries are ``"module:attribute"`` strings, imported on first use: registering costs nothing,
and ``import mmpack`` never pays for an adapter a program does not use.

::

    OPENERS    kind -> opener(location, **options) -> TokenStore     "url", "parts", format names
    DETECTORS  detector(path) -> kind or None, asked in order for a local path with no mmpack store
    WRITERS    kind -> writer class (path, **options)                "url"
    OWNERS     owner(path) -> set of entry names or None: the files a store kind holds of its own
               (what ``overwrite`` may replace besides the core layouts' files)
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DETECTORS",
    "OPENERS",
    "OWNERS",
    "WRITERS",
    "load",
    "register_detector",
    "register_opener",
    "register_owner",
    "register_writer",
]

OPENERS: dict[str, str] = {}
"""Openers of stores that are not a local mmpack folder, by kind: ``"url"`` for locations with a
scheme (``s3://``, ``gs://``, ``az://``, ``file://``, ``https://``), and one entry per ``format=``
name.  The function takes ``(location, **options)`` and returns a ``TokenStore``."""

DETECTORS: list[str] = []
"""Asked, in registration order, what a local path that holds no mmpack store is: each returns a
``format=`` name of :data:`OPENERS` or None."""

WRITERS: dict[str, str] = {}
"""Writer classes of targets that are not a local folder, by kind (``"url"``); each takes the
arguments of :class:`mmpack.store.StoreWriter`."""

OWNERS: list[str] = []
"""Asked, in order, which entries of a folder a store kind holds of its own; each returns a set
of names, or None when the folder is not a store of its kind."""


def _check_entry(entry: str) -> None:
    module, sep, name = entry.partition(":")
    if not (sep and module.startswith("mmpack.") and name.isidentifier()):
        raise ValueError(f"registry entries are 'mmpack.module:attribute', got {entry!r}")


def register_opener(kind: str, entry: str) -> None:
    """Open locations of ``kind`` with ``entry`` (``"module:function"``)."""
    _check_entry(entry)
    OPENERS[kind] = entry


def register_detector(entry: str) -> None:
    """Ask ``entry`` (``"module:function"``) what a local path with no mmpack store is."""
    _check_entry(entry)
    if entry not in DETECTORS:
        DETECTORS.append(entry)


def register_writer(kind: str, entry: str) -> None:
    """Write targets of ``kind`` with ``entry`` (``"module:Class"``)."""
    _check_entry(entry)
    WRITERS[kind] = entry


def register_owner(entry: str) -> None:
    """Ask ``entry`` (``"module:function"``) which entries of a folder its kind of store owns."""
    _check_entry(entry)
    if entry not in OWNERS:
        OWNERS.append(entry)


def load(entry: str) -> Any:
    """The object an entry names, importing its module."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)
