"""Writing joined stores: :func:`join` (``mmpack.join``, ``mmpack join PART... -o OUT``).

The layout, the cost and the publishing protocol are described in :mod:`mmpack._src.joins.parts`:
``join`` reads only the parts' metadata and offsets, writes the global offsets (8 bytes per
document) under a fresh name and then the manifest, atomically (a new join: temporary folder
renamed into place; an append or overwrite: ``os.replace`` of the manifest under a lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.joins.manifest import (
    JOIN_FILE,
    JOIN_FORMAT,
    JOIN_LOCK_FILE,
    JOIN_VERSION,
    MANIFEST_KEYS,
    common_tokenizer,
    holds_tokenizer_copy,
    manifest_fingerprint,
    part_record,
    read_manifest,
)
from mmpack._src.joins.opening import PartOptions, open_join, part_open_error
from mmpack._src.joins.parts import JoinedStore, joined_mask_fingerprint
from mmpack._src.store.format import (
    OFFSETS_DTYPE,
    STRIPE_BYTES,
    StripeChecksum,
    atomic_file,
    write_json_atomic,
)
from mmpack._src.store.opening import as_path
from mmpack._src.store.reader import TokenStore, open_store
from mmpack._src.store.vocab import check_same_tokenizer
from mmpack.errors import Param, StoreExistsError, StoreNotFoundError, with_params

__all__ = ["join", "write_join_into"]

_TMP_TAG = ".mmpack-join-tmp-"
_COPY_DOCS = 1 << 20


# --------------------------------------------------------------------------------- joining
def join(
    parts: Sequence[str | os.PathLike[str] | TokenStore],
    out: str | os.PathLike[str],
    *,
    append: bool = False,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
    mixed_tokenizers: bool = False,
    fsync: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> JoinedStore:
    """Join ``parts`` (complete stores, in order) into the store ``out`` without copying tokens.

    Parameters
    ----------
    parts : sequence of paths, URLs or TokenStores
        The parts in order; each may be any store ``mmpack.open`` reads (a join too).  Local
        parts are recorded relative to ``out``, so moving ``out`` together with its parts keeps
        it valid.
    out : str or os.PathLike
        The join folder.  It must not exist, unless it is a join and ``append`` or
        ``overwrite`` is given.
    append : bool
        Add ``parts`` after the parts of the existing join ``out`` (whose parts must still match
        their fingerprints); publishes a new manifest atomically.
    overwrite : bool
        Replace the manifest of the existing join ``out`` by one of ``parts`` only (the part
        stores themselves are never deleted).
    extra : dict, optional
        Extra JSON-serialisable sections kept in the manifest (e.g. ``"provenance"``); not part
        of the fingerprint.  By default the sections of the existing join are kept.
    mixed_tokenizers : bool
        Allow parts whose recorded tokenizers differ (refused by default: their ids mean
        different things).  When every part records the same tokenizer, the join records it
        too (and holds a copy of its ``tokenizer.json``).
    storage_options : dict, optional
        Opens the parts given as URLs and the join's remote parts (never stored in the manifest;
        ``mmpack.open(out, storage_options=...)`` reopens them).  Default: the options the remote
        parts given as stores were opened with (they must agree).

    Returns
    -------
    JoinedStore
        The join, opened.  Its dtype is the widest of the parts'.

    Raises
    ------
    StoreExistsError
        ``out`` exists and is not a join, or is one and neither ``append`` nor ``overwrite``.
    StoreNotFoundError, StateMismatchError
        A part (or a part of the existing join when appending) is missing or changed.
    ValueError
        No parts, ``out`` among them or inside one of them (a join cannot contain itself), or
        remote parts opened with different ``storage_options``.  Nothing is written then.
    OSError
        A part cannot be opened (the message names it, and the limit when one was reached).
    """
    out = as_path(out, "out")
    if isinstance(parts, (str, bytes, os.PathLike)) or not isinstance(parts, Sequence):
        raise TypeError(f"parts must be a list of stores or paths, got {type(parts).__name__}")
    if append and overwrite:
        raise with_params(
            ValueError,
            "pass ",
            Param("append", True),
            " or ",
            Param("overwrite", True),
            ", not both",
        )
    if not parts and not append:
        raise ValueError("parts is empty: a join needs at least one part")
    _check_extra(extra)
    out_abs = Path(os.path.abspath(out))
    new = _open_parts(parts, refuse=out, storage_options=storage_options)
    _refuse_cycles(new, out)
    remote = _remote_options(new, storage_options)
    exists = out.exists() or out.is_symlink()
    if exists and not (out / JOIN_FILE).is_file():
        raise StoreExistsError(f"{str(out)!r} exists and is not a joined store; not replacing it")
    if exists and not (append or overwrite):
        raise with_params(
            StoreExistsError,
            f"{str(out)!r} exists; pass ",
            Param("append", True),
            " to add parts or ",
            Param("overwrite", True),
            " to replace its manifest",
        )
    if not exists and append:
        raise with_params(
            StoreNotFoundError,
            Param("append", True),
            f" but there is no joined store at {str(out)!r}",
        )
    if exists:
        _replace_manifest(out, out_abs, new, append, extra, fsync, mixed_tokenizers, remote)
    else:
        _publish_new(out, out_abs, new, extra, fsync, mixed_tokenizers)
    del new  # the parts' mappings, before the join maps them again
    return open_join(out, **remote)


def _publish_new(
    out: Path,
    out_abs: Path,
    new: list[TokenStore],
    extra: dict[str, Any] | None,
    fsync: bool,
    mixed_tokenizers: bool,
) -> None:
    """Write a new join in a temporary folder beside ``out`` and rename it into place (which
    fails, replacing nothing, if ``out`` appeared meanwhile)."""
    if not out.parent.is_dir():
        raise FileNotFoundError(f"parent folder {str(out.parent)!r} of the join does not exist")
    _clean_stale(out.parent, out.name)
    tmp = out.parent / f".{out.name}{_TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _publish(tmp, out_abs, [], None, new, extra, fsync, mixed_tokenizers)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_manifest(
    out: Path,
    out_abs: Path,
    new: list[TokenStore],
    append: bool,
    extra: dict[str, Any] | None,
    fsync: bool,
    mixed_tokenizers: bool,
    remote: dict[str, Any],
) -> None:
    """Append ``new`` to the join ``out`` (or replace its parts by them), under its lock: a new
    offsets file, the manifest swapped atomically, then the old offsets file removed (readers
    that mapped it keep their mapping).  ``extra=None`` keeps the join's extra sections;
    ``remote`` opens the existing join's remote parts."""
    with _locked(out):
        old_store = open_join(out, **remote) if append else None
        old_raw = read_manifest(out)
        kept = list(old_raw["parts"]) if append else []
        if extra is None:
            extra = {k: v for k, v in old_raw.items() if k not in MANIFEST_KEYS | {"tokenizer"}}
        _publish(out, out_abs, kept, old_store, new, extra, fsync, mixed_tokenizers)
        old_file = old_raw["offsets"]["file"]
        if old_file != read_manifest(out)["offsets"]["file"]:
            with contextlib.suppress(OSError):
                (out / old_file).unlink()


def write_join_into(
    folder: str | os.PathLike[str],
    parts: Sequence[str | os.PathLike[str] | TokenStore],
    *,
    extra: dict[str, Any] | None = None,
    attach: dict[str, bytes] | None = None,
    mixed_tokenizers: bool = False,
    fsync: bool = True,
) -> None:
    """Write a join of ``parts`` into ``folder``, an existing folder that holds no join yet and
    that the caller renames into place afterwards (e.g. a distributed build's staging folder,
    whose parts live inside it): part locations are recorded relative to ``folder``; ``attach``
    names small files (e.g. ``tokenizer.json``) written beside the manifest."""
    folder = as_path(folder, "folder")
    if (folder / JOIN_FILE).exists():
        raise StoreExistsError(f"{str(folder)!r} already holds a join")
    _check_extra(extra)
    stores = _open_parts(parts)
    for name, data in (attach or {}).items():
        _write_file(folder, name, data)
    _publish(
        folder, Path(os.path.abspath(folder)), [], None, stores, extra, fsync, mixed_tokenizers
    )


def _check_extra(extra: dict[str, Any] | None) -> None:
    if extra is not None and set(extra) & MANIFEST_KEYS:
        raise ValueError(
            f"extra may not set the manifest's own keys {sorted(set(extra) & MANIFEST_KEYS)}"
        )


def _open_parts(
    parts: Sequence[Any],
    refuse: Path | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[TokenStore]:
    """Each part as an open store (a ``TokenStore`` as it is, a path or URL opened, a URL with
    ``storage_options``); a local part at ``refuse`` (the join being written) is a
    ``ValueError``."""
    refused = None if refuse is None else Path(os.path.abspath(refuse))
    stores = []
    for k, item in enumerate(parts):
        if isinstance(item, TokenStore) and item.parent_doc_ids is not None:
            raise ValueError(
                f"part {k} is a subset of {item.location} ({len(item)} documents); a join's "
                "parts are whole stores: copy the subset into one first (mmpack cp --where / "
                "--split, mmpack.ingest.copy_store)"
            )
        if isinstance(item, TokenStore):
            store = item
        elif isinstance(item, (str, os.PathLike)):
            remote = isinstance(item, str) and "://" in item
            given = {"storage_options": storage_options} if storage_options is not None else {}
            try:
                store = open_store(item, **PartOptions(remote=given).for_part(item))
            except OSError as exc:
                err = part_open_error(f"part {k} ({item})", exc, remote=remote)
                if err is exc:
                    raise
                raise err from exc
        else:
            raise TypeError(
                f"part {k} must be a path, URL or TokenStore, got {type(item).__name__}"
            )
        if "://" not in store.location and Path(os.path.abspath(store.location)) == refused:
            raise ValueError(f"part {k} is the join {str(refuse)!r} itself")
        stores.append(store)
    return stores


def _refuse_cycles(stores: list[TokenStore], out: Path) -> None:
    """``ValueError`` if a part is a join that holds ``out`` (at any depth): the join would
    contain itself, and every open of it would recurse."""
    target = os.path.realpath(out)
    for k, store in enumerate(stores):
        trail = _trail_to(store, target, [os.path.normpath(store.location)])
        if trail is not None:
            raise ValueError(
                f"part {k} ({store.location}) contains the join {str(out)!r} itself "
                f"({' -> '.join(trail)}): a join cannot contain itself; nothing was written"
            )


def _trail_to(store: TokenStore, target: str, trail: list[str]) -> list[str] | None:
    """The locations from ``store`` down to the part at real path ``target``, or None."""
    if not isinstance(store, JoinedStore):
        return None
    for part in store.parts:
        here = [*trail, os.path.normpath(part.location)]
        if "://" not in part.location and os.path.realpath(part.location) == target:
            return here
        found = _trail_to(part, target, here)
        if found is not None:
            return found
    return None


def _holds_remote(store: TokenStore) -> bool:
    if "://" in store.location:
        return True
    return isinstance(store, JoinedStore) and any(_holds_remote(p) for p in store.parts)


def _remote_options(stores: list[TokenStore], given: dict[str, Any] | None) -> dict[str, Any]:
    """The options the join's remote parts open with: ``given``, else those the remote parts
    (and the joins holding some) were opened with, which must agree; ``ValueError`` before
    anything is written otherwise."""
    found = {
        k: s.open_options.get("storage_options") for k, s in enumerate(stores) if _holds_remote(s)
    }
    if given is not None:
        other = [k for k, v in found.items() if v is not None and v != given]
        if other:
            raise ValueError(
                f"part {other[0]} ({stores[other[0]].location}) was opened with other "
                "storage_options than the storage_options given to join: a join opens all its "
                "remote parts with one storage_options"
            )
        return {"storage_options": given}
    values = [(k, v) for k, v in found.items() if v is not None]
    clash = [k for k, v in values if v != values[0][1]]
    if clash:
        raise ValueError(
            f"parts {values[0][0]} and {clash[0]} were opened with different storage_options: "
            "a join opens all its remote parts with the one storage_options given to "
            "mmpack.open; pass storage_options= to join"
        )
    return {"storage_options": values[0][1]} if values else {}


def _publish(
    folder: Path,
    out_abs: Path,
    kept: list[dict[str, Any]],
    old: JoinedStore | None,
    new: list[TokenStore],
    extra: dict[str, Any] | None,
    fsync: bool,
    mixed_tokenizers: bool = False,
) -> None:
    """Write a new offsets file and then the manifest (atomically) into ``folder``."""
    every = (list(old.parts) if old is not None else []) + list(new)
    check_same_tokenizer(every, mixed_tokenizers, "parts")
    joined_mask_fingerprint(every, "", out_abs)  # refuses parts with and without loss masks
    extra = dict(extra or {})
    if "tokenizer" not in extra:
        rec, data = common_tokenizer(every)
        if rec is not None:
            if data is not None:
                _write_file(folder, rec["file"], data)
            elif holds_tokenizer_copy(folder, rec):  # e.g. appending to a distributed build's join
                rec["file"] = "tokenizer.json"
            extra["tokenizer"] = rec
    name = f"offsets-{secrets.token_hex(6)}.bin"
    crc = StripeChecksum(STRIPE_BYTES)
    with atomic_file(folder / name, fsync=fsync) as f:

        def put(values: np.ndarray) -> None:
            data = np.ascontiguousarray(values, dtype=OFFSETS_DTYPE)
            f.write(memoryview(data))  # type: ignore[arg-type]
            crc.update(data)

        if old is not None:
            for lo in range(0, len(old) + 1, _COPY_DOCS):
                put(old.offsets[lo : lo + _COPY_DOCS])
        else:
            put(np.zeros(1, dtype=np.int64))
        base = old.num_tokens if old is not None else 0
        for part in new:
            offs = part.offsets
            for lo in range(1, len(part) + 1, _COPY_DOCS):
                put(offs[lo : lo + _COPY_DOCS].astype(np.int64) + base)
            base += part.num_tokens
    records = kept + [part_record(p, out_abs) for p in new]
    dtypes = [np.dtype(r["dtype"]) for r in records]
    raw: dict[str, Any] = {
        "format": JOIN_FORMAT,
        "version": JOIN_VERSION,
        "dtype": max(dtypes, key=lambda d: d.itemsize, default=np.dtype("<u1")).str,
        "num_docs": sum(r["num_docs"] for r in records),
        "num_tokens": sum(r["num_tokens"] for r in records),
        "offsets": {"file": name, "block_bytes": STRIPE_BYTES, "crc32": crc.finish()},
        "parts": records,
    }
    raw["fingerprint"] = manifest_fingerprint(raw)
    raw.update(extra or {})
    write_json_atomic(folder / JOIN_FILE, raw)


def _write_file(folder: Path, name: str, data: bytes) -> None:
    if "/" in name or name.startswith(".") or name == JOIN_FILE:
        raise ValueError(f"cannot write a file named {name!r} into a join")
    with atomic_file(folder / name) as f:
        f.write(data)


@contextlib.contextmanager
def _locked(out: Path):
    with open(out / JOIN_LOCK_FILE, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _clean_stale(parent: Path, name: str) -> None:
    """Remove temporary join folders of dead processes."""
    prefix = f".{name}{_TMP_TAG}"
    for entry in parent.glob(prefix + "*"):
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except PermissionError:
                pass
