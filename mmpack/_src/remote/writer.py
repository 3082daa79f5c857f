"""Building a store on object storage: build locally, then upload (:mod:`mmpack._src.remote.upload`).

``RemoteStoreWriter`` (what ``mmpack.build(url, ...)`` and ``mmpack build -o URL`` use, through
the ``"url"`` writer of :mod:`mmpack._src.store.registry`) writes the store into a local temporary
folder with the ordinary atomic writer, then uploads it and writes the metadata last, so an
interrupted build is never taken for a store.  The local copy of a killed build
(``$TMPDIR/mmpack-upload-<pid>-*``) is removed by the next remote build on the machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmpack._src.remote.transport import make_transport
from mmpack._src.remote.upload import CHECK_PAGE_BYTES, remote_store_exists, upload, upload_zarr
from mmpack._src.store.writer import StoreWriter
from mmpack.errors import Param, StoreExistsError, with_params

__all__ = ["RemoteStoreWriter"]


class RemoteStoreWriter(StoreWriter):
    """:class:`~mmpack.store.StoreWriter` for a URL target (same arguments, plus
    ``storage_options``, ``check_block_bytes`` and ``progress``: a bar over the upload,
    :func:`mmpack._src.core.progress.progress_bar`).  ``check`` is called with the uploaded store,
    opened from its objects before the metadata is written (not with the local copy)."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        check_block_bytes: int = CHECK_PAGE_BYTES,
        overwrite: bool = False,
        backend: str = "memmap",
        check: Callable[[Any], None] | None = None,
        progress: Any = False,
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
        self.remote_check = check
        self.progress = progress
        _clean_dead_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_TAG}{os.getpid()}-"))
        kwargs["fsync"] = False  # the local copy is temporary: durability is the upload's
        super().__init__(self._workdir / "store", overwrite=overwrite, backend=backend, **kwargs)

    def __enter__(self) -> RemoteStoreWriter:
        try:
            if not self.overwrite and remote_store_exists(self.transport):
                raise with_params(
                    StoreExistsError,
                    f"{self.url!r} exists; pass ",
                    Param("overwrite", True),
                    " to replace it",
                )
            super().__enter__()
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
            common: dict[str, Any] = {
                "overwrite": self.overwrite,
                "storage_options": self.storage_options,
                "check": self.remote_check,
                "progress": self.progress,
            }
            if exc_type is None and self.backend == "zarr":
                self.store = upload_zarr(self.path, self.transport, self.url, **common)
            elif exc_type is None:
                self.store = upload(
                    self.path,
                    self.transport,
                    self.url,
                    check_block_bytes=self.check_block_bytes,
                    **common,
                )
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)


_WORKDIR_TAG = "mmpack-upload-"


def _clean_dead_workdirs() -> None:
    """Remove the local copies that killed remote builds left in the temp folder (their pid
    is dead), as the local writer does for its temporary folders."""
    from mmpack._src.store.publish import pid_alive

    for entry in Path(tempfile.gettempdir()).glob(_WORKDIR_TAG + "*"):
        pid = entry.name[len(_WORKDIR_TAG) :].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
