"""Atomic publishing of a store folder: where a build writes, how it replaces a target, and
how the leftovers of dead builders are found.

A builder writes into ``.<name>.mmpack-tmp-<pid>-<8 hex>`` beside the target (a distributed
build into ``.<name>.mmpack-build-<pid>-<8 hex>``, its parts inside).  The folder is staged as
``.<name>.mmpack-new-...``, gets its lock file ``.mmpack-lock`` (held with ``flock`` for the
builder's lifetime), then is renamed to its ``-tmp-`` (``-build-``) name (:func:`stage_folder`),
so every such folder a cleaner sees carries its builder's lock.  :func:`clean_stale` removes only
the folders of exactly that target name (compared as strings, never as glob patterns) whose lock
it can take: one ``listdir`` of the parent plus one ``open``/``flock`` per candidate, valid across
PID namespaces; a killed build of either kind is cleaned by the next build of its target.  Before the swap :func:`check_new_store` opens the finished folder as a store
(metadata and offsets, O(num_docs)) and :func:`check_replaceable` re-checks that the target is
a store or an empty folder (one ``listdir``); :func:`swap_into_place` then renames the folder
onto a free target, or exchanges it with an existing store in one ``renameat2(RENAME_EXCHANGE)``
(two renames where the kernel lacks it), so readers never see a half-written store and keep
their mappings of the previous one.  :func:`fsync_dir` makes the renames durable.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from mmpack._src.core.libc import libc_function
from mmpack._src.store.backends import OFFSETS_FILE, TOKENS_FILE
from mmpack._src.store.format import (
    LOSS_MASK_STORE,
    META_FILE,
    StoreMeta,
    plain_file_name,
    write_json_atomic,
)
from mmpack._src.store.opening import read_raw_meta
from mmpack._src.store.reader import TokenStore
from mmpack._src.store.registry import OWNERS, load
from mmpack.errors import FormatError, Param, StoreExistsError, with_params

__all__ = [
    "BUILD_TAG",
    "LAYOUT_ENTRIES",
    "LOCK_FILE",
    "check_new_store",
    "check_replaceable",
    "check_target",
    "clean_stale",
    "fsync_dir",
    "inside_build",
    "pid_alive",
    "stage_folder",
    "swap_into_place",
]

_TMP_TAG = ".mmpack-tmp-"
BUILD_TAG = ".mmpack-build-"
"""The tag of a distributed build's staging folder (:func:`stage_folder` with ``tag=``)."""
_OLD_TAG = ".mmpack-old-"
_NEW_TAG = ".mmpack-new-"
LOCK_FILE = ".mmpack-lock"
"""The builder's lock file inside its temporary folder (removed from the published store)."""
_NO_LOCK_GRACE_S = 60.0
_LOCKED_TAGS = (_TMP_TAG, BUILD_TAG)


def check_target(path: Path, overwrite: bool) -> None:
    """Check, before any work, that a build may write ``path``: it is free, or ``overwrite`` is
    true and it is replaceable (:func:`check_replaceable`), and its parent is a folder.

    Raises
    ------
    StoreExistsError
        ``path`` exists and ``overwrite`` is false.
    FileExistsError
        ``path`` is not an mmpack store or an empty folder.
    NotADirectoryError, FileNotFoundError
        The parent is a file, or does not exist.
    """
    parent = path.parent
    if os.path.lexists(path):
        if not overwrite:
            raise with_params(
                StoreExistsError,
                f"{str(path)!r} exists; pass ",
                Param("overwrite", True),
                " to replace it",
            )
        check_replaceable(path)
    if not parent.is_dir():
        if parent.exists():
            raise NotADirectoryError(
                f"the parent {str(parent)!r} of the store is a file, not a folder"
            )
        raise FileNotFoundError(f"parent folder {str(parent)!r} of the store does not exist")


def stage_folder(target: Path, tag: str = _TMP_TAG) -> tuple[Path, int]:
    """Create the temporary folder of a build of ``target`` and take its lock.

    Stale folders of dead builders of ``target`` are removed first.  The folder appears under
    its temporary name (``.<name><tag><pid>-<8 hex>``; ``tag`` is ``.mmpack-tmp-`` or
    :data:`BUILD_TAG`) already holding its builder's lock: it is staged under a name no cleaner
    of live folders looks at, locked, then renamed.

    Returns
    -------
    (folder, lock_fd)
        The temporary folder, and the fd of its lock file (holding its ``flock`` where the file
        system has one); the caller closes the fd once the folder is published or removed.
    """
    if tag not in _LOCKED_TAGS:
        raise ValueError(f"tag must be one of {_LOCKED_TAGS}, got {tag!r}")
    parent = target.parent
    clean_stale(parent, target.name)
    suffix = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = parent / f".{target.name}{_NEW_TAG}{suffix}"
    staging.mkdir()
    try:
        fd = _take_lock(staging / LOCK_FILE)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    tmp = parent / f".{target.name}{tag}{suffix}"
    try:
        os.rename(staging, tmp)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return tmp, fd


def check_new_store(tmp: Path, meta: StoreMeta) -> TokenStore:
    """Open the finished temporary folder as a store (metadata, file sizes, offsets from 0,
    never decreasing, ending at num_tokens) and return it: a store that would fail its own open
    is never renamed into place."""
    raw = read_raw_meta(tmp)
    if StoreMeta.from_json(raw, tmp).fingerprint != meta.fingerprint:
        raise FormatError(f"{tmp}: the metadata written does not read back; nothing was replaced")
    store = TokenStore(tmp, StoreMeta.from_json(raw, tmp), raw)
    _ = store.offsets  # every page of the index (an open checks its ends and first/last pages)
    if store.has_loss_mask and store.loss_mask is None:  # opening it checks it against the record
        raise FormatError(f"{tmp}: the loss mask written does not read back; nothing was replaced")
    return store


# --------------------------------------------------------------------------------- the target
def inside_build(path: str | os.PathLike[str], target: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the store folder ``target``, lies inside it (its files, a join's
    parts, its cache), or lies in a temporary folder of a build of it beside it (``.<name>.mmpack-
    tmp-*``, ``-new-``, ``-old-``, ``-build-``): what a build of ``target`` replaces or writes,
    never to be read as its input.  Both paths are compared resolved (symbolic links followed,
    ``..`` removed); two ``realpath`` calls, no other system call."""
    where = Path(os.path.realpath(path))
    out = Path(os.path.realpath(target))
    if where == out or out in where.parents:
        return True
    prefix = f".{out.name}.mmpack-"
    for folder in (where, *where.parents):
        if folder.parent == out.parent:
            return folder.name.startswith(prefix)
    return False


LAYOUT_ENTRIES = {
    "memmap": frozenset(
        {META_FILE, TOKENS_FILE, OFFSETS_FILE, "cache", LOCK_FILE, LOSS_MASK_STORE}
    ),
    "zarr": frozenset({"zarr.json", "tokens", "offsets", "cache", LOCK_FILE, LOSS_MASK_STORE}),
}
"""The entries each local layout writes into a store folder itself (its metadata, its arrays,
the plan ``cache``, the builder's lock and the loss mask store); the other files a build writes are listed in the
metadata (:attr:`~mmpack._src.store.format.StoreMeta.files`)."""


_ONLY_STORES = (Param("overwrite", True), " replaces only an mmpack store or an empty folder")


def check_replaceable(path: Path) -> None:
    """Raise unless ``path`` is an mmpack store holding only its own files, or an empty folder:
    ``overwrite`` replaces stores, never a user's folder, file or link.  A store's own files are
    its layout's (:data:`LAYOUT_ENTRIES`) and the regular files its metadata lists as written by
    its build (``"files"``, e.g. ``tokenizer.json``); a kind of store an adapter registered (a
    join) names its own.  Called before any work and again right before the swap."""
    if os.path.islink(path):
        raise with_params(
            FileExistsError,
            f"{str(path)!r} is a symbolic link; refusing to replace it (",
            *_ONLY_STORES,
            ")",
        )
    if not path.is_dir():
        what = "a file" if path.is_file() else "not a folder"
        raise with_params(
            FileExistsError,
            f"{str(path)!r} is {what}, not a store; refusing to replace it (",
            *_ONLY_STORES,
            ")",
        )
    entries = sorted(os.listdir(path))
    if not entries:
        return
    try:
        raw = read_raw_meta(path)
    except (FormatError, OSError):
        raw = None
    backend = raw.get("backend") if isinstance(raw, dict) else None
    own: set[str] | frozenset[str] | None
    if isinstance(backend, str) and backend in LAYOUT_ENTRIES:
        own = LAYOUT_ENTRIES[backend] | _listed_files(path, raw)
    else:
        own = None if isinstance(backend, str) else _owned_entries(path)
    extra = [e for e in entries if own is None or e not in own]
    if own is None or extra:
        shown = ", ".join(extra[:5]) + (f", ... ({len(extra)} entries)" if len(extra) > 5 else "")
        what = "an mmpack store with other files" if own else "not an mmpack store"
        raise with_params(
            FileExistsError,
            f"{str(path)!r} is {what} (it holds {shown}); refusing to replace it: ",
            *_ONLY_STORES,
        )


def _listed_files(path: Path, raw: dict) -> set[str]:
    """The names the metadata of the store ``path`` lists as files its build wrote (attached
    files, field columns), that are
    regular files there (a folder or a link of that name is not what the build wrote); none
    when the list is malformed."""
    names = raw.get("files", [])
    fields = raw.get("fields", [])
    if isinstance(names, list) and isinstance(fields, list):  # and the fields' columns
        names = names + [r.get("file") for r in fields if isinstance(r, dict)]
    if not isinstance(names, list) or not all(map(plain_file_name, names)):
        return set()
    return {n for n in names if stat.S_ISREG(_lstat_mode(path / n))}


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _owned_entries(path: Path) -> set[str] | None:
    """The entries of ``path`` that a registered kind of store (a join) holds of its own."""
    for entry in OWNERS:
        own = load(entry)(path)
        if own is not None:
            return set(own)
    return None


# --------------------------------------------------------------------------------- the rename
def _take_lock(path: Path) -> int:
    """Create ``path`` and hold an exclusive ``flock`` on it for the builder's lifetime: the
    liveness signal of a temporary folder, valid across PID namespaces (containers sharing a
    volume) where a PID in a name is not."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            os.close(fd)
            raise
        # No flock on this file system: the lock file stays, and cleaners, unable to take the
        # lock either, keep the folder (a leak at worst, never a live build deleted).
    except BaseException:
        os.close(fd)
        raise
    return fd


_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


def _builder_dead(folder: Path) -> tuple[bool, int | None]:
    """``(dead, fd)``: whether the builder of temporary folder ``folder`` is gone, and the lock
    fd if we took its lock (held while we remove the folder).  A builder's folder carries its
    lock file from the moment it appears under this name until it is renamed onto the target;
    a folder without one holds a previous store moved aside by an exchange (to be removed) or
    comes from an mmpack without locks."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live builder (or no flock on this file system): keep it
        os.close(fd)
        return False, None
    return True, fd


def _old_and_pid_dead(folder: Path) -> bool:
    """For staging folders (no lock yet): older than a minute and no live process of that PID
    here (a builder stages its folder for microseconds)."""
    try:
        age = time.time() - os.lstat(folder).st_mtime
    except OSError:
        return False
    pid_text = folder.name.rsplit("-", 2)[-2] if folder.name.count("-") >= 2 else ""
    alive = pid_text.isdigit() and pid_alive(int(pid_text))
    return age > _NO_LOCK_GRACE_S and not alive


def clean_stale(parent: Path, name: str) -> None:
    """Remove temporary folders left by dead builders of ``parent/name``.  Names are compared
    exactly (``a*`` or ``corpus[v2]`` are names, not patterns); a temporary folder is removed
    only once its builder's lock is taken (see :func:`_builder_dead`)."""
    locked = [f".{name}{tag}" for tag in _LOCKED_TAGS]
    old_prefix, new_prefix = f".{name}{_OLD_TAG}", f".{name}{_NEW_TAG}"
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        folder = parent / entry
        if any(entry.startswith(p) and _tagged(entry[len(p) :]) for p in locked):
            dead, fd = _builder_dead(folder)
            try:
                if dead:
                    shutil.rmtree(folder, ignore_errors=True)
            finally:
                if fd is not None:
                    os.close(fd)
        elif entry.startswith(new_prefix) and _tagged(entry[len(new_prefix) :]):
            if _old_and_pid_dead(folder):
                shutil.rmtree(folder, ignore_errors=True)
        elif entry.startswith(old_prefix) and _tagged(entry[len(old_prefix) :]):
            # A previous store moved aside by the two-rename fallback; its builder removes it
            # right after the second rename.
            pid_text = entry[len(old_prefix) :].split("-", 1)[0]
            if not pid_alive(int(pid_text)):
                shutil.rmtree(folder, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _tagged(suffix: str) -> bool:
    """``<pid>-<8 hex digits>``, exactly what a builder appends."""
    pid, _, rand = suffix.partition("-")
    return pid.isdigit() and len(rand) == 8 and all(c in "0123456789abcdef" for c in rand)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False where unsupported."""
    fn = libc_function(
        "renameat2",
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint],
    )
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def swap_into_place(tmp: Path, target: Path, overwrite: bool) -> None:
    if not os.path.lexists(target):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if not os.path.lexists(target):
                raise
    if not overwrite:
        raise StoreExistsError(f"{str(target)!r} appeared during the build; not replacing it")
    check_replaceable(target)  # what is there now, not what was there when the build began
    if _renameat2_exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the previous store
        return
    old = target.parent / f".{target.name}{_OLD_TAG}{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_extra(tmp: Path, backend: str, meta: StoreMeta, extra: dict[str, Any]) -> None:
    """Rewrite the committed metadata record of the store at ``tmp`` with the optional ``extra``
    sections (the tokenizer record, provenance...), which may not replace the record's own keys."""
    core = meta.to_json()
    clash = set(extra) & set(core)
    if clash:
        raise ValueError(f"extra metadata may not replace the record's own keys {sorted(clash)}")
    record = {**core, **extra}
    if backend == "zarr":
        from mmpack._src.store.backends._zarr import (
            _zarr,  # zarr stays imported by its backend only
        )

        _zarr().open_group(str(tmp), mode="a").attrs["mmpack"] = record
    else:
        write_json_atomic(tmp / META_FILE, record)
