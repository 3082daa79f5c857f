"""The token store: every document's tokens in one flat array, plus a cumulative-length index.

A store is opened read-only by memory mapping (:mod:`mmpack.store.backends`): opening reads only the
metadata and checks it against the files (sizes, ``offsets`` starting at 0, never decreasing,
ending at ``num_tokens``), so it costs milliseconds whatever the corpus; ``verify()`` recomputes
the block checksums.  Stores are written by :mod:`mmpack.store.writer`.

Opt-in verification on read (``open_store(path, verify_reads=True)``): the offsets' checksums are
checked at open, and each 16 MiB block of tokens the first time a read touches it (one CRC-32 of
the block, ~10 ms; then a bitmap lookup).  Views then read through :meth:`TokenStore.read_ranges`
(``store.tokens`` is None), so every token they return comes from a verified block.  Measured
(``python -m benchmarks.trust_costs verify_reads``, 100M uint16 tokens, batches of 64 random
windows of 2048, on a loaded 2-core VM): 0.125-0.144 ms per batch against 0.101-0.122 ms for the
plain mapping (1.03-1.42x), the twelve block checks spread over the first batches (a full
``verify()`` of the same 200 MB: 0.29-0.56 s).

Cold data: the token mapping is advised for random access at open (a page fault then reads its
own page, not an 8 MiB read-ahead window); :meth:`TokenStore.verify` and iteration scan with
read-ahead; :meth:`TokenStore.prefetch` queues many ranges' reads at once.  Measured by
``benchmarks/bench_cold.py`` (see :mod:`mmpack.store.backends._memmap`).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.core.validation import check_index, check_int
from mmpack.errors import FormatError, MmpackError, StateMismatchError, StoreNotFoundError
from mmpack.store.backends import Backend, get_backend
from mmpack.store.backends._memmap import MemmapBackend
from mmpack.store.backends._zarr import ZarrBackend
from mmpack.store.format import StoreMeta

__all__ = ["TokenStore", "open_store"]

_PATTERNS = ("normal", "random", "sequential")
_SCAN_AHEAD_BYTES = 1 << 24  # kept requested ahead of a scan by __iter__
_SCAN_CHUNK_BYTES = 1 << 21  # per request (several in flight; one WILLNEED reads <= 8 MiB here)


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
        verify_reads: bool = False,
    ) -> None:
        self._path = path
        self._meta = meta
        self._raw_meta = raw_meta
        self._backend: Backend = (
            backend if backend is not None else get_backend(meta.backend)(path, meta)
        )
        self._location = location if location is not None else str(path)
        self._cache_dir = cache_dir
        self._open_options = dict(open_options or {})
        self._doc_lens: np.ndarray | None = None
        _check_offsets(self._backend.offsets, meta, path)
        self._verify_reads = bool(verify_reads)
        self._verified = np.zeros(len(meta.tokens_crc32) if verify_reads else 0, dtype=bool)
        if verify_reads:
            for b in range(len(meta.offsets_crc32)):
                self._check_block("offsets", b)

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
    def verify_reads(self) -> bool:
        """Whether each token block is checksummed the first time it is read."""
        return self._verify_reads

    @property
    def tokens(self) -> np.ndarray | None:
        """The whole flat token array as a read-only mapping (memmap backend, without
        ``verify_reads``), else None."""
        if self._verify_reads:
            return None  # every read must pass through _verify_ranges
        return getattr(self._backend, "tokens", None)

    # ----------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return self._meta.num_docs

    def __getitem__(self, j: int) -> np.ndarray:
        j = check_index(j, self._meta.num_docs, "document")
        lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
        if self._verify_reads:
            self._verify_span(lo, hi)
        return self._backend.read_range(lo, hi)

    def __iter__(self) -> Iterator[np.ndarray]:
        # A scan: keep the next _SCAN_AHEAD_BYTES requested ahead of the documents being read,
        # _SCAN_CHUNK_BYTES per request (the mapping is advised for random access, so faults
        # alone would read page by page on cold data).  One madvise per 2 MiB read.
        offsets = self.offsets
        chunk = max(1, _SCAN_CHUNK_BYTES // self.dtype.itemsize)
        distance = max(1, _SCAN_AHEAD_BYTES // self.dtype.itemsize)
        ahead = 0  # tokens [0, ahead) have been requested
        for j in range(len(self)):
            end = int(offsets[j + 1])
            while end + distance > ahead and ahead < self.num_tokens:
                start = max(ahead, int(offsets[j]))
                ahead = min(self.num_tokens, start + chunk)
                self._backend.prefetch(np.array([start]), np.array([ahead - start]))
            yield self[j]

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Flat tokens ``[start, stop)``; bounds are checked."""
        if not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in (start, stop)
        ):
            raise TypeError(f"start and stop must be integers, got {start!r} and {stop!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) is outside [0, {self.num_tokens}]")
        if self._verify_reads:
            self._verify_span(start, stop)
        return self._backend.read_range(start, stop)

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        if self._verify_reads and len(starts):
            self._verify_ranges(np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
        return self._backend.read_ranges(starts, lengths)

    # ----------------------------------------------------------------------------- verify_reads
    def _verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Checksum every not yet verified token block that ranges ``[starts, starts+lengths)``
        touch (ranges are short next to a block: usually one or two blocks each)."""
        keep = lengths > 0
        if not keep.all():
            starts, lengths = starts[keep], lengths[keep]
        if not starts.size:
            return
        per_block = self._meta.block_bytes // self._meta.dtype.itemsize
        first = starts // per_block
        last = (starts + lengths - 1) // per_block
        touched = np.unique(np.concatenate([first, last]))
        todo = touched[~self._verified[touched]]
        for b in todo.tolist():
            self._verify_token_block(b)
        for f, last_b in zip(first[last - first > 1].tolist(), last[last - first > 1].tolist()):
            self._verify_span(f * per_block, (last_b + 1) * per_block)  # a range over 3+ blocks

    def _verify_span(self, start: int, stop: int) -> None:
        if stop <= start:
            return
        per_block = self._meta.block_bytes // self._meta.dtype.itemsize
        for b in range(start // per_block, (stop - 1) // per_block + 1):
            if not self._verified[b]:
                self._verify_token_block(b)

    def _verify_token_block(self, b: int) -> None:
        self._check_block("tokens", b)
        self._verified[b] = True

    def _check_block(self, name: str, b: int) -> int:
        """CRC-32 block ``b`` of array ``name``; :class:`FormatError` naming it on a mismatch.
        Returns the block's size in bytes."""
        meta = self._meta
        if name == "offsets":
            nbytes, crcs = (meta.num_docs + 1) * 8, meta.offsets_crc32
        else:
            nbytes, crcs = meta.num_tokens * meta.dtype.itemsize, meta.tokens_crc32
        lo = b * meta.block_bytes
        hi = min(nbytes, lo + meta.block_bytes)
        got = zlib.crc32(self._backend.raw_bytes(name, lo, hi))
        if got != crcs[b]:
            raise FormatError(
                f"{self._path}: {name} block {b} (bytes {lo}..{hi}) fails its checksum "
                f"(stored {crcs[b]:#010x}, computed {got:#010x}): the data was modified "
                "or corrupted; rebuild the store"
            )
        return hi - lo

    # ----------------------------------------------------------------------------- cold data
    def advise(self, pattern: str) -> str:
        """Declare how the tokens will be read: ``"random"`` (the default after opening: a page
        fault reads only its own page), ``"sequential"`` (large read-ahead, for scans) or
        ``"normal"`` (the kernel's default); returns the previous pattern, so a scan can restore
        it.  A hint that changes speed only, never data; it applies to this process's mapping.
        """
        if pattern not in _PATTERNS:
            raise ValueError(f"pattern must be one of {_PATTERNS}, got {pattern!r}")
        return self._backend.advise(pattern)

    def resident(self, positions: Any) -> bool:
        """Whether the tokens at a few of ``positions`` (flat token positions; the first few are
        sampled) are in memory, i.e. a read of them needs no I/O.  The cheap test the views ask
        before computing and requesting a batch's exact ranges (~2 us per sampled page for the
        memmap backend); a backend that cannot tell answers False."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        return bool(self._backend.resident(pos))

    def prefetch(self, starts: Any, lengths: Any) -> int:
        """Request flat token ranges ``[starts[k], starts[k] + lengths[k])`` ahead of reading
        them, without waiting for the data: the memmap backend issues one
        ``madvise(MADV_WILLNEED)`` per merged page range, so a batch's pages are read
        concurrently instead of one fault at a time; a remote backend starts fetching the
        ranges' checked blocks in the background.

        Parameters
        ----------
        starts, lengths : array_like of int, shape (k,)
            Ranges inside ``[0, num_tokens]``.

        Returns
        -------
        int
            The number of requests issued (0 when the backend has nothing to do).
        """
        s = np.asarray(starts)
        n = np.asarray(lengths)
        if s.shape == n.shape == (1,) and s.dtype == n.dtype == np.int64:  # a single read, fast
            a, b = int(s[0]), int(n[0])
            if a < 0 or b < 0 or a + b > self.num_tokens:
                raise IndexError(f"prefetch range [{a}, {a + b}) is outside [0, {self.num_tokens}]")
            return int(self._backend.prefetch(s, n))
        if s.ndim != 1 or n.shape != s.shape:
            raise ValueError(
                f"starts and lengths must be 1-D of one length, got shapes {s.shape} and {n.shape}"
            )
        if s.size == 0:
            return 0
        if s.dtype.kind not in "iu" or n.dtype.kind not in "iu":
            raise TypeError(f"starts and lengths must be integers, got {s.dtype} and {n.dtype}")
        s = s.astype(np.int64)
        n = n.astype(np.int64)
        if s.min() < 0 or n.min() < 0 or int((s + n).max()) > self.num_tokens:
            raise IndexError(
                f"a prefetch range is outside the store's [0, {self.num_tokens}] tokens"
            )
        return int(self._backend.prefetch(s, n))

    def prefetch_range(self, start: int, stop: int) -> int:
        """:meth:`prefetch` of the one flat range ``[start, stop)``, for single reads (no arrays
        to build; bounds are checked)."""
        if type(start) is not int or type(stop) is not int:
            start, stop = check_int(start, "start"), check_int(stop, "stop")
        if not 0 <= start <= stop <= self._meta.num_tokens:
            raise IndexError(f"prefetch range [{start}, {stop}) is outside [0, {self.num_tokens}]")
        return int(self._backend.prefetch_range(start, stop))

    # ----------------------------------------------------------------------------- integrity
    def verify(self) -> dict[str, int]:
        """Recompute every block checksum; raise :class:`FormatError` naming the first bad block.

        Returns a summary ``{"blocks": ..., "bytes": ...}`` when everything matches.
        """
        previous = self._backend.advise("sequential")  # a scan: full read-ahead
        try:
            return self._verify()
        finally:
            self._backend.advise(previous)

    def _verify(self) -> dict[str, int]:
        meta = self._meta
        _check_offsets(self.offsets, meta, self._path)
        checked_blocks = checked_bytes = 0
        for name, crcs in (("offsets", meta.offsets_crc32), ("tokens", meta.tokens_crc32)):
            for b in range(len(crcs)):
                checked_bytes += self._check_block(name, b)
                checked_blocks += 1
        return {"blocks": checked_blocks, "bytes": checked_bytes}

    # ----------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        options = dict(self._open_options)
        if self._verify_reads:
            options["verify_reads"] = True
        return {"location": self._location, "meta": self._raw_meta, "options": options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        location = state.get("location", state.get("path"))
        if location is None:
            raise TypeError("cannot unpickle a TokenStore: the pickled state has no location")
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
            f"TokenStore({self._location!r}, backend={self.backend!r}, docs={len(self)}, "
            f"tokens={self.num_tokens}, dtype={self.dtype.name})"
        )


# --------------------------------------------------------------------------------- opening
OPENERS: dict[str, str] = {
    "url": "mmpack.store.remote.opener:open_url",
    "parts": "mmpack.store.parts:open_join",
    "megatron": "mmpack.store.foreign.megatron:open_megatron",
    "eos-separated": "mmpack.store.foreign.eos_separated:open_eos_separated",
}
"""Openers of stores that are not a local mmpack folder, by kind: ``"url"`` for locations with a
scheme (``s3://``, ``gs://``, ``az://``, ``file://``, ``https://``), and one entry per
``format=`` name.  Each value is ``"module:function"``, imported on first use; the function takes
``(location, **options)`` and returns a :class:`TokenStore`.  Adding a kind of store is one line
here plus its module."""

DETECTORS: tuple[str, ...] = (
    "mmpack.store.parts:detect_join",
    "mmpack.store.foreign.megatron:detect_megatron",
    "mmpack.store.foreign.eos_separated:detect_npy",
)
"""``"module:function"`` entries asked, in order, what a local path that holds no mmpack store
is: each returns a ``format=`` name of :data:`OPENERS` or None."""


def open_store(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    verify_reads: bool = False,
    **options: Any,
) -> TokenStore:
    """Open the store at ``path`` read-only.

    Opening checks the structure (metadata, file types and sizes, the offsets, Zarr chunks),
    never the tokens' content: that is :meth:`TokenStore.verify`, or, with ``verify_reads=True``,
    each 16 MiB token block the first time a read touches it (the offsets at open).

    Parameters
    ----------
    path : str or os.PathLike
        A local store folder, or a URL (see :data:`OPENERS`).
    format : str, optional
        ``None`` (default) detects the kind of store; ``"mmpack"`` requires mmpack's own layout;
        other names open stores written by other tools in place (see :data:`OPENERS`).
    verify_reads : bool
        Local mmpack stores: check each token block's checksum the first time a read touches it.
    **options
        Passed to the opener of that kind (e.g. ``storage_options`` for a URL).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``.
    FormatError
        ``path`` is not a store, or its metadata disagrees with its files.
    """
    if verify_reads:
        options["verify_reads"] = True  # every opener decides whether it can
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
    options.pop("verify_reads", None)
    if options:
        raise TypeError(f"unexpected options for a local mmpack store: {sorted(options)}")
    # Absolute now: a later os.chdir must not point the store (its Zarr chunks, its plan cache)
    # at another folder.  Links are kept (not resolved): the path names what the user named.
    path = Path(os.path.abspath(path))
    # A rebuild with overwrite=True may swap the folder between reading the metadata and
    # mapping the files: re-read the metadata afterwards and retry if it changed.
    for _ in range(5):
        raw = _read_raw_meta(path)
        meta = StoreMeta.from_json(raw, path)
        try:
            store = TokenStore(path, meta, raw, verify_reads=bool(verify_reads))
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
    # A missing path still goes to the detectors: a Megatron prefix is not itself a file.
    return (path / "mmpack.json").exists() or (path / "zarr.json").exists()


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
        raise FormatError(
            f"{path}: offsets has shape {offsets.shape}, expected ({meta.num_docs + 1},)"
        )
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
