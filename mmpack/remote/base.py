"""What the two remote backends share: :class:`~mmpack.remote.backend.RemoteBackend`
(memmap objects) and :class:`~mmpack.remote.zarr.RemoteZarrBackend` (sharded Zarr).

:class:`RemoteStoreBackend` is the part of the :class:`~mmpack.store.backends.Backend`
interface that is the same for both and holds no state: a remote store is read-only (written by
:mod:`mmpack.remote.writer`), has no local metadata file, and is never pickled (the
:class:`~mmpack.store.reader.TokenStore` reopens its URL; the backends' per-process parts, their
threads and node-cache mappings, are made anew in each process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmpack.errors import FormatError
from mmpack.remote.transport import ObjectMissing
from mmpack.store.backends import Backend
from mmpack.store.format import StoreMeta

__all__ = ["RemoteStoreBackend"]


class RemoteStoreBackend(Backend):
    """A read-only store on object storage (subclasses read it; they set ``transport`` and
    ``data``, the prefix of the store's objects: ``"data-<id>/"``, or ``""`` for a store copied
    as is)."""

    transport: Any
    data: str
    remote = True

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} is not pickled; the TokenStore reopens its URL")

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        return None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        raise NotImplementedError("remote stores are written by mmpack.remote.writer")

    def read_file(self, name: str) -> bytes:
        """An attached file: the object ``<data>/<name>`` (:mod:`mmpack.remote.upload`; a
        store copied as is keeps it beside ``mmpack.json``); a missing one is a
        :class:`~mmpack.errors.FormatError`."""
        transport, data = self.transport, self.data  # set by the subclass
        try:
            return transport.get(data + name)
        except ObjectMissing:
            raise FormatError(
                f"{transport.url}: {data}{name} is missing, though the metadata lists it: the "
                "store is incomplete; build or copy it again"
            ) from None
