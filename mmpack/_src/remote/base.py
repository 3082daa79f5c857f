"""What the two remote backends share: :class:`~mmpack._src.remote.backend.RemoteBackend`
(memmap objects) and :class:`~mmpack._src.remote.zarr.RemoteZarrBackend` (sharded Zarr).

:class:`RemoteStoreBackend` is the part of the :class:`~mmpack._src.store.backends.Backend`
interface that is the same for both: a remote store is read-only (written by
:mod:`mmpack._src.remote.writer`), has no local metadata file, is never pickled (the
:class:`~mmpack.TokenStore` reopens its URL; the backends' per-process parts, their
threads and node-cache mappings, are made anew in each process), and reads its tokens through
one :class:`~mmpack._src.remote.fetcher.PageFetcher` over its layout's page source, the node cache's
pages copied out under the reader's pins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.remote.cached import CachedObject, copied
from mmpack._src.remote.pages import gather
from mmpack._src.remote.transport import ObjectMissing
from mmpack._src.store.backends import Backend
from mmpack._src.store.format import StoreMeta
from mmpack.errors import FormatError

__all__ = ["RemoteStoreBackend"]


class RemoteStoreBackend(Backend):
    """A read-only store on object storage (subclasses open it; they set ``transport``,
    ``data``, the prefix of the store's objects: ``"data-<id>/"``, or ``""`` for a store copied
    as is, ``fetcher``, the tokens' :class:`~mmpack._src.remote.fetcher.PageFetcher`, and
    ``node_cache``, the tokens in the node cache or None)."""

    transport: Any
    data: str
    fetcher: Any
    node_cache: CachedObject | None
    remote = True

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} is not pickled; the TokenStore reopens its URL")

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        return None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        raise NotImplementedError("remote stores are written by mmpack.build(URL, ...)")

    def read_file(self, name: str) -> bytes:
        """An attached file: the object ``<data>/<name>`` (:mod:`mmpack._src.remote.upload`; a
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

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ranges' tokens, copied back to back into a new buffer ``src``:
        ``src[src_starts[k]:src_starts[k] + lengths[k]]`` is range k.  With a node cache the
        pages are pinned while they are checked and copied (never a view of the mapping:
        another process may drop a page nobody pins), the missing ones fetched first."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        fetcher = self.fetcher
        src_starts = np.zeros(starts.shape[0], dtype=np.int64)
        if starts.shape[0]:
            np.cumsum(lengths[:-1], out=src_starts[1:])
        ids = fetcher.page_ids(starts, lengths)
        if self.node_cache is None:
            return self._gathered(fetcher.pages(ids), starts, lengths), src_starts
        # copied out of the mapping only while pinned: another process may drop (punch) any
        # page nobody pins, and a hole reads as zeros
        with self.node_cache.pinned(ids) as cf:
            if cf is None:  # no mapping, or a drop held a page too long: fetched here
                out = self._gathered(fetcher.pages(ids, use_cache=False), starts, lengths)
                return out, src_starts
            src = fetcher.cached(starts, lengths)
            pages = None
            if src is None:
                pages = fetcher.pages(ids)
                src = fetcher.cached(starts, lengths)
            if src is not None and src is cf.tokens:  # every page is in the pinned mapping
                return copied(src, starts, lengths), src_starts
            if pages is None:  # the mapping changed under the pins (retired): fetched here
                pages = fetcher.pages(ids, use_cache=False)
            return self._gathered(pages, starts, lengths), src_starts

    def _gathered(self, pages: dict[int, Any], starts: np.ndarray, lengths: np.ndarray) -> Any:
        itemsize = self.meta.dtype.itemsize
        return gather(pages, starts, lengths, itemsize, self.fetcher.page).view(self.meta.dtype)
