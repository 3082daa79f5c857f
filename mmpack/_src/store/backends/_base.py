"""The interface every storage backend implements."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.store.format import StoreMeta

TOKENS_FILE = "tokens.bin"
OFFSETS_FILE = "offsets.bin"


class Backend(abc.ABC):
    """Read access to one store's ``tokens`` and ``offsets`` arrays."""

    name: str

    remote: bool = False
    """Whether the tokens live on object storage (read through range requests): the default
    sample order and the whole-block fetch follow it (``mmpack.torch.loader``).  A backend over
    other stores (a subset, a join) answers for the stores it reads."""

    tokens: np.ndarray | None = None
    """The whole flat token array as a read-only mapping, where the backend maps its tokens
    (memmap, a foreign file); None where reads go through :meth:`read_ranges` only."""

    span_fetcher: Any = None
    """The fetcher of whole spans into the node cache (a remote store opened with a cache:
    :class:`mmpack._src.remote.spans.SpanFetcher`); None where the store cannot fetch whole
    blocks ahead of the sampler's order."""

    parent: Any = None
    """The store whose tokens this one's documents are, for a subset
    (:class:`mmpack._src.store.subset.SubsetBackend`); None for a store that holds its tokens.
    With it: ``parent_doc_ids`` and ``parent_doc_starts`` (int64, shape (num_docs,), read-only;
    each document's id and start in the parent) and ``split_depth`` (the splits that made it)."""

    parent_doc_ids: np.ndarray | None = None
    parent_doc_starts: np.ndarray | None = None
    split_depth: int = 0

    def __init__(self, path: Path, meta: StoreMeta) -> None:
        self.path = path
        self.meta = meta

    @staticmethod
    @abc.abstractmethod
    def read_meta(path: Path) -> Any | None:
        """The raw metadata record of a store of this backend at ``path``, or None if absent."""

    @staticmethod
    @abc.abstractmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        """Turn the raw files ``tokens.bin``/``offsets.bin`` in ``tmpdir`` into this backend's
        layout and write the metadata last (the folder is renamed into place afterwards)."""

    @property
    @abc.abstractmethod
    def offsets(self) -> np.ndarray:
        """int64, shape (num_docs + 1,), read-only.  Where the backend fills its offsets
        lazily, only the stripes :meth:`load_offsets` made present hold them (readers go through
        the store's :class:`~mmpack._src.store.offsets_pages.OffsetsPages`, which loads each stripe
        before checking it)."""

    def load_offsets(self, first: int, stop: int) -> None:
        """Make stripes ``[first, stop)`` of :attr:`offsets` (``meta.block_bytes`` each) present
        and checked against the metadata's CRC-32s, each once per process; a backend whose
        offsets are not whole at open (remote layouts, Zarr:
        :class:`~mmpack._src.store.backends._lazy_stripes.LazyStripes`) fetches them here,
        :class:`~mmpack.errors.FormatError` naming a stripe that fails.  The default does
        nothing (the offsets are mapped whole)."""
        return None

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the flat array (bounds already validated).  The default
        is the one range through :meth:`read_ranges`, its answer sliced (a view of the buffer
        that returns); a backend with a cheaper single read, or one that must copy, overrides
        it."""
        one = np.array([start, max(0, stop - start)], dtype=np.int64)
        src, at = self.read_ranges(one[:1], one[1:])
        return src[int(at[0]) : int(at[0]) + int(one[1])]

    @abc.abstractmethod
    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Many flat ranges at once; see the package docstring for the contract."""

    # ------------------------------------------------------------------ access pattern (optional)
    def advise(self, pattern: str) -> str:
        """Declare how the token data will be read next (``"random"``, ``"sequential"`` or
        ``"normal"``) and return the previous pattern.  Only a hint: a backend without read-ahead
        to tune (Zarr) records it and changes nothing."""
        previous = getattr(self, "_pattern", "normal")
        self._pattern = pattern
        return previous

    def resident(self, positions: np.ndarray) -> bool:
        """Whether reading the tokens at ``positions`` (int64, a few sampled flat positions)
        needs no I/O, as far as the backend can tell cheaply.  The default says False: a
        backend that cannot tell lets :meth:`prefetch` decide."""
        return False

    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """Ask for flat ranges ``[starts[k], starts[k] + lengths[k])`` (validated int64 arrays)
        to be fetched ahead of the reads that will follow; return the number of requests
        issued.  Must not block on the data and must not change what any read returns.  The
        default does nothing (returns 0)."""
        return 0

    def prefetch_range(self, start: int, stop: int) -> int:
        """:meth:`prefetch` of the one flat range ``[start, stop)`` (validated ints)."""
        one = np.array([start, stop - start], dtype=np.int64)
        return self.prefetch(one[:1], one[1:])

    def read_file(self, name: str) -> bytes:
        """The bytes of the file ``name`` that the store's build attached (a plain name its
        metadata lists, e.g. ``tokenizer.json``); local layouts keep it in the store folder."""
        return (self.path / name).read_bytes()

    def raw_bytes(self, name: str, start: int, stop: int) -> bytes:
        """Little-endian bytes ``[start, stop)`` of array ``name`` ("tokens" or "offsets"),
        for checksum verification."""
        arr = self.offsets if name == "offsets" else None
        if arr is not None and stop > start:
            stripe = self.meta.block_bytes
            self.load_offsets(start // stripe, (stop - 1) // stripe + 1)
        itemsize = 8 if name == "offsets" else self.meta.dtype.itemsize
        first, last = start // itemsize, -(-stop // itemsize)
        if arr is not None:
            chunk = np.ascontiguousarray(arr[first:last])
        else:
            chunk = np.ascontiguousarray(self.read_range(first, last))
        skip = start - first * itemsize
        return chunk.view(np.uint8)[skip : skip + (stop - start)].tobytes()
