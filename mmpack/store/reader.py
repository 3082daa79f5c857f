"""The token store: every document's tokens in one flat array, plus a cumulative-length index.

A store is opened read-only by memory mapping (:mod:`mmpack.store.backends`): opening reads only the
metadata and checks it against the files (sizes, ``offsets`` starting at 0, never decreasing,
ending at ``num_tokens``), so it costs milliseconds whatever the corpus; ``verify()`` recomputes
the block checksums.  Stores are written by :mod:`mmpack.store.writer`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.store.backends import Backend, get_backend
from mmpack.store.backends._memmap import MemmapBackend
from mmpack.store.backends._zarr import ZarrBackend
from mmpack.errors import FormatError, MmpackError, StateMismatchError, StoreNotFoundError
from mmpack.store.format import StoreMeta
from mmpack.core.validation import check_index

__all__ = ["TokenStore", "open_store"]



class TokenStore:
    """A read-only, memory-mapped token store.  Create with :func:`build`, open with
    :func:`open_store` (``mmpack.open``).

    ``len(store)`` is the number of documents, ``store[j]`` document ``j`` as a 1-D array of
    ``store.dtype`` (a view of the mapping for the memmap backend).  Pickling keeps only the path
    and the metadata; the receiving process maps the files again and refuses a store that was
    rebuilt in between.
    """

    def __init__(
        self,
        path: Path,
        meta: StoreMeta,
        raw_meta: dict[str, Any],
        backend: Backend | None = None,
        *,
        location: str | None = None,
        cache_dir: Path | None = None,
        open_options: dict[str, Any] | None = None,
    ) -> None:
        self._path = path
        self._meta = meta
        self._raw_meta = raw_meta
        self._backend: Backend = backend if backend is not None else get_backend(meta.backend)(path, meta)
        self._location = location if location is not None else str(path)
        self._cache_dir = cache_dir
        self._open_options = dict(open_options or {})
        self._doc_lens: np.ndarray | None = None
        _check_offsets(self._backend.offsets, meta, path)

    # ----------------------------------------------------------------------------- properties
    @property
    def path(self) -> Path:
        return self._path

    @property
    def location(self) -> str:
        """Where the store was opened from: its local path, or its URL for a remote store."""
        return self._location

    @property
    def cache_dir(self) -> Path:
        """The local folder for indexes derived from this store (packing plans): ``<store>/cache``
        for a local store; stores that are remote or not mmpack's own (whose folder is not
        ours to write) name another local folder, keyed by their fingerprint."""
        return self._cache_dir if self._cache_dir is not None else self._path / "cache"

    @property
    def backend(self) -> str:
        """``"memmap"`` or ``"zarr"``."""
        return self._meta.backend

    @property
    def dtype(self) -> np.dtype:
        return self._meta.dtype

    @property
    def num_tokens(self) -> int:
        return self._meta.num_tokens

    @property
    def offsets(self) -> np.ndarray:
        """int64, shape (num_docs + 1,), read-only: document j is ``tokens[offsets[j]:offsets[j+1]]``."""
        return self._backend.offsets

    @property
    def doc_lens(self) -> np.ndarray:
        """int64, shape (num_docs,): ``np.diff(offsets)``, computed once."""
        if self._doc_lens is None:
            lens = np.diff(self.offsets)
            lens.flags.writeable = False
            self._doc_lens = lens
        return self._doc_lens

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the content (see :mod:`mmpack.store.format`)."""
        return self._meta.fingerprint

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata record as stored."""
        return dict(self._raw_meta)

    @property
    def tokens(self) -> np.ndarray | None:
        """The whole flat token array as a read-only mapping (memmap backend), else None."""
        return getattr(self._backend, "tokens", None)

    # ----------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return self._meta.num_docs

    def __getitem__(self, j: int) -> np.ndarray:
        j = check_index(j, self._meta.num_docs, "document")
        lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
        return self._backend.read_range(lo, hi)

    def __iter__(self) -> Iterator[np.ndarray]:
        for j in range(len(self)):
            yield self[j]

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Flat tokens ``[start, stop)``; bounds are checked."""
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                   for v in (start, stop)):
            raise TypeError(f"start and stop must be integers, got {start!r} and {stop!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(
                f"token range [{start}, {stop}) is outside [0, {self.num_tokens}]"
            )
        return self._backend.read_range(start, stop)

    def read_ranges(
        self, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Read many flat ranges; ``src[src_starts[k]:src_starts[k]+lengths[k]]`` is range k.

        Parameters
        ----------
        starts, lengths : numpy.ndarray, int64, shape (k,)
            Validated by the caller: ``0 <= starts``, ``starts + lengths <= num_tokens``.

        Returns
        -------
        src : numpy.ndarray, ``store.dtype``, 1-D
            The whole mapped array for the memmap backend (zero copy), a buffer otherwise.
        src_starts : numpy.ndarray, int64, shape (k,)
        """
        return self._backend.read_ranges(starts, lengths)

    # ----------------------------------------------------------------------------- integrity
    def verify(self) -> dict[str, int]:
        """Recompute every block checksum; raise :class:`FormatError` naming the first bad block.

        Returns a summary ``{"blocks": ..., "bytes": ...}`` when everything matches.
        """
        meta = self._meta
        _check_offsets(self.offsets, meta, self._path)
        checked_blocks = checked_bytes = 0
        for name, nbytes, crcs in (
            ("offsets", (meta.num_docs + 1) * 8, meta.offsets_crc32),
            ("tokens", meta.num_tokens * meta.dtype.itemsize, meta.tokens_crc32),
        ):
            for b, stored in enumerate(crcs):
                lo = b * meta.block_bytes
                hi = min(nbytes, lo + meta.block_bytes)
                got = zlib.crc32(self._backend.raw_bytes(name, lo, hi))
                if got != stored:
                    raise FormatError(
                        f"{self._path}: {name} block {b} (bytes {lo}..{hi}) fails its checksum "
                        f"(stored {stored:#010x}, computed {got:#010x}): the data was modified "
                        "or corrupted; rebuild the store"
                    )
                checked_blocks += 1
                checked_bytes += hi - lo
        return {"blocks": checked_blocks, "bytes": checked_bytes}

    # ----------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        return {"location": self._location, "meta": self._raw_meta, "options": self._open_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        location = state.get("location", state.get("path"))
        path = Path(location) if "://" not in str(location) else Path(".")
        pickled = StoreMeta.from_json(state["meta"], path)
        current = open_store(location, **state.get("options", {}))
        if current.fingerprint != pickled.fingerprint:
            raise StateMismatchError(
                f"the store at {location} was rebuilt after this object was pickled "
                f"(fingerprint {pickled.fingerprint} then, {current.fingerprint} now)"
            )
        self.__dict__.update(current.__dict__)

    def __repr__(self) -> str:
        return (
            f"TokenStore({str(self._path)!r}, backend={self.backend!r}, docs={len(self)}, "
            f"tokens={self.num_tokens}, dtype={self.dtype.name})"
        )


# --------------------------------------------------------------------------------- opening
OPENERS: dict[str, str] = {
    "parts": "mmpack.store.parts:open_join",
}
"""Openers of stores that are not a local mmpack folder, by kind: ``"url"`` for locations with a
scheme (``s3://``, ``gs://``, ``az://``, ``file://``, ``https://``), and one entry per
``format=`` name.  Each value is ``"module:function"``, imported on first use; the function takes
``(location, **options)`` and returns a :class:`TokenStore`.  Adding a kind of store is one line
here plus its module."""

DETECTORS: tuple[str, ...] = (
    "mmpack.store.parts:detect_join",
)
"""``"module:function"`` entries asked, in order, what a local path that holds no mmpack store
is: each returns a ``format=`` name of :data:`OPENERS` or None."""


def open_store(
    path: str | os.PathLike[str], *, format: str | None = None, **options: Any
) -> TokenStore:
    """Open the store at ``path`` read-only.

    Parameters
    ----------
    path : str or os.PathLike
        A local store folder, or a URL (see :data:`OPENERS`).
    format : str, optional
        ``None`` (default) detects the kind of store; ``"mmpack"`` requires mmpack's own layout;
        other names open stores written by other tools in place (see :data:`OPENERS`).
    **options
        Passed to the opener of that kind (e.g. ``storage_options`` for a URL).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``.
    FormatError
        ``path`` is not a store, or its metadata disagrees with its files.
    """
    if isinstance(path, str) and "://" in path:
        return _call_opener("url", path, format=format, **options)
    if format not in (None, "mmpack"):
        return _call_opener(format, path, **options)
    path = _as_path(path, "path")
    if format is None and not _is_mmpack_folder(path):
        for entry in DETECTORS:
            kind = _load(entry)(path)
            if kind is not None:
                return _call_opener(kind, path, **options)
    if options:
        raise TypeError(f"unexpected options for a local mmpack store: {sorted(options)}")
    # A rebuild with overwrite=True may swap the folder between reading the metadata and
    # mapping the files: re-read the metadata afterwards and retry if it changed.
    for _ in range(5):
        raw = _read_raw_meta(path)
        meta = StoreMeta.from_json(raw, path)
        try:
            store = TokenStore(path, meta, raw)
        except (FormatError, OSError):
            if _raw_meta_now(path) != raw:
                continue
            raise
        if _raw_meta_now(path) == raw:
            return store
    raise FormatError(f"{str(path)!r} kept being replaced while it was being opened")


def _load(entry: str) -> Any:
    import importlib

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
    return (path / "mmpack.json").exists() or (path / "zarr.json").exists() or not path.exists()


def _read_raw_meta(path: Path) -> Any:
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


def _raw_meta_now(path: Path) -> Any:
    try:
        return _read_raw_meta(path)
    except (MmpackError, OSError):
        return None


_NUMPY_CHECK_DOCS = 1 << 22


def _first_decrease(offsets: np.ndarray) -> int:
    """Index of the first decrease in ``offsets`` or -1.  Small indexes are checked with numpy
    (opening a store for ``mmpack info`` then never loads numba, ~0.5 s); large ones with the
    kernel (one pass, no temporaries)."""
    if offsets.shape[0] <= _NUMPY_CHECK_DOCS:
        bad = np.flatnonzero(offsets[1:] < offsets[:-1])
        return int(bad[0]) if bad.size else -1
    from mmpack.kernels.store import first_decrease

    return int(first_decrease(offsets))


def _check_offsets(offsets: np.ndarray, meta: StoreMeta, path: Path) -> None:
    if offsets.shape != (meta.num_docs + 1,):
        raise FormatError(f"{path}: offsets has shape {offsets.shape}, expected ({meta.num_docs + 1},)")
    if offsets[0] != 0:
        raise FormatError(f"{path}: offsets[0] is {int(offsets[0])}, expected 0")
    if offsets[-1] != meta.num_tokens:
        raise FormatError(
            f"{path}: offsets end at {int(offsets[-1])} but the store holds "
            f"{meta.num_tokens} tokens"
        )
    bad = _first_decrease(offsets)
    if bad >= 0:
        raise FormatError(
            f"{path}: offsets decrease at document {bad} "
            f"({int(offsets[bad])} -> {int(offsets[bad + 1])}): the index is corrupt"
        )




def _as_path(path: Any, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)
