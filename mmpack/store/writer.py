"""Building a token store: a streaming, atomic writer.

Documents stream from any iterable into raw little-endian files inside a temporary folder beside
the target.  They are taken in chunks that numpy concatenates in one call (no Python work per
document in the common case), buffered up to ``buffer_tokens`` (memory is bounded by the buffer,
never by the corpus), validated as a block against the token rule (:mod:`mmpack.store.tokens`),
written sequentially, and CRC-32-summed on a second thread while the next block is assembled
(:mod:`mmpack.store.buildfiles`).  With ``dtype=None`` the file starts at the narrowest dtype that
holds the first block and is widened in place (one sequential rewrite) if a later token needs
more bits, which happens at most three times.  The metadata is written last, the files are
fsynced, the finished folder is opened as a store, and it is renamed onto the target
(:mod:`mmpack.store.publish`: temporary folders and their locks, the overwrite guard, the
``renameat2(RENAME_EXCHANGE)`` swap), so an interrupted build never leaves anything that opens
as a store, readers of the previous store keep their mappings, and ``overwrite`` replaces only
an mmpack store or an empty folder.  A bad document raises from the ``add`` that receives it
(the buffer is kept); every failure removes the temporary folder.

Measured (``python -m benchmarks store``, 200M C4-like tokens): ``StoreWriter.add_batch`` of flat
tokens writes at about half the rate of ``ndarray.tofile`` of the same bytes; ``build`` from a
list of ~430k numpy arrays at a fifth to a quarter (the rest is per-document Python and the
concatenation); see the README's benchmark table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.store.backends import OFFSETS_FILE, TOKENS_FILE, get_backend
from mmpack.store.buildfiles import BackgroundChecksum, widen_tokens, write_extra
from mmpack.store.format import (
    BLOCK_BYTES,
    META_FILE,
    OFFSETS_DTYPE,
    BlockChecksum,
    StoreMeta,
    normalize_token_dtype,
    smallest_token_dtype,
)
from mmpack.store.opening import as_path
from mmpack.store.publish import LOCK_FILE, check_replaceable, check_target, fsync_dir, stage_folder
from mmpack.store.publish import check_new_store as _check_new_store
from mmpack.store.publish import pid_alive as _pid_alive  # noqa: F401  (used by the remote writer)
from mmpack.store.publish import swap_into_place as _swap_into_place
from mmpack.store.reader import TokenStore, open_store
from mmpack.store.tokens import (
    CHUNK_DOCS,
    MAX_TOKEN,
    as_token_array,
    block_ok,
    checked_lengths,
    concat_docs,
    concat_plain,
    plain_lengths,
    snapshot_doc,
    validate_block,
)

__all__ = ["MAX_TOKEN", "StoreWriter", "build", "check_replaceable", "store_writer"]

_DEFAULT_BUFFER_TOKENS = 1 << 23
# Names a store's own files take (either backend): never attached.
_RESERVED = (TOKENS_FILE, OFFSETS_FILE, META_FILE, "zarr.json", "tokens", "offsets", "cache")


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
) -> TokenStore:
    """Build a store at ``path`` from ``docs`` and return it opened.

    Parameters
    ----------
    path : str or os.PathLike
        Target folder; must not exist unless ``overwrite=True``.  A URL (``s3://bucket/name``,
        ``file:///path``...) builds locally, then uploads (:mod:`mmpack.store.remote.writer`).
    docs : iterable of 1-D integer sequences
        Lists, tuples, numpy arrays, torch tensors, a generator over a corpus larger than memory.
        Empty documents are kept.
    dtype : numpy dtype, optional
        Unsigned token dtype.  Default: the narrowest of uint8/16/32/64 that holds the largest
        token.
    backend : {"memmap", "zarr"}
    overwrite : bool
        Replace an existing store at ``path`` (atomically).  Only an mmpack store or an empty
        folder is replaced: anything else at ``path`` (a folder holding other files, a file, a
        symbolic link) raises ``FileExistsError`` before any document is read.
    buffer_tokens : int
        Tokens buffered before a write; bounds the memory used.
    fsync : bool
        Flush the files to stable storage before the rename (survives power loss too).
    storage_options : dict, optional
        For a URL target: endpoint, credentials and client settings (see
        :func:`mmpack.store.remote.opener.open_url`).

    Raises
    ------
    ValueError
        A negative, non-integer or too large token (>= 2**63, or beyond ``dtype``; the message
        names the document, position and value), or a bad argument.  Nothing is left on disk.
    TypeError
        A document that is not a 1-D sequence of integers.
    StoreExistsError
        ``path`` exists and ``overwrite`` is false.
    FileExistsError
        ``overwrite`` is true but ``path`` is not an mmpack store or an empty folder.
    """
    remote = {} if storage_options is None else {"storage_options": storage_options}
    with store_writer(
        path,
        dtype=dtype,
        backend=backend,
        overwrite=overwrite,
        buffer_tokens=buffer_tokens,
        fsync=fsync,
        **remote,
    ) as writer:
        if isinstance(docs, (str, bytes)):
            raise TypeError("docs must be an iterable of token sequences, not a string")
        try:
            iterator = iter(docs)
        except TypeError:
            raise TypeError(
                f"docs must be an iterable of token sequences, got {type(docs).__name__}"
            ) from None
        writer.add_many(iterator)
    assert writer.store is not None  # set by the clean exit of the with-block
    return writer.store


def store_writer(path: str | os.PathLike[str], **kwargs: Any) -> StoreWriter:
    """A :class:`StoreWriter` for a local ``path``, or its remote twin
    (:class:`mmpack.store.remote.writer.RemoteStoreWriter`) for a URL."""
    if isinstance(path, str) and "://" in path:
        from mmpack.store.remote.writer import RemoteStoreWriter

        return RemoteStoreWriter(path, **kwargs)
    if "storage_options" in kwargs:
        raise TypeError(f"storage_options is for URL targets; {str(path)!r} is a local path")
    return StoreWriter(path, **kwargs)


class StoreWriter:
    """Streaming, atomic writer of a store; :func:`build` is a thin loop over it.

    Use as a context manager: documents go in with :meth:`add` or :meth:`add_batch`; a clean
    exit validates the new store, commits it (rename into place) and sets ``writer.store``; an
    exception removes everything written.  A bad document raises from the :meth:`add` that
    receives it and is not stored; the writer stays usable.
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
    ) -> None:
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
        self.store: TokenStore | None = None
        self._tmp: Path | None = None
        self.extra: dict[str, Any] = {}
        """Optional sections added to the metadata record at commit (e.g. ``"tokenizer"``,
        ``"provenance"``): readers that do not know them ignore them, and they are not part of
        the fingerprint."""
        self._attached: dict[str, bytes] = {}

    # --------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> StoreWriter:
        check_target(self.path, self.overwrite)  # before any work: never replace a user's folder
        tmp, fd = stage_folder(self.path)  # removes dead builders' folders first
        self._tmp = tmp
        self._lock_fd: int | None = fd
        try:
            self._tokens_file = open(self._tmp / TOKENS_FILE, "wb")
            self._offsets_file = open(self._tmp / OFFSETS_FILE, "wb")
            self._dtype = self.fixed_dtype
            self._tokens_crc = BackgroundChecksum(BlockChecksum(BLOCK_BYTES))
            self._offsets_crc = BlockChecksum(BLOCK_BYTES)
            self._buffer: list[np.ndarray] = []
            self._buffer_lens: list[int] = []
            self._buffer_has_u64 = False
            self._buffered = 0
            self._num_docs = 0
            self._num_tokens = 0
            self._write_offsets(np.zeros(1, dtype=np.int64))
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        """Release everything; remove the temporary folder whatever else fails (a close that
        raises again on a full disk must not leave it behind)."""
        steps = [getattr(getattr(self, "_tokens_crc", None), "close", None)]
        for f in (getattr(self, "_tokens_file", None), getattr(self, "_offsets_file", None)):
            if f is not None:
                steps.append(f.close)
        first: BaseException | None = None
        for step in steps:
            if step is None:
                continue
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

        Documents are taken in chunks: a chunk of plain sequences (numpy arrays, tensors, lists
        of Python ints) is converted by one ``np.concatenate`` (a copy, so a source that reuses
        its output buffer cannot change what was buffered) and its values checked at once; no
        Python work runs per document.  A chunk with anything else (strings, lists holding bools
        or floats, scalars, uint64 arrays), or one holding a bad value, goes document by document
        through the exact checks.  The first bad document raises, naming it: the documents before
        it are added, it and the documents after it in ``docs`` are not (the error gives its
        index, ``len`` of the store so far)."""
        iterator = iter(docs)
        seen_docs = seen_tokens = 0
        while True:
            # Chunks hold about a quarter of the buffer, so memory stays bounded by buffer_tokens
            # whatever the documents' lengths (one document at a time when they are huge).
            avg = seen_tokens // seen_docs if seen_docs else 64
            size = max(1, min(CHUNK_DOCS, self.buffer_tokens // (4 * max(avg, 1))))
            chunk = [snapshot_doc(d) for d in islice(iterator, size)]
            if not chunk:
                return
            lens = plain_lengths(chunk)
            flat = None if lens is None else concat_plain(chunk, int(lens.sum()))
            if lens is not None and flat is not None and block_ok(flat, self.fixed_dtype):
                n_tokens = flat.size
                self._buffer.append(flat)
                self._buffer_lens.extend(lens.tolist())
                self._buffered += n_tokens
                if self._buffered >= self.buffer_tokens:
                    self._flush()
            else:
                n_tokens = self._add_one_by_one(chunk)
            seen_docs += len(chunk)
            seen_tokens += n_tokens

    def _add_one_by_one(self, docs: list[Any]) -> int:
        total = 0
        for doc in docs:
            j = self._num_docs + len(self._buffer_lens)
            arr = as_token_array(doc, j)
            if arr.size:
                validate_block(arr, np.array([arr.size]), j, self.fixed_dtype)
            # ``doc`` is already our own copy (snapshot_doc), so ``arr`` may share its memory.
            if arr.dtype.itemsize == 8 and arr.dtype.kind == "u":
                self._buffer_has_u64 = True
            self._buffer.append(arr)
            self._buffer_lens.append(arr.size)
            self._buffered += arr.size
            total += arr.size
            if self._buffered >= self.buffer_tokens:
                self._flush()
        return total

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` documents given flat: ``tokens`` (integer, shape (sum(lengths),))
        and ``lengths`` (integer, shape (k,), non-negative).  The lengths are checked exactly (no
        wraparound of unsigned or int64 sums) before anything is written."""
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or not (lengths.dtype.kind in "iu" or lengths.size == 0):
            raise ValueError(
                f"lengths must be a 1-D array of non-negative integers, got dtype {lengths.dtype} "
                f"with shape {lengths.shape}"
            )
        first = self._num_docs + len(self._buffer_lens)
        tokens = as_token_array(tokens, first)
        lengths = checked_lengths(lengths, tokens.size)
        if tokens.size:
            validate_block(tokens, lengths, first, self.fixed_dtype)
        self._flush()
        self._write_block(tokens, lengths, first_doc=self._num_docs)

    def attach(self, name: str, data: bytes) -> None:
        """Write a small file ``name`` (e.g. ``tokenizer.json``) into the store folder at commit."""
        if not isinstance(name, str) or "/" in name or name.startswith(".") or name in _RESERVED:
            raise ValueError(f"cannot attach a file named {name!r} to a store")
        self._attached[name] = bytes(data)

    # --------------------------------------------------------------------------- internals
    def _flush(self) -> None:
        if not self._buffer:
            return
        lengths = np.array(self._buffer_lens, dtype=np.int64)
        first_doc = self._num_docs
        if len(self._buffer) == 1:
            flat = self._buffer[0]
        else:
            flat = concat_docs(self._buffer, lengths, first_doc, self._buffer_has_u64)
        self._buffer.clear()
        self._buffer_lens.clear()
        self._buffer_has_u64 = False
        self._buffered = 0
        self._write_block(flat, lengths, first_doc)

    def _write_block(self, flat: np.ndarray, lengths: np.ndarray, first_doc: int) -> None:
        if flat.size:
            validate_block(flat, lengths, first_doc, self.fixed_dtype)
            needed = smallest_token_dtype(int(flat.max()))
            if self._dtype is None:
                self._dtype = needed
            elif self.fixed_dtype is None and needed.itemsize > self._dtype.itemsize:
                self._widen(needed)
            data = flat.astype(self._dtype, copy=False)
            self._tokens_file.write(memoryview(data))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
            self._tokens_crc.update(data)
        self._num_tokens += flat.size
        self._num_docs += lengths.size
        ends = np.cumsum(lengths) + (self._num_tokens - flat.size)
        self._write_offsets(ends)

    def _write_offsets(self, values: np.ndarray) -> None:
        data = values.astype(OFFSETS_DTYPE, copy=False)
        self._offsets_file.write(memoryview(data))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
        self._offsets_crc.update(data)

    def _widen(self, dtype: np.dtype) -> None:
        """Rewrite the tokens written so far with a wider dtype (sequential, chunked)."""
        tmp, old_dtype = self._tmp, self._dtype
        assert tmp is not None and old_dtype is not None  # inside the with-block, after a write
        self._tokens_crc.close()
        self._tokens_file.close()
        crc = widen_tokens(tmp / TOKENS_FILE, old_dtype, dtype, self._num_tokens, BLOCK_BYTES)
        self._tokens_file = open(tmp / TOKENS_FILE, "ab")
        self._tokens_crc = BackgroundChecksum(crc)
        self._dtype = dtype

    def _commit(self) -> None:
        self._flush()
        dtype = self._dtype or self.fixed_dtype or np.dtype("<u1")
        for f in (self._tokens_file, self._offsets_file):
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
            f.close()
        meta = StoreMeta(
            backend=self.backend,
            dtype=dtype,
            num_docs=self._num_docs,
            num_tokens=self._num_tokens,
            block_bytes=BLOCK_BYTES,
            tokens_crc32=tuple(self._tokens_crc.finish()),
            offsets_crc32=tuple(self._offsets_crc.finish()),
        )
        tmp = self._tmp
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
        _check_new_store(tmp, meta)  # the complete new store, before it replaces anything
        if self.fsync:
            fsync_dir(tmp)
        _swap_into_place(tmp, self.path, self.overwrite)
        with contextlib.suppress(OSError):  # a kill before this leaves a harmless empty file
            (self.path / LOCK_FILE).unlink()
        if self.fsync:
            fsync_dir(self.path.parent)
        self._tmp = None
        self.store = open_store(self.path)
