"""Opening a joined store: :func:`open_join` (the ``OPENERS["parts"]`` entry) and
:func:`detect_join` (its ``DETECTORS`` entry), and how each part is opened.

Algorithm.  The manifest is read and checked (:mod:`mmpack._src.joins.manifest`), then every part is
opened in order with the options that fit its kind and compared with its record (fingerprint and
counts), and the global offsets are mapped and checked against the parts' sizes.  Options are
the caller's, never the manifest's: ``verify_reads`` reaches every local part (mmpack stores,
other tools' files, nested joins), ``storage_options``/``cache_dir``/``cache_limit`` every remote
part and nested join (``cache_dir`` also the local cache of other tools' files).  With
``verify_reads`` the global offsets' checksums are checked at open.

A join that contains itself (a manifest edited, or written by another tool, that names a join
holding it) is a :class:`FormatError` naming the cycle: the joins being opened in this thread
are tracked (a context variable of their real paths), never recursed into twice.  A part that
cannot be opened for lack of a resource (open files, memory mappings) is an ``OSError`` naming
the part and the limit; a remote part that fails names the part and ``storage_options``.

Cost: one JSON read, one open per part (its metadata; a memory mapping of two files for a local
mmpack part, no file descriptor kept), one pass over the parts' document counts.
"""

from __future__ import annotations

import errno
import os
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.joins.manifest import JOIN_FILE, read_manifest
from mmpack._src.joins.parts import (
    PARTS_CHECK_THEIR_OWN,
    JoinedStore,
    JoinMeta,
    PartsBackend,
    check_global_offsets,
    joined_mask_fingerprint,
)
from mmpack._src.store.backends._memmap import map_readonly
from mmpack._src.store.format import OFFSETS_DTYPE
from mmpack._src.store.opening import as_path, is_mmpack_folder, open_while_unchanged
from mmpack._src.store.reader import TokenStore, open_store
from mmpack.errors import FormatError, StateMismatchError, StoreNotFoundError

__all__ = [
    "PartOptions",
    "detect_join",
    "open_join",
    "part_open_error",
]

_OPENING: ContextVar[tuple[str, ...]] = ContextVar("mmpack_joins_opening", default=())
"""The real paths of the joins this thread is opening, outermost first."""
REMOTE_OPTIONS = ("storage_options", "cache_dir", "cache_limit")


@dataclass(frozen=True)
class PartOptions:
    """The caller's options for opening a join's parts (see the module docstring)."""

    verify_reads: bool = False
    remote: dict[str, Any] = field(default_factory=dict)

    def for_part(self, where: str | os.PathLike[str]) -> dict[str, Any]:
        """The keywords ``open_store`` takes for the part at ``where``."""
        if isinstance(where, str) and "://" in where:
            return dict(self.remote)
        options: dict[str, Any] = {"verify_reads": True} if self.verify_reads else {}
        path = Path(where)
        if is_mmpack_folder(path):
            return options
        if detect_join(path) is not None:
            return {**options, **self.remote}
        if "cache_dir" in self.remote:  # another tool's files keep a local cache too
            options["cache_dir"] = self.remote["cache_dir"]
        return options


def detect_join(path: Path) -> str | None:
    """The ``DETECTORS`` entry: ``"parts"`` for a folder holding ``mmpack-join.json``."""
    return "parts" if (Path(path) / JOIN_FILE).is_file() else None


def open_join(
    location: Any,
    *,
    verify_reads: bool = False,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
) -> JoinedStore:
    """Open the joined store at ``location`` (``mmpack.open(join_folder, ...)``).

    Parameters
    ----------
    location : str or os.PathLike
        The join folder.
    verify_reads : bool
        Every part checks each of its blocks the first time a read touches it (remote parts
        check every block they fetch in any case); the global offsets' checksums are checked
        now.
    storage_options, cache_dir, cache_limit : optional
        Passed to every remote part as ``mmpack.open(url, ...)`` takes them (and ``cache_dir``
        to parts in other tools' formats); never stored in the manifest.

    Raises
    ------
    StoreNotFoundError
        No join there, or a part is missing (the message names it).
    StateMismatchError
        A part's fingerprint differs from the manifest's (it was rebuilt or modified).
    FormatError
        A malformed manifest or offsets file, or a join that contains itself.
    OSError
        A part cannot be opened (the message names it, and the limit when one was reached).
    """
    path = as_path(location, "location")
    given = {"storage_options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit}
    options = PartOptions(bool(verify_reads), {k: v for k, v in given.items() if v is not None})
    real = os.path.realpath(path)
    chain = _OPENING.get()
    if real in chain:
        cycle = " -> ".join((*chain[chain.index(real) :], real))
        raise FormatError(
            f"{os.path.normpath(path)}: the join contains itself ({cycle}): a join cannot be "
            "its own part; join its parts again"
        )
    token = _OPENING.set((*chain, real))
    try:  # an append may swap the manifest and offsets between our two reads
        return open_while_unchanged(
            path, read_manifest, lambda raw: _open_manifest(path, raw, options), recheck=False
        )
    finally:
        _OPENING.reset(token)


def _open_manifest(path: Path, raw: dict[str, Any], options: PartOptions) -> JoinedStore:
    parts = [_open_part(path, k, rec, options) for k, rec in enumerate(raw["parts"])]
    offsets = map_readonly(path / raw["offsets"]["file"], OFFSETS_DTYPE, raw["num_docs"] + 1)
    if options.verify_reads:
        check_global_offsets(path, raw, offsets)
    meta = JoinMeta(
        dtype=np.dtype(raw["dtype"]),
        num_docs=raw["num_docs"],
        num_tokens=raw["num_tokens"],
        fingerprint=raw["fingerprint"],
        loss_mask=_mask_fingerprint(parts, raw["fingerprint"], path),
    )
    backend = PartsBackend(path, meta, parts, offsets)
    doc_starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=doc_starts[1:])
    if not np.array_equal(offsets[doc_starts], backend.token_starts):
        raise FormatError(f"{path}: the global offsets do not match the parts' sizes")
    return JoinedStore(
        path,
        meta,  # type: ignore[arg-type]
        raw,
        backend,
        location=str(path),
        cache_dir=path / "cache",
        open_options=dict(options.remote),
        verify_reads=options.verify_reads,
        read_checker=PARTS_CHECK_THEIR_OWN,
    )


def _mask_fingerprint(parts: list[TokenStore], fingerprint: str, path: Path) -> str | None:
    try:
        return joined_mask_fingerprint(parts, fingerprint, path)
    except ValueError as exc:  # parts that mmpack.join would have refused
        raise FormatError(f"{exc}; the join is damaged") from None


def _open_part(path: Path, k: int, rec: dict[str, Any], options: PartOptions) -> TokenStore:
    where = _resolve_part(path, rec["location"])
    own = {"format": rec["format"], **rec["options"]} if "format" in rec else {}
    try:
        part = open_store(where, **own, **options.for_part(where))
    except StoreNotFoundError:
        raise StoreNotFoundError(
            f"{path}: part {k} ({rec['location']}) is missing; restore it or join the "
            "remaining parts again"
        ) from None
    except OSError as exc:
        what = f"{path}: part {k} ({rec['location']})"
        raise part_open_error(what, exc, remote=isinstance(where, str)) from exc
    if (
        part.fingerprint != rec["fingerprint"]
        or len(part) != rec["num_docs"]
        or (part.num_tokens != rec["num_tokens"])
    ):
        raise StateMismatchError(
            f"{path}: part {k} ({rec['location']}) has fingerprint {part.fingerprint} "
            f"({len(part)} documents, {part.num_tokens} tokens) but was joined with "
            f"{rec['fingerprint']} ({rec['num_docs']} documents, {rec['num_tokens']} tokens): "
            "it changed after the join; run mmpack join again"
        )
    return part


def _resolve_part(folder: Path, location: str) -> str | Path:
    """Where a part recorded as ``location`` lies: a URL as it is, a relative path under the
    join ``folder``."""
    if "://" in location:
        return location
    loc = Path(location)
    return loc if loc.is_absolute() else folder / loc


def part_open_error(what: str, exc: OSError, *, remote: bool) -> OSError:
    """The error to raise when part ``what`` (e.g. ``"J: part 3 (../p3)"``) failed to open with
    ``exc``: the limit named when a resource ran out, ``storage_options`` named for a remote
    part; ``exc`` itself for any other local failure."""
    if exc.errno == errno.EMFILE:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return OSError(
            exc.errno,
            f"{what}: cannot be opened ({exc}): this process may hold {soft} open files "
            "(RLIMIT_NOFILE, ulimit -n); raise that limit or hold fewer files open",
        )
    if exc.errno == errno.ENFILE:
        return OSError(
            exc.errno, f"{what}: cannot be opened ({exc}): the system's open-file table is full"
        )
    if exc.errno == errno.ENOMEM:
        return OSError(
            exc.errno,
            f"{what}: cannot be mapped ({exc}): this process may hold {_max_map_count()} memory "
            "mappings (vm.max_map_count; each local part maps 2 files)",
        )
    if remote and not isinstance(exc, FileNotFoundError):
        try:
            return type(exc)(
                f"{what}: {exc} (the remote parts of a join open with the storage_options "
                "given to mmpack.open, never stored in the manifest)"
            )
        except TypeError:  # an OSError subclass with another constructor
            return exc
    return exc


def _max_map_count() -> str:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return f.read().strip()
    except OSError:
        return "a limited number of"
