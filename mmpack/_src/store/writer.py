"""Building a token store: a streaming, atomic writer.

Documents stream from any iterable in chunks (:mod:`mmpack._src.store.gather`); a chunk in the
store's dtype is written as it is (a list of arrays straight from the arrays), others go through
one numba pass that converts, checks every token against the token rule and fills a reused
block; a writer thread writes, a hash thread digests (XXH64) each block of the file
(:mod:`mmpack._src.store.tokenfile`).  Memory is bounded by two blocks (32 MiB) and a chunk (about a
quarter of ``buffer_tokens``), never by the corpus.  With ``dtype=None`` the
file starts as uint8 and is widened in place (one sequential rewrite) if a later token needs
more bits, at most three times.  The metadata is written last, the files are fsynced, the
finished folder is opened as a store and renamed onto the target (:mod:`mmpack._src.store.publish`:
temporary folders and their locks, the overwrite guard, the ``renameat2(RENAME_EXCHANGE)``
swap), so an interrupted build never leaves anything that opens as a store, readers of the
previous store keep their mappings, and ``overwrite`` replaces only an mmpack store or an empty
folder.  A bad document raises from the ``add`` that receives it (the documents before it are
kept); every failure removes the temporary folder.  ``shuffle_docs``: the documents are stored
in a keyed order (:mod:`mmpack._src.store.doc_order`, which states the algorithm and its cost).

Measured against ``ndarray.tofile`` of the same bytes in the same run: the benchmarks page's build
table (``docs/benchmarks.md``, from ``python -m benchmarks.bench_store``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.permutation_keys import SeedLike
from mmpack._src.store import doc_order
from mmpack._src.store.backends import OFFSETS_FILE, TOKENS_FILE, get_backend
from mmpack._src.store.fields import check_fields, commit_fields
from mmpack._src.store.format import (
    LOSS_MASK_STORE,
    OFFSETS_DTYPE,
    STRIPE_BYTES,
    StoreMeta,
    StripeChecksum,
    normalize_token_dtype,
    plain_file_name,
)
from mmpack._src.store.gather import Arrays, DocChunks
from mmpack._src.store.lossmask import as_loss_mask, mix_error, split_document
from mmpack._src.store.opening import as_path
from mmpack._src.store.publish import (
    LAYOUT_ENTRIES,
    LOCK_FILE,
    check_replaceable,
    check_target,
    fsync_dir,
    stage_folder,
    write_extra,
)
from mmpack._src.store.publish import check_new_store as _check_new_store
from mmpack._src.store.publish import swap_into_place as _swap_into_place
from mmpack._src.store.reader import TokenStore, open_store
from mmpack._src.store.registry import WRITERS, load
from mmpack._src.store.tokenfile import TokenFile
from mmpack._src.store.tokens import (
    MAX_TOKEN,
    as_token_array,
    checked_lengths,
    concat_docs,
    concat_plain,
    plain_lengths,
    validate_tokens,
)

__all__ = ["MAX_TOKEN", "StoreWriter", "build", "check_replaceable", "store_writer"]

_DEFAULT_BUFFER_TOKENS = 1 << 23
_CHUNK_DOCS = 8192  # documents per chunk at most (lists of arrays: no copy, fewer passes)
# Names a layout's own entries take (either backend): never attached.
_RESERVED = frozenset().union(*LAYOUT_ENTRIES.values())


# --------------------------------------------------------------------------------- building
def build(
    path: str | os.PathLike[str],
    docs: Iterable[Any],
    *,
    dtype: Any = None,
    backend: str = "memmap",
    overwrite: bool = False,
    buffer_tokens: int = _DEFAULT_BUFFER_TOKENS,
    fsync: bool = True,
    storage_options: dict[str, Any] | None = None,
    shuffle_docs: SeedLike | None = None,
    fields: dict[str, Any] | None = None,
) -> TokenStore:
    """Build a store at ``path`` from ``docs`` and return it opened.

    Parameters
    ----------
    path : str or os.PathLike
        Target folder; must not exist unless ``overwrite=True``.  A URL (``s3://bucket/name``,
        ``file:///path``...) builds locally, then uploads (:mod:`mmpack._src.remote.writer`).
    docs : iterable of 1-D integer sequences, or of dicts
        Lists, tuples, numpy arrays, torch tensors, a generator over a corpus larger than memory.
        Empty documents are kept.  A document with a per-token loss mask is a dict
        ``{"input_ids": tokens, "loss_mask": mask}`` (``mask``: one 0/1 value per token, 1 =
        the token is a target; :mod:`mmpack._src.store.lossmask`): the store then holds the mask
        (``store.loss_mask``), and every document must have one.
    dtype : numpy dtype, optional
        Unsigned token dtype.  Default: the narrowest of uint8/16/32/64 that holds the largest
        token.
    backend : {"memmap", "zarr"}
    overwrite : bool
        Replace an existing store at ``path`` (atomically).  Only an mmpack store or an empty
        folder is replaced: anything else at ``path`` (a folder holding other files, a file, a
        symbolic link) raises ``FileExistsError`` before any document is read.
    buffer_tokens : int
        Sizes the chunks documents are taken in (about a quarter of it); with the 16 MiB block
        being written, bounds the memory used.
    fsync : bool
        Flush the files to stable storage before the rename (survives power loss too).
    storage_options : dict, optional
        For a URL target: endpoint, credentials and client settings (see
        :func:`mmpack._src.remote.opener.open_url`).
    shuffle_docs : int or tuple of int, optional
        Store the documents in a keyed random order of this seed (:mod:`mmpack._src.store.doc_order`:
        exact, O(1) extra memory, twice the token bytes on disk while the build runs, one more
        write and a random read of every document).  Default: the order of ``docs``.
    fields : dict, optional
        ``{name: values}``, one value per document: ints, floats, short strings (categories).

    Raises
    ------
    ValueError
        A negative, non-integer or too large token (>= 2**63, or beyond ``dtype``; the message
        names the document, position and value), a loss mask of another length than its
        document or with a value other than 0/1, a mix of documents with and without a loss
        mask, a field of another length, or a bad argument.  Nothing is left on disk.
    TypeError
        A document that is not a 1-D sequence of integers; a ``shuffle_docs`` that is not one.
    StoreExistsError
        ``path`` exists and ``overwrite`` is false.
    FileExistsError
        ``overwrite`` is true but ``path`` is not an mmpack store or an empty folder.
    """
    options = {"dtype": dtype, "backend": backend, "overwrite": overwrite, "fsync": fsync}
    options |= {"buffer_tokens": buffer_tokens, "shuffle_docs": shuffle_docs, "fields": fields}
    if storage_options is not None:
        options["storage_options"] = storage_options
    with store_writer(path, **options) as writer:
        if isinstance(docs, (str, bytes)):
            raise TypeError("docs must be an iterable of token sequences, not a string")
        try:
            iterator = iter(docs)
        except TypeError:
            raise TypeError(
                f"docs must be an iterable of token sequences, got {type(docs).__name__}"
            ) from None
        writer.add_many(docs if type(docs) is list or type(docs) is tuple else iterator)
    assert writer.store is not None  # set by the clean exit of the with-block
    return writer.store


def store_writer(path: str | os.PathLike[str], **kwargs: Any) -> StoreWriter:
    """A :class:`StoreWriter` for a local ``path``, or its remote twin
    (:class:`mmpack._src.remote.writer.RemoteStoreWriter`) for a URL."""
    if isinstance(path, str) and "://" in path:
        entry = WRITERS.get("url")
        if entry is None:
            raise ValueError(f"{path!r} is a URL; this mmpack writes local stores only")
        return load(entry)(path, **kwargs)
    if "storage_options" in kwargs:
        raise TypeError(f"storage_options is for URL targets; {str(path)!r} is a local path")
    return StoreWriter(path, **kwargs)


class StoreWriter:
    """Streaming, atomic writer of a store; :func:`build` is a thin loop over it.

    Use as a context manager: documents go in with :meth:`add` or :meth:`add_batch`; a clean
    exit validates the new store, commits it (rename into place) and sets ``writer.store``; an
    exception removes everything written.  A bad document raises from the :meth:`add` that
    receives it and is not stored; the writer stays usable.
    ``check``, when given, is called with the finished store opened from its temporary folder,
    right before it is published (for a URL target: opened from its uploaded objects, before
    the metadata is written); whatever it raises publishes nothing (a copy verifies itself so).
    ``shuffle_docs`` (an int or a tuple of ints) stores the documents in a keyed order: they go
    into a temporary store first, the commit rewrites them (:mod:`mmpack._src.store.doc_order`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        backend: str = "memmap",
        overwrite: bool = False,
        buffer_tokens: int = _DEFAULT_BUFFER_TOKENS,
        fsync: bool = True,
        check: Callable[[TokenStore], None] | None = None,
        shuffle_docs: SeedLike | None = None,
        fields: dict[str, Any] | None = None,
    ) -> None:
        self.shuffle_docs = doc_order.check_shuffle_docs(shuffle_docs)
        self.fields = check_fields(fields)  # written by the commit (mmpack._src.store.fields)
        self.path = Path(os.path.abspath(as_path(path, "path")))  # immune to a later chdir
        get_backend(backend)
        self.backend = backend
        self.fixed_dtype = None if dtype is None else normalize_token_dtype(dtype)
        if (
            isinstance(buffer_tokens, bool)
            or not isinstance(buffer_tokens, int)
            or buffer_tokens < 1
        ):
            raise ValueError(f"buffer_tokens must be a positive integer, got {buffer_tokens!r}")
        self.overwrite = bool(overwrite)
        self.buffer_tokens = buffer_tokens
        self.fsync = fsync
        self.check = check
        self.store: TokenStore | None = None
        self._tmp: Path | None = None
        self.extra: dict[str, Any] = {}
        """Optional sections added to the metadata record at commit (e.g. ``"tokenizer"``,
        ``"provenance"``): readers that do not know them ignore them, and they are not part of
        the fingerprint."""
        self._attached: dict[str, bytes] = {}
        self._unshuffled: StoreWriter | None = None
        self._mask: StoreWriter | None = None  # the loss mask store's writer, once a mask came

    # --------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> StoreWriter:
        check_target(self.path, self.overwrite)  # before any work: never replace a user's folder
        tmp, fd = stage_folder(self.path)  # removes dead builders' folders first
        self._tmp = tmp
        self._lock_fd: int | None = fd
        try:
            if self.shuffle_docs is None:
                self._open_files(self.fixed_dtype)
            else:  # the documents go in order into a store of its own first
                self._unshuffled = self._temporary_writer(tmp / doc_order.UNSHUFFLED).__enter__()
        except BaseException:
            self._cleanup()
            raise
        return self

    def _temporary_writer(self, path: Path) -> StoreWriter:
        """A writer of this one's settings for a store removed by the commit (never fsynced)."""
        return StoreWriter(
            path,
            dtype=self.fixed_dtype,
            buffer_tokens=self.buffer_tokens,
            fsync=False,
        )

    def _open_files(self, dtype: np.dtype | None) -> None:
        tmp = self._tmp
        assert tmp is not None
        self._tokens = TokenFile(tmp / TOKENS_FILE, open, dtype, STRIPE_BYTES)
        self._offsets_file = open(tmp / OFFSETS_FILE, "wb")
        self._offsets_crc = StripeChecksum(STRIPE_BYTES)
        self._num_docs = 0
        self._num_tokens = 0
        self._tokens.widen_hook = self._widen
        self._write_offsets(np.zeros(1, dtype=np.int64))

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        """Release everything; remove the temporary folder whatever else fails (a close that
        raises again on a full disk must not leave it behind)."""
        steps = []
        inner, self._unshuffled = self._unshuffled, None
        if inner is not None:  # its own temporary folder and lock, inside this one
            steps.append(inner._cleanup)
        mask, self._mask = getattr(self, "_mask", None), None
        if mask is not None:  # a build abandoned: the mask writer removes its own files
            steps.append(lambda: mask.__exit__(RuntimeError, None, None))
        files = (getattr(self, "_tokens", None), getattr(self, "_offsets_file", None))
        steps.extend(f.close for f in files if f is not None)
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except Exception as exc:
                first = first or exc
        try:
            if self._tmp is not None and os.path.lexists(self._tmp):
                shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        finally:
            fd = getattr(self, "_lock_fd", None)
            if fd is not None:
                self._lock_fd = None
                with contextlib.suppress(OSError):
                    os.close(fd)
        if first is not None and not isinstance(first, OSError):
            raise first

    # --------------------------------------------------------------------------- adding
    def add(self, doc: Any) -> None:
        """Append one document (a 1-D sequence of integers in ``[0, 2**63)``).

        A bad document raises here, naming it; nothing of it is stored and every document added
        before or after it is kept."""
        self.add_many((doc,))

    def add_many(self, docs: Iterable[Any]) -> None:
        """Append every document of ``docs``.

        Documents are taken in chunks (:class:`~mmpack._src.store.gather.DocChunks`), each as it
        was when the source gave it (from an iterator, a copy taken when it is yielded): a list
        of arrays in the store's dtype is written straight from the arrays; numpy arrays of one
        integer dtype otherwise become one flat buffer, lists of Python ints one
        ``np.concatenate``; a chunk is converted, checked and appended in one pass, with no
        Python work per document.  Anything else (strings, lists holding bools or floats,
        scalars, mixed dtypes, tensors numpy cannot read: one that requires grad, a ``meta``
        one) goes document by document through the exact checks
        (:func:`~mmpack._src.store.tokens.as_token_array`), the same for a list and a generator.  The
        first bad document raises, naming it: the documents before it are added, it and the
        documents after it in ``docs`` are not (the error gives its index, ``len`` of the store
        so far)."""
        if self._unshuffled is not None:
            self._unshuffled.add_many(docs)
            return
        source = DocChunks(docs)
        try:
            while True:
                # Chunks hold about a quarter of buffer_tokens, so memory stays bounded whatever
                # the documents' lengths (one document at a time when they are huge).
                avg = self._num_tokens // self._num_docs if self._num_docs else 64
                got = source.take(max(1, min(_CHUNK_DOCS, self.buffer_tokens // (4 * max(avg, 1)))))
                if got is None:
                    return
                if self._mask is not None or (type(got) is list and dict in set(map(type, got))):
                    self._add_masked(got)
                    continue
                if isinstance(got, Arrays):
                    if self._tokens.append_arrays(got.docs, got.lengths):
                        self._add_offsets(got.lengths)  # written straight from the documents
                        continue
                    joined = got.flat()
                    got = got.docs if joined is None else (joined, got.lengths)
                if isinstance(got, tuple):
                    flat, lens = got
                else:
                    plain = plain_lengths(got)
                    joined = None if plain is None else concat_plain(got, int(plain.sum()))
                    if joined is None or plain is None:
                        self._add_one_by_one(got)
                        continue
                    flat, lens = joined, plain
                self._write_block(flat, lens, keep_good=True, owned=True)
        finally:
            self._tokens.sync()  # no document of the caller's is still being written

    def _add_masked(self, got: Any) -> None:
        """Append a chunk of which some documents are dicts (:mod:`mmpack._src.store.lossmask`), or
        any chunk once the store has a loss mask: the tokens as one block, the masks of the
        documents accepted to the mask store's writer.  The first bad document (a bad token or
        mask, or a mask where the documents before it have none, or the other way round) raises,
        after the documents before it are appended."""
        if isinstance(got, Arrays):
            got = got.docs
        elif isinstance(got, tuple):  # plain documents given flat
            raise mix_error(self._num_docs, False, 0)
        tokens: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        try:
            for doc in got:
                j = self._num_docs + len(tokens)
                arr, mask = (
                    split_document(doc, j) if type(doc) is dict else (as_token_array(doc, j), None)
                )
                if mask is not None and self._mask is None:
                    self._open_mask(j)
                elif mask is None and self._mask is not None:
                    raise mix_error(j, False, 0)
                tokens.append(arr)
                if mask is not None:
                    masks.append(mask)
        finally:
            self._flush_masked(tokens, masks)

    def _open_mask(self, j: int) -> None:
        """Start the loss mask store (its first document is document ``j``, which must be 0)."""
        if j:
            raise mix_error(j, True, j)
        assert self._tmp is not None  # set by __enter__
        kw: dict[str, Any] = dict(backend=self.backend, fsync=self.fsync)
        self._mask = StoreWriter(self._tmp / LOSS_MASK_STORE, dtype=np.uint8, **kw).__enter__()

    def _flush_masked(self, tokens: list[np.ndarray], masks: list[np.ndarray]) -> None:
        if not tokens:
            return
        first = self._num_docs
        lens = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        flat = concat_docs(tokens, lens, first, any(t.dtype == np.uint64 for t in tokens))
        try:
            self._write_block(flat, lens, keep_good=True, owned=True)
        finally:
            done = self._num_docs - first  # the documents accepted, their masks with them
            if self._mask is not None and done:
                self._mask.add_batch(np.concatenate(masks[:done]), lens[:done])

    def _add_one_by_one(self, docs: list[Any]) -> None:
        for doc in docs:
            arr = as_token_array(doc, self._num_docs)
            self._write_block(arr, np.array([arr.size], dtype=np.int64), keep_good=False)

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray, loss_mask: Any = None) -> None:
        """Append ``len(lengths)`` documents given flat: ``tokens`` (integer, shape (sum(lengths),))
        and ``lengths`` (integer, shape (k,), >= 0), their masks flat (``loss_mask``: 0/1, shape
        (sum(lengths),)) in a masked store (a first batch with one, even empty, gives it a mask).
        Lengths are checked exactly (no wraparound) before anything is written; a bad token or
        mask value refuses the whole batch."""
        if self._unshuffled is not None:
            self._unshuffled.add_batch(tokens, lengths, loss_mask)
            return
        if loss_mask is None and self._mask is not None:  # these documents carry no mask
            raise mix_error(self._num_docs, False, 0)
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or not (lengths.dtype.kind in "iu" or lengths.size == 0):
            raise ValueError(
                f"lengths must be a 1-D array of non-negative integers, got dtype {lengths.dtype} "
                f"with shape {lengths.shape}"
            )
        tokens = as_token_array(tokens, self._num_docs)
        lengths = checked_lengths(lengths, tokens.size)
        if loss_mask is not None:
            loss_mask = as_loss_mask(loss_mask, tokens.size, self._num_docs)
            if self._mask is None:
                self._open_mask(self._num_docs)
        self._write_block(tokens, lengths, keep_good=False)
        if self._mask is not None:
            self._mask.add_batch(loss_mask, lengths)

    def attach(self, name: str, data: bytes) -> None:
        """Write a small file ``name`` (e.g. ``tokenizer.json``) into the store folder at commit;
        the metadata lists it (:attr:`~mmpack._src.store.format.StoreMeta.files`), so the store owns
        it: ``overwrite`` replaces it with the store."""
        if not plain_file_name(name) or name in _RESERVED:
            raise ValueError(f"cannot attach a file named {name!r} to a store")
        self._attached[name] = bytes(data)

    # --------------------------------------------------------------------------- internals
    def _write_block(
        self, flat: np.ndarray, lengths: np.ndarray, keep_good: bool, owned: bool = False
    ) -> None:
        """Append documents given flat (``lengths`` int64, summing to ``flat.size``); a bad token
        raises naming its document, after appending the documents before it if ``keep_good``.
        ``owned``: nothing changes ``flat`` again (it may still be being written on return)."""
        first = self._num_docs
        bad = self._tokens.append(flat, owned)
        if bad < 0:
            self._add_offsets(lengths)
            return
        ends = np.cumsum(lengths)
        d = int(np.searchsorted(ends, bad, side="right"))
        start = int(ends[d - 1]) if d else 0
        if keep_good and d:
            if self._tokens.append(flat[:start]) >= 0:
                raise AssertionError("tokens accepted once were refused")
            self._add_offsets(lengths[:d])
        validate_tokens(flat[start : int(ends[d])], lengths[d : d + 1], first + d, self.fixed_dtype)
        raise AssertionError(f"token {bad} was refused but passes the token rule")

    def _add_offsets(self, lengths: np.ndarray) -> None:
        if lengths.size:
            ends = np.cumsum(lengths) + self._num_tokens
            self._num_tokens, self._num_docs = int(ends[-1]), self._num_docs + lengths.size
            self._write_offsets(ends)

    def _write_offsets(self, values: np.ndarray) -> None:
        data = values.astype(OFFSETS_DTYPE, copy=False)
        self._offsets_file.write(memoryview(data))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
        self._offsets_crc.update(data)

    def _widen(self, dtype: np.dtype) -> None:
        """Rewrite the tokens written so far with a wider dtype (the token file's hook)."""
        self._tokens.widen(dtype)

    def _commit(self) -> None:
        inner, seed, self._unshuffled = self._unshuffled, self.shuffle_docs, None
        if inner is not None and seed is not None:  # rewritten in the keyed order
            doc_order.rewrite(inner, self._open_files, self.add_many, seed, self.buffer_tokens // 4)
            self.extra[doc_order.ORDER_SECTION] = doc_order.order_record(seed)
        mask_fingerprint = None
        if self._mask is not None:  # the loss mask store first, into this store's folder
            mask, self._mask = self._mask, None
            mask.__exit__(None, None, None)
            assert mask.store is not None and len(mask.store) == self._num_docs
            mask_fingerprint = mask.store.fingerprint
        n, tmp = self._num_docs, self._tmp
        order = None if seed is None else doc_order.doc_order(n, seed, 0, n)
        specs = commit_fields(tmp, self.fields, n, order, self.fsync)  # type: ignore[arg-type]
        digests = self._tokens.finish()
        dtype = self._tokens.dtype
        for f in (self._tokens.file, self._offsets_file):
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
            f.close()
        meta = StoreMeta(
            backend=self.backend,
            dtype=dtype,
            num_docs=self._num_docs,
            num_tokens=self._num_tokens,
            block_bytes=STRIPE_BYTES,
            tokens_digests=tuple(digests),
            offsets_crc32=tuple(self._offsets_crc.finish()),
            files=tuple(sorted(self._attached)),
            loss_mask=mask_fingerprint,
            fields=specs,
        )
        if tmp is None:
            raise RuntimeError("StoreWriter committed outside its with-block")
        get_backend(self.backend).commit(tmp, meta)
        for name, data in self._attached.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                if self.fsync:
                    os.fsync(f.fileno())
        if self.extra:
            write_extra(tmp, self.backend, meta, self.extra)
        finished = _check_new_store(tmp, meta)  # the complete new store, before it replaces any
        if self.check is not None:
            self.check(finished)
        del finished
        if self.fsync:
            fsync_dir(tmp)
        _swap_into_place(tmp, self.path, self.overwrite)
        with contextlib.suppress(OSError):  # a kill before this leaves a harmless empty file
            (self.path / LOCK_FILE).unlink()
        if self.fsync:
            fsync_dir(self.path.parent)
        self._tmp = None
        self.store = open_store(self.path)
