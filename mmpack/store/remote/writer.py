"""Building a store on object storage: build locally, upload, publish the metadata last.

``RemoteStoreWriter`` (what ``mmpack.build(url, ...)``, ``StoreWriter``'s URL twin and
``mmpack build -o URL`` use) writes the store into a local temporary folder with the ordinary
atomic writer, computes the CRC-32 of every ``check_block_bytes`` (16 KiB) block of
``tokens.bin`` (one sequential pass, ~1 GB/s), uploads ``tokens.bin``, ``offsets.bin`` and that
table concurrently (multipart above 256 MiB) under a fresh ``URL/data-<time>-<random>/``, and
only then PUTs ``URL/mmpack.json``: the commit marker, a single-object PUT that object stores
make visible atomically.  So:

- an interrupted upload leaves objects under a ``data-*`` prefix that no metadata names: nothing
  opens as a store (readers of a previous store keep reading theirs); the local copy of a killed
  build (``$TMPDIR/mmpack-upload-<pid>-*``) is removed by the next remote build on the machine;
- the next build of the same target deletes every ``data-*`` generation that its new metadata
  does not name and that was last written more than ``stale_seconds`` ago (default 0 for the
  generation the previous metadata named, 15 minutes for unnamed ones, so a concurrent
  builder's upload in progress is left alone);
- overwriting: readers of the old store that still have blocks to fetch get a clear
  :class:`~mmpack.errors.StateMismatchError` ("rebuilt after it was opened") once its data is
  deleted, never the new store's bytes (every block is checked against the CRCs of the store
  they opened).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import RemoteAccessError, RemoteError, StoreExistsError
from mmpack.store.format import META_FILE
from mmpack.store.remote.transport import ObjectMissing, Transport, make_transport
from mmpack.store.writer import StoreWriter

__all__ = [
    "CHECK_BLOCK_BYTES",
    "RemoteStoreWriter",
    "clean_stale",
    "commit_generation",
    "new_generation",
]

CHECK_BLOCK_BYTES = 16 << 10
STALE_SECONDS = 15 * 60
"""An unnamed ``data-*`` generation younger than this may be a concurrent build's upload."""


class RemoteStoreWriter(StoreWriter):
    """:class:`~mmpack.store.writer.StoreWriter` for a URL target (same arguments, plus
    ``storage_options`` and ``check_block_bytes``)."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        check_block_bytes: int = CHECK_BLOCK_BYTES,
        overwrite: bool = False,
        backend: str = "memmap",
        **kwargs: Any,
    ) -> None:
        if backend not in ("memmap", "zarr"):
            raise ValueError(f"backend={backend!r} is not one of ['memmap', 'zarr']")
        if (
            isinstance(check_block_bytes, bool)
            or not isinstance(check_block_bytes, int)
            or check_block_bytes < 4096
            or check_block_bytes & (check_block_bytes - 1)
        ):
            raise ValueError(
                f"check_block_bytes must be a power of two >= 4096, got {check_block_bytes!r}"
            )
        self.url = url.rstrip("/")
        self.transport = make_transport(self.url, storage_options)
        self.transport._writable()
        self.storage_options = storage_options
        self.check_block_bytes = check_block_bytes
        _clean_dead_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_TAG}{os.getpid()}-"))
        kwargs["fsync"] = False  # the local copy is temporary: durability is the upload's
        super().__init__(self._workdir / "store", overwrite=overwrite, backend=backend, **kwargs)

    def __enter__(self) -> RemoteStoreWriter:
        try:
            if not self.overwrite and _exists(self.transport):
                raise StoreExistsError(f"{self.url!r} exists; pass overwrite=True to replace it")
            super().__enter__()
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
            if exc_type is None and self.backend == "zarr":
                from mmpack.store.remote.zarr_upload import upload_zarr

                self.store = upload_zarr(
                    self.path,
                    self.transport,
                    self.url,
                    overwrite=self.overwrite,
                    storage_options=self.storage_options,
                )
            elif exc_type is None:
                self.store = upload(
                    self.path,
                    self.transport,
                    self.url,
                    overwrite=self.overwrite,
                    check_block_bytes=self.check_block_bytes,
                    storage_options=self.storage_options,
                )
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)


_WORKDIR_TAG = "mmpack-upload-"


def _clean_dead_workdirs() -> None:
    """Remove the local copies that killed remote builds left in the temp folder (their pid
    is dead), as the local writer does for its temporary folders."""
    from mmpack.store.writer import _pid_alive

    for entry in Path(tempfile.gettempdir()).glob(_WORKDIR_TAG + "*"):
        pid = entry.name[len(_WORKDIR_TAG) :].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _exists(transport: Transport) -> bool:
    try:
        transport.size(META_FILE)
        return True
    except ObjectMissing as exc:
        if transport.missing_code(exc) == "NoSuchBucket":
            raise FileNotFoundError(f"{transport.url}: the bucket does not exist") from None
        return False


def check_table(path: Path, block: int) -> bytes:
    """CRC-32 (uint32 LE) of every ``block`` bytes of the file at ``path``."""
    import zlib

    crcs = []
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            crcs.append(zlib.crc32(chunk))
    return np.asarray(crcs, dtype="<u4").tobytes()


def upload(
    local: Path,
    transport: Transport,
    url: str,
    *,
    overwrite: bool,
    check_block_bytes: int = CHECK_BLOCK_BYTES,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """Upload the local memmap store at ``local`` to ``url``; returns it opened remotely."""
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    from mmpack.store.reader import open_store

    raw = json.loads((local / META_FILE).read_text())
    if raw.get("backend") != "memmap":
        raise ValueError(f"{local}: only memmap stores are uploaded")
    previous, gen = new_generation(transport)
    table = check_table(local / "tokens.bin", check_block_bytes)
    (local / "tokens.crc").write_bytes(table)
    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(transport.put_file, f"{gen}/{name}", local / name)
            for name in ("tokens.bin", "offsets.bin", "tokens.crc")
        ]
        for f in futures:
            f.result()
    raw["remote"] = {
        "data": gen,
        "check_block_bytes": check_block_bytes,
        "check_object": "tokens.crc",
        "check_crc32": zlib.crc32(table),
    }
    objects = [f"{gen}/{n}" for n in ("tokens.bin", "offsets.bin", "tokens.crc")]
    commit_generation(transport, url, raw, gen, previous, objects, overwrite=overwrite)
    return open_store(url, storage_options=storage_options)


def new_generation(transport: Transport) -> tuple[str | None, str]:
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
    if not overwrite and _exists(transport):
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
