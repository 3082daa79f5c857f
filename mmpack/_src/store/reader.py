"""The token store: every document's tokens in one flat array, plus a cumulative-length index.

A store is opened read-only by memory mapping (:mod:`mmpack._src.store.backends`): opening reads only the
metadata and checks it against the files (sizes, ``offsets`` starting at 0 and ending at
``num_tokens``, the first and last pages of ``offsets`` never decreasing), so it costs
milliseconds whatever the corpus; every other page of ``offsets`` is made present (a remote or
Zarr store fetches it then) and checked the first time a read uses it
(:class:`~mmpack._src.store.offsets_pages.OffsetsPages`); ``verify()`` recomputes the block
checksums.  Stores are written by :mod:`mmpack._src.store.writer`.

Opt-in verification on read (``open_store(path, verify_reads=True)``): each page of the offsets is
checksummed when its structure is checked, each 16 MiB block of tokens the first time a read
touches it.  Views then read through :meth:`TokenStore.read_ranges` (``store.tokens`` is None), so
every token they return comes from a verified block (cost: ``python -m benchmarks.trust_costs
verify_reads``).  Kinds of store without block checksums of their own pass a ``read_checker``
(:class:`~mmpack._src.store.integrity.ReadChecker`): a join's parts check their own blocks, another
tool's files are checked against their checksum sidecar.  :func:`open_store` dispatches other
locations to the adapters' openers (:mod:`mmpack._src.store.registry`).  Cold data: the mapping is
advised for random access; :meth:`TokenStore.verify` and iteration scan with read-ahead;
:meth:`TokenStore.prefetch` queues many ranges' reads at once (``benchmarks/bench_cold.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.core.validation import check_index, check_int
from mmpack._src.store.backends import Backend, get_backend
from mmpack._src.store.documents import DocumentSets
from mmpack._src.store.fields import fields_nbytes, verify_fields
from mmpack._src.store.format import LOSS_MASK_STORE, RECORD_KEYS, StoreMeta
from mmpack._src.store.integrity import ReadChecker, StripeChecker, check_offsets
from mmpack._src.store.lossmask import check_mask_store
from mmpack._src.store.offsets_pages import OffsetsPages, PagedOffsets
from mmpack._src.store.opening import (
    as_path,
    call_opener,
    is_mmpack_folder,
    open_while_unchanged,
    read_raw_meta,
)
from mmpack._src.store.registry import DETECTORS, load
from mmpack._src.store.subset import ParentChecks, SubsetBackend
from mmpack.errors import FormatError, StateMismatchError, StoreNotFoundError

__all__ = ["TokenStore", "open_store", "reopen_pickled"]

_PATTERNS = ("normal", "random", "sequential")

_SCAN_AHEAD_BYTES = 1 << 24  # kept requested ahead of a scan by __iter__
_SCAN_CHUNK_BYTES = 1 << 21  # per request (several in flight; one WILLNEED reads <= 8 MiB here)


class TokenStore(DocumentSets):
    """A read-only, memory-mapped token store.  Create with :func:`build`, open with
    :func:`open_store` (``mmpack.open``).

    ``len(store)`` is the number of documents, ``store[j]`` document ``j`` as a 1-D array of
    ``store.dtype`` (a view of the mapping for the memmap backend).  Pickling keeps only the path
    and the metadata; the receiving process maps the files again and refuses a store that was
    rebuilt in between.  Fields and subsets: :class:`~mmpack._src.store.documents.DocumentSets`;
    a subset is a ``TokenStore`` over a :class:`~mmpack._src.store.subset.SubsetBackend`, which
    reads its parent's tokens (it pickles as its parent, ids and split depth).
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
        read_checker: ReadChecker | None = None,
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
        self._loss_mask: TokenStore | None = None
        self._verify_reads = bool(verify_reads)
        own = self._verify_reads and read_checker is None
        self._blocks = StripeChecker(path, meta, self._backend, track_reads=own)
        # what checks a read's blocks first: this store's checksums, or the kind's own checker
        self._reads: ReadChecker = self._blocks if read_checker is None else read_checker
        # the offsets' ends and first and last pages now, every other page on first use
        self._pages = OffsetsPages(
            path,
            meta,
            self._backend.offsets,
            self._blocks if own else None,
            self._backend.load_offsets,
        )

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
        """int64, shape (num_docs + 1,), read-only: document j is ``tokens[offsets[j]:offsets[j+1]]``.

        The whole index, checked in full on this first use (an open checks only its ends; a
        read of a few documents, :meth:`doc_bounds`, only its own pages)."""
        self._pages.check_all()
        return self._backend.offsets

    def doc_bounds(self, lo: int, hi: int) -> np.ndarray:
        """``offsets[lo : hi + 1]`` (int64, shape (hi - lo + 1,), read-only): the bounds of
        documents ``lo..hi-1``, after checking (once) the pages of the index they lie on, not
        the whole index (``0 <= lo <= hi <= num_docs``, validated by the caller)."""
        self._pages.check_entries(lo, hi)
        return self._backend.offsets[lo : hi + 1]

    @property
    def mapped_offsets(self) -> np.ndarray:
        """The offsets as mapped, pages not checked: for a kernel that reads only entries whose
        pages were checked first (:meth:`doc_bounds`).  A store that fills its offsets lazily
        (remote, Zarr) holds zeros on pages never checked: search with :attr:`paged_offsets`."""
        return self._backend.offsets

    @property
    def paged_offsets(self) -> PagedOffsets:
        """The offsets for a binary search: ``searchsorted`` of one value and int or slice
        indexing, each checking (once) only the pages it reads (a search probes about
        ``log2(pages)`` pages); see :class:`~mmpack._src.store.offsets_pages.PagedOffsets`."""
        return PagedOffsets(self._pages, self._backend.offsets)

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
        """16 hex digits identifying the content (see :mod:`mmpack._src.store.format`); a
        subset's hashes its parent's and its :attr:`parent_doc_ids`."""
        return self._meta.fingerprint

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata record as stored."""
        return dict(self._raw_meta)

    @property
    def extra(self) -> dict[str, Any]:
        """The optional sections of the metadata record (``"tokenizer"``, ``"provenance"``,
        whatever a builder added through :attr:`StoreWriter.extra
        <mmpack.store.StoreWriter.extra>`): the record without the keys of the store's
        own structure (what a copy carries over)."""
        return {k: v for k, v in self._raw_meta.items() if k not in RECORD_KEYS}

    @property
    def attached_files(self) -> tuple[str, ...]:
        """The files the store's build attached (``tokenizer.json``...), sorted; read them with
        :meth:`read_attached`."""
        return tuple(getattr(self._meta, "files", ()))

    def read_attached(self, name: str) -> bytes:
        """The bytes of the attached file ``name`` (one of :attr:`attached_files`), from the
        store folder or the store's objects; ``KeyError`` if the store has none of that name."""
        if name not in self.attached_files:
            raise KeyError(
                f"{self._location} has no attached file {name!r} (it has "
                f"{list(self.attached_files)})"
            )
        return self._backend.read_file(name)

    @property
    def open_options(self) -> dict[str, Any]:
        """The options this store was opened with besides its location (what a pickle reopens
        it with, e.g. a remote store's ``storage_options``); never written to disk by mmpack."""
        return dict(self._open_options)

    @property
    def verify_reads(self) -> bool:
        """Whether each token block is checksummed the first time it is read."""
        return self._verify_reads

    @property
    def tokens(self) -> np.ndarray | None:
        """The whole flat token array as a read-only mapping (memmap backend, without
        ``verify_reads``), else None."""
        if self._verify_reads:
            return None  # every read must pass through the block checker
        return self._backend.tokens

    @property
    def remote(self) -> bool:
        """Whether the tokens live on object storage (the backend's ``remote``)."""
        return bool(self._backend.remote)

    @property
    def span_fetcher(self) -> Any:
        """The backend's fetcher of whole spans into the node cache (a remote store with one:
        :class:`mmpack._src.remote.spans.SpanFetcher`, driven by ``mmpack._src.torch.block_fetch``)."""
        return self._backend.span_fetcher

    def mapping(self) -> np.ndarray | None:
        """The backend's whole mapped token array, also with ``verify_reads`` (where
        :attr:`tokens` hides it): for a reader that passes every range through
        :meth:`check_reads` before reading it from the mapping (a join).  None when the backend
        does not map its tokens."""
        return self._backend.tokens

    def check_reads(self, starts: np.ndarray, lengths: np.ndarray) -> bool:
        """With ``verify_reads``, check (once) every block that flat ranges ``[starts, starts +
        lengths)`` (int64, shape (k,), validated) touch; return whether every block of the store
        is now checked (always True without ``verify_reads``)."""
        if not self._verify_reads:
            return True
        if len(starts):
            self._reads.verify_ranges(starts, lengths)
        return self._reads.all_checked()

    @property
    def has_loss_mask(self) -> bool:
        """Whether the store holds a per-token loss mask (from its metadata; nothing is read)."""
        return getattr(self._meta, "loss_mask", None) is not None

    @property
    def loss_mask(self) -> TokenStore | None:
        """The per-token loss mask, or None: a store of ``uint8`` tokens, 1 where the token is
        a target and 0 where it is not, with this store's offsets (``store.loss_mask[j]`` is
        document j's mask; ``read_ranges`` reads it as the tokens are read).  Opened on first
        use, with this store's options, and checked against the fingerprint the metadata names
        (:func:`~mmpack._src.store.lossmask.check_mask_store`).  A subset's is its parent's,
        restricted to the subset's documents."""
        if self._loss_mask is None and self.has_loss_mask:
            self._loss_mask = self._open_loss_mask()
        return self._loss_mask

    def _open_loss_mask(self) -> TokenStore:
        """Open the loss mask store that the metadata names (see :attr:`loss_mask`)."""
        if self.parent is not None:
            mask = self.parent.loss_mask
            return self._over(mask, self.parent_doc_ids, 0)  # type: ignore[arg-type]
        location = self._location
        where: str | Path = (
            location.rstrip("/") + "/" + LOSS_MASK_STORE
            if "://" in location
            else self._path / LOSS_MASK_STORE
        )
        options = dict(self._open_options)
        if self._verify_reads:
            options["verify_reads"] = True
        try:
            mask = open_store(where, format="mmpack", **options)
        except StoreNotFoundError:
            raise FormatError(
                f"{location}: its loss mask store {str(where)!r} is missing: the store is "
                "incomplete; rebuild it"
            ) from None
        check_mask_store(self, mask, self._meta.loss_mask)  # type: ignore[arg-type]
        return mask

    # ----------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return self._meta.num_docs

    def __getitem__(self, j: int) -> np.ndarray:
        j = check_index(j, self._meta.num_docs, "document")
        bounds = self.doc_bounds(j, j + 1)
        lo, hi = int(bounds[0]), int(bounds[1])
        if self._verify_reads:
            self._reads.verify_span(lo, hi)
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
            self._reads.verify_span(start, stop)
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
            self._reads.verify_ranges(np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
        return self._backend.read_ranges(starts, lengths)

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
        ranges' checked blocks in the background.  ``starts``, ``lengths``: array_like of int,
        shape (k,), ranges inside ``[0, num_tokens]``; returns the number of requests issued (0
        when the backend has nothing to do)."""
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
    @property
    def nbytes(self) -> int:
        """Bytes of the store's arrays: ``num_tokens * itemsize`` of tokens, ``8 * (num_docs +
        1)`` of offsets and ``num_docs * itemsize`` of each per-document field's column (what
        :meth:`verify` reads and a copy moves, the loss mask's own store apart)."""
        fields = fields_nbytes(getattr(self._meta, "fields", ()), len(self))
        return self.num_tokens * self.dtype.itemsize + (len(self) + 1) * 8 + fields

    def verify(self, *, progress: Any = False) -> dict[str, int]:
        """Recompute every block's and field column's checksum; raise :class:`FormatError`
        naming the first bad one.

        Parameters
        ----------
        progress : bool, None or Progress
            A bar over the :attr:`nbytes` checked, with an ETA
            (:func:`mmpack._src.core.progress.progress_bar`): none by default; ``None`` when stderr
            is a terminal.

        Returns
        -------
        dict
            ``{"blocks": ..., "bytes": ...}`` checked (the field columns' bytes and the loss
            mask's included), when everything matches.  A subset verifies its parent (it
            holds no data of its own).
        """
        if self.parent is not None:
            return self.parent.verify(progress=progress)
        previous = self._backend.advise("sequential")  # a scan: full read-ahead
        try:
            with progress_bar(progress, self.nbytes, desc="verifying") as bar:
                check_offsets(self.offsets, self._meta, self._path)
                done = self._blocks.check_all(bar.update)
                specs = getattr(self._meta, "fields", ())  # each column against its CRC-32
                done["bytes"] += verify_fields(self._backend, specs, len(self), bar.update)
            mask = self.loss_mask
            if mask is not None:  # the mask store: its own offsets check and block digests
                extra = mask.verify()
                done = {k: done[k] + extra[k] for k in done}
            return done
        finally:
            self._backend.advise(previous)

    # ----------------------------------------------------------------------------- subsets
    @staticmethod
    def _over(parent: TokenStore, ids: np.ndarray, split_depth: int) -> TokenStore:
        """A store over documents ``ids`` (int64, sorted, unique) of ``parent`` (not itself a
        subset): a subset (:class:`~mmpack._src.store.subset.SubsetBackend`)."""
        backend = SubsetBackend(parent, ids, split_depth)
        return TokenStore(
            parent.path,
            backend.meta,
            backend.record,
            backend,
            location=parent.location,
            cache_dir=parent.cache_dir,
            open_options=parent.open_options,
            verify_reads=parent.verify_reads,
            read_checker=ParentChecks(),
        )

    # ----------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        if self.parent is not None:  # a subset: its parent, ids and split depth
            ids = np.asarray(self.parent_doc_ids)
            return {"parent": self.parent, "ids": ids, "depth": self.split_depth}
        options = dict(self._open_options)
        if self._verify_reads:
            options["verify_reads"] = True
        return {"location": self._location, "meta": self._raw_meta, "options": options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "parent" in state:
            ids = np.array(state["ids"], dtype=np.int64)
            self.__dict__.update(self._over(state["parent"], ids, int(state["depth"])).__dict__)
            return
        location = state.get("location", state.get("path"))
        if location is None:
            raise TypeError("cannot unpickle a TokenStore: the pickled state has no location")
        path = Path(location) if "://" not in str(location) else Path(".")
        pickled = StoreMeta.from_json(state["meta"], path)
        current = reopen_pickled(
            location, pickled.fingerprint, "the store", "was rebuilt", **state.get("options", {})
        )
        self.__dict__.update(current.__dict__)

    def __repr__(self) -> str:
        parent = self.parent
        if parent is not None:
            return (
                f"TokenStore({self._location!r}, subset, docs={len(self)} of {len(parent)}, "
                f"tokens={self.num_tokens}, dtype={self.dtype.name})"
            )
        return (
            f"TokenStore({self._location!r}, backend={self.backend!r}, docs={len(self)}, "
            f"tokens={self.num_tokens}, dtype={self.dtype.name})"
        )


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
    each 16 MiB token block and offsets page the first time a read touches it.

    Parameters
    ----------
    path : str or os.PathLike
        A local store folder, or a URL (see :data:`mmpack._src.store.registry.OPENERS`).
    format : str, optional
        ``None`` (default) detects the kind of store; ``"mmpack"`` requires mmpack's own layout;
        other names open stores written by other tools in place (see
        :data:`mmpack._src.store.registry.OPENERS`).
    verify_reads : bool
        Check each token block the first time a read touches it: a local mmpack store against
        its checksums, a join through its parts, another tool's files against their checksum
        sidecar (:mod:`mmpack._src.formats.sidecar`).  Remote stores check every block they fetch
        and take no such option.
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
        return call_opener("url", path, format=format, **options)
    if format not in (None, "mmpack"):
        return call_opener(format, path, **options)
    path = as_path(path, "path")
    if format is None and not is_mmpack_folder(path):
        for entry in DETECTORS:
            kind = load(entry)(path)
            if kind is not None:
                return call_opener(kind, path, **options)
    options.pop("verify_reads", None)
    if options:
        raise TypeError(f"unexpected options for a local mmpack store: {sorted(options)}")
    # Absolute now: a later os.chdir must not point the store (its Zarr chunks, its plan cache)
    # at another folder.  Links are kept (not resolved): the path names what the user named.
    path = Path(os.path.abspath(path))
    # A rebuild with overwrite=True may swap the folder between reading the metadata and
    # mapping the files: re-read the metadata afterwards and retry if it changed.
    return open_while_unchanged(
        path,
        read_raw_meta,
        lambda raw: TokenStore(
            path, StoreMeta.from_json(raw, path), raw, verify_reads=bool(verify_reads)
        ),
        recheck=True,
    )


def reopen_pickled(
    location: Any, fingerprint: str, what: str, change: str, /, **options: Any
) -> TokenStore:
    """Reopen a pickled store at ``location`` (``open_store(location, **options)``) and refuse it
    unless its fingerprint is still ``fingerprint``.

    Raises
    ------
    StateMismatchError
        The content changed since pickling; the message reads ``"{what} at {location} {change}
        after this object was pickled (fingerprint <then> then, <now> now)"``.
    """
    current = open_store(location, **options)
    if current.fingerprint != fingerprint:
        raise StateMismatchError(
            f"{what} at {location} {change} after this object was pickled "
            f"(fingerprint {fingerprint} then, {current.fingerprint} now)"
        )
    return current
