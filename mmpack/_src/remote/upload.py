"""Uploading a finished local store to object storage, committed by its metadata written last.

Both layouts upload their objects under a fresh ``URL/data-<time>-<random>/`` prefix and only then
PUT ``URL/mmpack.json``, the commit marker (:func:`commit_generation`); a loss mask store goes
first, as a store of its own at ``URL/loss_mask``.  A memmap store (:func:`upload`) sends
``tokens.bin``, ``offsets.bin``, ``tokens.xxh`` (the XXH64 of every ``check_block_bytes``, 16
KiB, page of the tokens, uint64 LE: one sequential pass; the record holds its CRC-32 per
``check_stripe_bytes``) and its attached files concurrently, multipart above 256 MiB; a sharded Zarr store (:func:`upload_zarr`) sends its shards four at a
time and records every shard's size (layout: :mod:`mmpack._src.remote.zarr`).  A ``check`` (a copy's
verification) gets the store opened from its objects before the metadata is written; a failure
deletes them.

- an interrupted upload leaves a ``data-*`` prefix no metadata names: nothing opens as a store;
- the next build of the target deletes every ``data-*`` generation its new metadata does not name
  and that was last written more than ``stale_seconds`` ago (0 for the one the previous metadata
  named, 15 minutes for unnamed ones; :func:`clean_stale`);
- readers of an overwritten store get :class:`~mmpack.errors.StateMismatchError` ("rebuilt after
  it was opened") once its data is deleted, never the new store's bytes.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.remote.backend import CHECK_DIGEST
from mmpack._src.remote.transport import ObjectMissing, Transport, make_transport
from mmpack._src.remote.zarr import LAYOUT
from mmpack._src.store.backends._zarr_shards import parse_layout
from mmpack._src.store.format import LOSS_MASK_STORE, META_FILE, STRIPE_BYTES, crc32_blocks
from mmpack._src.store.integrity import stripe_digests
from mmpack.errors import RemoteAccessError, RemoteError, StoreExistsError

__all__ = [
    "CHECK_PAGE_BYTES",
    "CHECK_STRIPE_BYTES",
    "STALE_SECONDS",
    "check_table",
    "clean_stale",
    "commit_generation",
    "remote_store_exists",
    "upload",
    "upload_zarr",
]

CHECK_PAGE_BYTES = 16 << 10
CHECK_STRIPE_BYTES = STRIPE_BYTES
"""The check table's CRC-32 unit (the record's ``check_stripe_bytes``): a reader fetches and
checks the table a stripe at a time, on first use."""
_CHECK_OBJECT = "tokens.xxh"
STALE_SECONDS = 15 * 60
"""An unnamed ``data-*`` generation younger than this may be a concurrent build's upload."""


def remote_store_exists(transport: Transport) -> bool:
    """Whether a committed store (its ``mmpack.json``) is at ``transport``; ``FileNotFoundError``
    when its bucket does not exist."""
    try:
        transport.size(META_FILE)
        return True
    except ObjectMissing as exc:
        if transport.missing_code(exc) == "NoSuchBucket":
            raise FileNotFoundError(f"{transport.url}: the bucket does not exist") from None
        return False


def check_table(path: Path, page: int, chunk: int = 64 << 20) -> bytes:
    """XXH64 (uint64 LE) of every ``page`` bytes of the file at ``path`` (the last may be
    short), read about ``chunk`` bytes at a time (whole pages) into one buffer."""
    buf = bytearray(max(1, chunk // page) * page)  # reused: no new pages per chunk
    parts = []
    with open(path, "rb") as f:  # buffered: readinto fills the buffer unless at the end
        while n := f.readinto(buf):
            parts.append(stripe_digests(memoryview(buf)[:n], page))
    table = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return table.astype("<u8").tobytes()


def upload(
    local: Path,
    transport: Transport,
    url: str,
    *,
    overwrite: bool,
    check_block_bytes: int = CHECK_PAGE_BYTES,
    storage_options: dict[str, Any] | None = None,
    check: Callable[[Any], None] | None = None,
    progress: Any = False,
) -> Any:
    """Upload the local memmap store at ``local`` to ``url``; returns it opened remotely.

    ``check`` is called with the uploaded store, opened from its objects, before its metadata
    is written (whatever it raises deletes the objects and publishes nothing); ``progress`` a
    bar over the bytes uploaded (:func:`mmpack._src.core.progress.progress_bar`)."""
    from mmpack._src.store.reader import open_store

    raw = json.loads((local / META_FILE).read_text())
    if raw.get("backend") != "memmap":
        raise ValueError(f"{local}: only memmap stores are uploaded")
    if "loss_mask" in raw:
        upload(
            local / LOSS_MASK_STORE,
            make_transport(f"{url}/{LOSS_MASK_STORE}", storage_options),
            f"{url}/{LOSS_MASK_STORE}",
            overwrite=True,
            check_block_bytes=check_block_bytes,
            storage_options=storage_options,
        )
    previous, gen = _new_generation(transport)
    table = check_table(local / "tokens.bin", check_block_bytes)
    (local / _CHECK_OBJECT).write_bytes(table)
    columns = [f["file"] for f in raw.get("fields", [])]  # the per-document fields' files
    names = ["tokens.bin", "offsets.bin", _CHECK_OBJECT, *raw.get("files", []), *columns]
    _put_files(transport, {f"{gen}/{n}": local / n for n in names}, 3, progress)
    raw["remote"] = {
        "data": gen,
        "check_block_bytes": check_block_bytes,
        "check_object": _CHECK_OBJECT,
        "check_digest": CHECK_DIGEST,
        "check_stripe_bytes": CHECK_STRIPE_BYTES,
        "check_crc32s": crc32_blocks(table, CHECK_STRIPE_BYTES),
    }
    objects = [f"{gen}/{n}" for n in names]
    _check_uncommitted(transport, url, raw, objects, check, storage_options)
    commit_generation(transport, url, raw, gen, previous, objects, overwrite=overwrite)
    return open_store(url, storage_options=storage_options)


def _put_files(
    transport: Transport, files: dict[str, Path], threads: int, progress: Any = False
) -> None:
    """PUT each local file under its key, ``threads`` at a time (a bar over their bytes)."""
    total = sum(p.stat().st_size for p in files.values())
    with (
        progress_bar(progress, total, desc="uploading") as bar,
        ThreadPoolExecutor(threads) as pool,
    ):
        futures = [
            pool.submit(transport.put_file, key, path, bar.update) for key, path in files.items()
        ]
        for f in futures:
            f.result()


def _check_uncommitted(
    transport: Transport,
    url: str,
    raw: dict[str, Any],
    objects: list[str],
    check: Callable[[Any], None] | None,
    storage_options: dict[str, Any] | None,
) -> None:
    """``check(store)``, the store ``raw`` describes opened from the uploaded ``objects`` before
    any metadata names them; on any failure the objects are deleted (nothing of them could
    ever open) and the error raised."""
    if check is None:
        return
    from mmpack._src.remote.opener import open_record

    try:
        check(open_record(transport, raw, url, storage_options=storage_options, cache_limit=0))
    except BaseException:
        with contextlib.suppress(RemoteError, RemoteAccessError, OSError):
            transport.delete(objects)
        raise


def _new_generation(transport: Transport) -> tuple[str | None, str]:
    """The ``data-*`` prefix the committed store at ``transport`` names (``None``: none), and a
    fresh one for a new build's objects."""
    return _current_data(transport), f"data-{time.time_ns():x}-{secrets.token_hex(4)}"


def commit_generation(
    transport: Transport,
    url: str,
    raw: dict[str, Any],
    gen: str,
    previous: str | None,
    objects: list[str],
    *,
    overwrite: bool,
) -> None:
    """Commit the uploaded generation ``gen`` (its ``objects``) by writing ``mmpack.json``
    (``raw``) last, then remove the stale generations (a failure there is a warning).

    Raises
    ------
    StoreExistsError
        ``overwrite`` is false and a store appeared at ``url`` during the build (``objects``
        are deleted first).
    """
    if not overwrite and remote_store_exists(transport):
        transport.delete(objects)
        raise StoreExistsError(f"{url!r} appeared during the build; not replacing it")
    transport.put(META_FILE, json.dumps(raw, indent=1).encode())  # the commit marker, last
    try:  # the store is committed: a failed clean-up is a warning, the next build retries it
        clean_stale(transport, keep=gen, previous=previous)
    except (RemoteError, RemoteAccessError) as exc:
        warnings.warn(
            f"{url}: the store is built, but removing old data failed: {exc}", stacklevel=4
        )


def _current_data(transport: Transport) -> str | None:
    try:
        raw = json.loads(transport.get(META_FILE))
        return str(raw["remote"]["data"]).strip("/")
    except (ObjectMissing, ValueError, KeyError, TypeError):
        return None


def clean_stale(
    transport: Transport, keep: str, previous: str | None = None, stale_seconds: float | None = None
) -> list[str]:
    """Delete the ``data-*`` generations under ``transport`` other than ``keep``: the one the
    replaced metadata named (``previous``) at once, unnamed ones once older than
    ``stale_seconds`` (default :data:`STALE_SECONDS`).  Returns the deleted keys."""
    stale = STALE_SECONDS if stale_seconds is None else stale_seconds
    groups: dict[str, list[tuple[str, float]]] = {}
    for key, _, mtime in transport.list_prefix("data-"):
        gen = key.split("/", 1)[0]
        groups.setdefault(gen, []).append((key, mtime))
    now = time.time()
    doomed: list[str] = []
    for gen, items in groups.items():
        if gen == keep:
            continue
        newest = max(m for _, m in items)
        if gen == previous or now - newest >= stale:
            doomed.extend(k for k, _ in items)
    transport.delete(doomed)
    return doomed


def upload_zarr(
    local: Path,
    transport: Transport,
    url: str,
    *,
    overwrite: bool,
    storage_options: dict[str, Any] | None = None,
    check: Callable[[Any], None] | None = None,
    progress: Any = False,
) -> Any:
    """Upload the local sharded Zarr store at ``local`` to ``url`` (objects under a fresh
    ``data-*`` prefix, then ``mmpack.json``); returns it opened remotely.  ``check`` and
    ``progress`` as for :func:`upload`."""
    from mmpack._src.store.reader import open_store

    group = json.loads((local / "zarr.json").read_text())
    raw = dict(group["attributes"]["mmpack"])
    arrays = {n: json.loads((local / n / "zarr.json").read_text()) for n in ("tokens", "offsets")}
    for n, a in arrays.items():
        if parse_layout(a) is None:
            raise ValueError(f"{local}/{n}: not the sharded Zarr layout; rebuild it")
    if "loss_mask" in raw:
        upload_zarr(
            local / LOSS_MASK_STORE,
            make_transport(f"{url}/{LOSS_MASK_STORE}", storage_options),
            f"{url}/{LOSS_MASK_STORE}",
            overwrite=True,
            storage_options=storage_options,
        )
    files = sorted(p for p in local.rglob("*") if p.is_file())
    rel = {p: p.relative_to(local).as_posix() for p in files}
    files = [p for p in files if rel[p].split("/")[0] != LOSS_MASK_STORE]
    previous, gen = _new_generation(transport)
    _put_files(transport, {f"{gen}/{rel[p]}": p for p in files}, 4, progress)
    raw["remote"] = {
        "data": gen,
        "layout": LAYOUT,
        "arrays": arrays,
        "objects": {
            rel[p]: p.stat().st_size
            for p in files
            if rel[p].split("/")[0] in ("tokens", "offsets") and p.name != "zarr.json"
        },
    }
    objects = [f"{gen}/{rel[p]}" for p in files]
    _check_uncommitted(transport, url, raw, objects, check, storage_options)
    commit_generation(transport, url, raw, gen, previous, objects, overwrite=overwrite)
    return open_store(url, storage_options=storage_options)
