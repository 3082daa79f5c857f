"""Building a token store: a streaming, atomic writer.

Documents stream from any iterable into raw little-endian files inside a temporary folder beside
the target, ``.<name>.mmpack-tmp-<pid>-<random>``.  They are taken in chunks that numpy
concatenates in one call (no Python work per document in the common case), buffered up to
``buffer_tokens`` (memory is bounded by the buffer, never by the corpus), validated as a block,
written sequentially, and CRC-32-summed on a second thread while the next block is assembled.
With ``dtype=None`` the file starts at the narrowest dtype that holds the first block and is
widened in place (one sequential rewrite) if a later token needs more bits, which happens at most
three times.  The metadata is written last, the files are fsynced, and the folder is renamed onto
the target (``renameat2(RENAME_EXCHANGE)`` swaps an existing store atomically where the kernel
offers it), so an interrupted build never leaves anything that opens as a store, and readers of
the previous store keep their mappings.

Nothing a user owns is replaced: ``overwrite`` replaces only an mmpack store (holding only a
store's own files) or an empty folder, checked before any work and again before the swap.  Every
document is checked when it is added (the ``add`` that receives a bad one raises; the buffer is
kept), ``add_batch`` lengths without wraparound, and the finished temporary folder is opened as a
store before it replaces anything.  Every failure removes the temporary folder.  A builder holds
an advisory lock (``flock``) on ``.mmpack-lock`` inside its temporary folder; the next build of
the same target (names compared exactly, never as glob patterns) removes only the temporary
folders whose lock it can take, which works across PID namespaces.

Measured (``python -m benchmarks store``, 200M C4-like tokens): ``StoreWriter.add_batch`` of flat
tokens writes at about half the rate of ``ndarray.tofile`` of the same bytes; ``build`` from a
list of ~430k numpy arrays at a fifth to a quarter (the rest is per-document Python and the
concatenation); see the README's benchmark table.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError, Param, StoreExistsError, with_params
from mmpack.store.backends import get_backend
from mmpack.store.backends._base import OFFSETS_FILE, TOKENS_FILE
from mmpack.store.format import (
    BLOCK_BYTES,
    META_FILE,
    OFFSETS_DTYPE,
    BlockChecksum,
    StoreMeta,
    normalize_token_dtype,
    smallest_token_dtype,
    write_json_atomic,
)
from mmpack.store.reader import TokenStore, _as_path, _read_raw_meta, open_store

__all__ = ["StoreWriter", "build", "store_writer"]

_TMP_TAG = ".mmpack-tmp-"
_OLD_TAG = ".mmpack-old-"
_NEW_TAG = ".mmpack-new-"
_LOCK_FILE = ".mmpack-lock"
_NO_LOCK_GRACE_S = 60.0
# Token ids must fit int64, the dtype every view returns (no vocabulary comes close).
MAX_TOKEN = 2**63 - 1
_DEFAULT_BUFFER_TOKENS = 1 << 23


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
        self.path = Path(os.path.abspath(_as_path(path, "path")))  # immune to a later chdir
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
        parent = self.path.parent
        if os.path.lexists(self.path):
            if not self.overwrite:
                raise with_params(
                    StoreExistsError,
                    f"{str(self.path)!r} exists; pass ",
                    Param("overwrite", True),
                    " to replace it",
                )
            check_replaceable(self.path)  # before any work: never replace a user's folder
        if not parent.is_dir():
            if parent.exists():
                raise NotADirectoryError(
                    f"the parent {str(parent)!r} of the store is a file, not a folder"
                )
            raise FileNotFoundError(f"parent folder {str(parent)!r} of the store does not exist")
        _clean_stale(parent, self.path.name)
        # The folder appears under its temporary name already holding its builder's lock: it
        # is staged under a name no cleaner of live folders looks at, locked, then renamed.
        tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        staging = parent / f".{self.path.name}{_NEW_TAG}{tag}"
        staging.mkdir()
        self._tmp = staging
        try:
            self._lock_fd: int | None = _take_lock(staging / _LOCK_FILE)
            self._tmp = parent / f".{self.path.name}{_TMP_TAG}{tag}"
            os.rename(staging, self._tmp)
            self._tokens_file = open(self._tmp / TOKENS_FILE, "wb")
            self._offsets_file = open(self._tmp / OFFSETS_FILE, "wb")
            self._dtype = self.fixed_dtype
            self._tokens_crc = _BackgroundChecksum(BlockChecksum(BLOCK_BYTES))
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
            size = max(1, min(_CHUNK_DOCS, self.buffer_tokens // (4 * max(avg, 1))))
            chunk = [_snapshot(d) for d in islice(iterator, size)]
            if not chunk:
                return
            lens = _plain_lengths(chunk)
            flat = None if lens is None else _concat_plain(chunk, int(lens.sum()))
            if lens is not None and flat is not None and _block_ok(flat, self.fixed_dtype):
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
            arr = _as_doc_array(doc, j)
            if arr.size:
                _validate_block(arr, np.array([arr.size]), j, self.fixed_dtype)
            # ``doc`` is already our own copy (_snapshot), so ``arr`` may share its memory.
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
        tokens = _as_doc_array(tokens, first)
        lengths = _checked_lengths(lengths, tokens.size)
        if tokens.size:
            _validate_block(tokens, lengths, first, self.fixed_dtype)
        self._flush()
        self._write_block(tokens, lengths, first_doc=self._num_docs)

    def attach(self, name: str, data: bytes) -> None:
        """Write a small file ``name`` (e.g. ``tokenizer.json``) into the store folder at commit."""
        if (
            not isinstance(name, str)
            or "/" in name
            or name.startswith(".")
            or name
            in (
                TOKENS_FILE,
                OFFSETS_FILE,
                META_FILE,
                "zarr.json",
                "tokens",
                "offsets",
                "cache",
            )
        ):
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
            flat = _concat_docs(self._buffer, lengths, first_doc, self._buffer_has_u64)
        self._buffer.clear()
        self._buffer_lens.clear()
        self._buffer_has_u64 = False
        self._buffered = 0
        self._write_block(flat, lengths, first_doc)

    def _write_block(self, flat: np.ndarray, lengths: np.ndarray, first_doc: int) -> None:
        if flat.size:
            _validate_block(flat, lengths, first_doc, self.fixed_dtype)
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
        old_path = tmp / TOKENS_FILE
        new_path = tmp / (TOKENS_FILE + ".widen")
        crc = BlockChecksum(BLOCK_BYTES)
        old = np.memmap(old_path, dtype=old_dtype, mode="r") if self._num_tokens else None
        with open(new_path, "wb") as out:
            if old is not None:  # an empty file cannot be memory-mapped
                step = 1 << 22
                for lo in range(0, self._num_tokens, step):
                    chunk = old[lo : lo + step].astype(dtype)
                    out.write(memoryview(chunk))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
                    crc.update(chunk)
        del old
        os.replace(new_path, old_path)
        self._tokens_file = open(old_path, "ab")
        self._tokens_crc = _BackgroundChecksum(crc)
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
            _write_extra(tmp, self.backend, meta, self.extra)
        _check_new_store(tmp, meta)  # the complete new store, before it replaces anything
        if self.fsync:
            _fsync_dir(tmp)
        _swap_into_place(tmp, self.path, self.overwrite)
        with contextlib.suppress(OSError):  # a kill before this leaves a harmless empty file
            (self.path / _LOCK_FILE).unlink()
        if self.fsync:
            _fsync_dir(self.path.parent)
        self._tmp = None
        self.store = open_store(self.path)


def _write_extra(tmp: Path, backend: str, meta: StoreMeta, extra: dict[str, Any]) -> None:
    """Rewrite the committed metadata record with the optional ``extra`` sections."""
    core = meta.to_json()
    clash = set(extra) & set(core)
    if clash:
        raise ValueError(f"extra metadata may not replace the record's own keys {sorted(clash)}")
    record = {**core, **extra}
    if backend == "zarr":
        from mmpack.store.backends._zarr import _zarr  # zarr stays imported by its backend only

        _zarr().open_group(str(tmp), mode="a").attrs["mmpack"] = record
    else:
        write_json_atomic(tmp / META_FILE, record)


class _BackgroundChecksum:
    """Runs :class:`BlockChecksum` updates on one worker thread, in order, one block in flight,
    so checksumming (zlib releases the GIL) overlaps the write and the next block's assembly;
    summing in line halved the build rate (CRC-32 runs at ~1.5 GB/s here, writes at ~2.7)."""

    def __init__(self, checksum: BlockChecksum) -> None:
        self._checksum = checksum
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmpack-crc")
        self._pending: Future | None = None

    def update(self, data: np.ndarray) -> None:
        self._wait()
        self._pending = self._pool.submit(self._checksum.update, data)

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def finish(self) -> list[int]:
        self._wait()
        return self._checksum.finish()

    def close(self) -> None:
        try:
            self._wait()
        finally:
            self._pool.shutdown(wait=True)


def _as_doc_array(doc: Any, j: int) -> np.ndarray:
    """Coerce document ``j`` to a 1-D integer numpy array, or raise naming the document."""
    if isinstance(doc, (str, bytes, bytearray)):
        raise TypeError(
            f"document {j} is a {type(doc).__name__}; documents are sequences of token ids "
            "(tokenize text first, e.g. with mmpack.ingest.pipeline)"
        )
    if hasattr(doc, "detach") and hasattr(doc, "cpu"):  # a torch tensor
        doc = doc.detach().cpu().numpy()
    try:
        arr = np.asarray(doc)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"document {j}: cannot read it as integers ({exc})") from None
    if arr.ndim != 1:
        if arr.ndim == 0:
            raise TypeError(
                f"document {j} is {type(doc).__name__} {_short_repr(doc)}; each document must be "
                "a 1-D sequence of token ids"
            )
        raise TypeError(
            f"document {j} has shape {arr.shape}; each document must be a 1-D sequence of token ids"
        )
    kind = arr.dtype.kind
    if isinstance(doc, (list, tuple)) and arr.size:
        # numpy reads [1, True] as int64 and [2**64 - 1, 1] as (rounded) float64: check exactly.
        types = set(map(type, doc))
        if bool in types or np.bool_ in types or (kind in "fO" and types - {float, np.float64}):
            return _exact_tokens(doc, j)
    if kind in "iu":
        return arr
    if arr.size == 0:
        return arr.astype(np.int64)
    if kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0) | (arr >= 2.0**63)
        if bad.any():
            p = int(np.argmax(bad))
            v = arr[p].item()
            if not np.isfinite(v) or v != np.floor(v):
                what = "non-integer"
            else:
                what = "negative" if v < 0 else "too large"
            raise ValueError(
                f"document {j} has a {what} token {v!r} at position {p}; "
                "tokens must be integers in [0, 2**63)"
            )
        return arr.astype(np.uint64)
    if kind == "O":
        return _exact_tokens(arr, j)
    raise ValueError(
        f"document {j} holds {arr.dtype} values (e.g. {arr[0].item()!r}); tokens must be integers"
    )


def _exact_tokens(values: Any, j: int) -> np.ndarray:
    """Document ``j`` from a sequence of Python/numpy scalars, checked one by one (slow path for
    sequences numpy would misread: bools, mixed huge ints, objects)."""
    out = np.empty(len(values), dtype=np.uint64)
    for p, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, np.integer, float, np.floating)
        ):
            raise ValueError(
                f"document {j} has a non-integer token {_short_repr(v)} "
                f"({type(v).__name__}) at position {p}; tokens must be integers"
            )
        if isinstance(v, (float, np.floating)) and not (np.isfinite(v) and v == np.floor(v)):
            raise ValueError(
                f"document {j} has a non-integer token {v!r} at position {p}; "
                "tokens must be integers"
            )
        iv = int(v)
        if iv < 0:
            raise ValueError(f"document {j} has a negative token {iv} at position {p}")
        if iv > MAX_TOKEN:
            raise ValueError(
                f"document {j} has a token {iv} at position {p} that does not fit in int64 "
                "(token ids must be < 2**63: every view returns int64)"
            )
        out[p] = iv
    return out


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_CHUNK_DOCS = 1024


def _snapshot(doc: Any) -> Any:
    """A copy of a mutable document taken the moment the source yields it: a source that
    refills one output buffer (array, tensor or list) and yields it again must not change the
    documents already taken.  ``.copy()`` of a numpy document costs about 0.6 us (200k uint16
    arrays of 1-900 tokens: chunking alone 0.09-0.18 s, with the copies 0.22-0.28 s); a whole
    build of 300k such arrays is not measurably slower (``python -m benchmarks.trust_costs
    build``: 2.57-3.87 s against 3.13-3.93 s before, runs alternated on a loaded 2-core VM)."""
    t = type(doc)
    if t is np.ndarray or t is list:
        return doc.copy()
    if hasattr(doc, "detach") and hasattr(doc, "cpu"):  # a torch tensor: shares its storage
        return doc.detach().cpu().clone()
    if isinstance(doc, (np.ndarray, list)):  # subclasses (np.memmap)
        return np.array(doc) if isinstance(doc, np.ndarray) else list(doc)
    return doc


def _plain_lengths(chunk: list[Any]) -> np.ndarray | None:
    """The lengths of the chunk's documents if they are plain sequences whose conversion numpy
    can be trusted with (arrays, tensors, lists/tuples of Python ints), else None."""
    element_types: set[type] = set()
    for d in chunk:
        t = type(d)
        if t is list or t is tuple:
            element_types.update(map(type, d))  # numpy would read True as 1: only ints pass
        elif t is str or t is bytes or t is bytearray:
            return None
    if element_types - {int}:
        return None
    try:
        return np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
    except TypeError:  # a scalar document
        return None


def _concat_plain(docs: list[Any], total: int) -> np.ndarray | None:
    """One ``np.concatenate`` of unchecked documents, or None unless that gives exactly the
    ``total`` tokens as 1-D signed or narrow unsigned integers (uint64 mixed with int64 would go
    through float64)."""
    try:
        flat = np.concatenate(docs)
    except (TypeError, ValueError, OverflowError):
        return None
    if (
        flat.ndim != 1
        or flat.size != total
        or flat.dtype.kind not in "iu"
        or flat.dtype == np.uint64
    ):
        return None
    return flat


def _concat_docs(
    entries: list[np.ndarray], lengths: np.ndarray, first_doc: int, has_u64: bool
) -> np.ndarray:
    """Concatenate the buffered entries (documents or flat chunks of documents) without numpy's
    int64 + uint64 -> float64 promotion."""
    if not entries:
        return np.empty(0, dtype=np.int64)
    if has_u64:
        ends = np.cumsum(lengths)
        base = 0
        for e in entries:
            if e.dtype.kind == "i" and e.size and e.min() < 0:
                p = base + int(np.argmin(e))
                d = int(np.searchsorted(ends, p, side="right"))
                pos = p - (int(ends[d - 1]) if d else 0)
                raise ValueError(
                    f"document {first_doc + d} has a negative token {int(e.min())} at position {pos}"
                )
            base += e.size
        return np.concatenate(entries, dtype=np.uint64, casting="unsafe")  # negatives refused above
    return np.concatenate(entries)


def _block_ok(flat: np.ndarray, fixed: np.dtype | None) -> bool:
    """Whether every token of ``flat`` (1-D signed or narrow unsigned integers) is in
    ``[0, 2**63)`` and fits ``fixed``: the cheap check of a whole chunk."""
    if not flat.size:
        return True
    if flat.dtype.kind == "i" and flat.min() < 0:
        return False
    limit = MAX_TOKEN if fixed is None else min(MAX_TOKEN, int(np.iinfo(fixed).max))
    return int(flat.max()) <= limit


def _validate_block(
    flat: np.ndarray, lengths: np.ndarray, first_doc: int, fixed: np.dtype | None
) -> None:
    """Raise naming the first document whose tokens are negative, >= 2**63 or exceed ``fixed``."""
    limit = MAX_TOKEN if fixed is None else min(MAX_TOKEN, int(np.iinfo(fixed).max))
    bad = None
    if flat.dtype.kind == "i" and flat.min() < 0:
        bad = flat < 0
    elif int(flat.max()) > limit:
        bad = flat > np.array(limit, dtype=flat.dtype) if flat.dtype.kind == "u" else flat > limit
    if bad is None:
        return
    p = int(np.argmax(bad))
    ends = np.cumsum(lengths)
    d = int(np.searchsorted(ends, p, side="right"))
    pos = p - (int(ends[d - 1]) if d else 0)
    value = int(flat[p])
    if value < 0:
        raise ValueError(f"document {first_doc + d} has a negative token {value} at position {pos}")
    if value > MAX_TOKEN:
        raise ValueError(
            f"document {first_doc + d} has a token {value} at position {pos} that does not fit "
            "in int64 (token ids must be < 2**63: every view returns int64)"
        )
    assert fixed is not None  # without a fixed dtype, only the two cases above are bad
    raise ValueError(
        f"document {first_doc + d} has token {value} at position {pos}, which does not fit "
        f"dtype={fixed.name} (max {np.iinfo(fixed).max}); pass a wider dtype or dtype=None"
    )


def _checked_lengths(lengths: np.ndarray, n_tokens: int) -> np.ndarray:
    """``lengths`` as int64 after exact checks: each in ``[0, n_tokens]`` and summing to
    ``n_tokens`` without wraparound (a uint64 ``[2**64 - 1, 2]`` sums to 1 in numpy)."""
    if lengths.size == 0:
        if n_tokens:
            raise ValueError(f"tokens holds {n_tokens} items but lengths is empty")
        return np.empty(0, dtype=np.int64)
    if lengths.dtype.kind == "i" and int(lengths.min()) < 0:
        j = int(np.argmin(lengths))
        raise ValueError(f"lengths must be non-negative; lengths[{j}] is {int(lengths[j])}")
    if int(lengths.max()) > n_tokens:
        j = int(np.argmax(lengths))
        raise ValueError(
            f"lengths[{j}] is {int(lengths[j])} but tokens holds only {n_tokens} items"
        )
    out = lengths.astype(np.int64)
    # Every term is in [0, n_tokens]: a sum past 2**63 would wrap negative, so compare the
    # running sums (never decreasing) and their total exactly.
    ends = np.cumsum(out)
    if int(ends[-1]) != n_tokens or (ends.size > 1 and bool(np.any(ends[1:] < ends[:-1]))):
        total = sum(int(v) for v in lengths) if lengths.size <= 1 << 16 else "more"
        raise ValueError(f"tokens holds {n_tokens} items but lengths sum to {total}")
    return out


def _check_new_store(tmp: Path, meta: StoreMeta) -> None:
    """Open the finished temporary folder as a store (metadata, file sizes, offsets from 0,
    never decreasing, ending at num_tokens): a store that would fail its own open is never
    renamed into place."""
    raw = _read_raw_meta(tmp)
    if StoreMeta.from_json(raw, tmp).fingerprint != meta.fingerprint:
        raise FormatError(f"{tmp}: the metadata written does not read back; nothing was replaced")
    TokenStore(tmp, StoreMeta.from_json(raw, tmp), raw)


# --------------------------------------------------------------------------------- the target
_STORE_ENTRIES = {
    "memmap": {"mmpack.json", TOKENS_FILE, OFFSETS_FILE, "cache", _LOCK_FILE},
    "zarr": {"zarr.json", "tokens", "offsets", "cache", _LOCK_FILE},
}


def check_replaceable(path: Path) -> None:
    """Raise unless ``path`` is an mmpack store (holding only a store's own files) or an empty
    folder: ``overwrite`` replaces stores, never a user's folder, file or link.  Called before
    any work and again right before the swap."""
    if os.path.islink(path):
        raise FileExistsError(
            f"{str(path)!r} is a symbolic link; refusing to replace it (overwrite replaces only "
            "an mmpack store or an empty folder)"
        )
    if not path.is_dir():
        what = "a file" if path.is_file() else "not a folder"
        raise FileExistsError(
            f"{str(path)!r} is {what}, not a store; refusing to replace it (overwrite replaces "
            "only an mmpack store or an empty folder)"
        )
    entries = sorted(os.listdir(path))
    if not entries:
        return
    try:
        raw = _read_raw_meta(path)
    except (FormatError, OSError):
        raw = None
    backend = raw.get("backend") if isinstance(raw, dict) else None
    if not (isinstance(backend, str) and backend in _STORE_ENTRIES):
        backend = None
    extra = [e for e in entries if backend is None or e not in _STORE_ENTRIES[backend]]
    if backend is None or extra:
        shown = ", ".join(extra[:5]) + (f", ... ({len(extra)} entries)" if len(extra) > 5 else "")
        what = "an mmpack store with other files" if backend else "not an mmpack store"
        raise FileExistsError(
            f"{str(path)!r} is {what} (it holds {shown}); refusing to replace it: overwrite "
            "replaces only an mmpack store or an empty folder"
        )


# --------------------------------------------------------------------------------- the rename
def _take_lock(path: Path) -> int:
    """Create ``path`` and hold an exclusive ``flock`` on it for the builder's lifetime: the
    liveness signal of a temporary folder, valid across PID namespaces (containers sharing a
    volume) where a PID in a name is not."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            os.close(fd)
            raise
        # No flock on this file system: the lock file stays, and cleaners, unable to take the
        # lock either, keep the folder (a leak at worst, never a live build deleted).
    except BaseException:
        os.close(fd)
        raise
    return fd


_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


def _builder_dead(folder: Path) -> tuple[bool, int | None]:
    """``(dead, fd)``: whether the builder of temporary folder ``folder`` is gone, and the lock
    fd if we took its lock (held while we remove the folder).  A builder's folder carries its
    lock file from the moment it appears under this name until it is renamed onto the target;
    a folder without one holds a previous store moved aside by an exchange (to be removed) or
    comes from an mmpack without locks."""
    try:
        fd = os.open(folder / _LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live builder (or no flock on this file system): keep it
        os.close(fd)
        return False, None
    return True, fd


def _old_and_pid_dead(folder: Path) -> bool:
    """For staging folders (no lock yet): older than a minute and no live process of that PID
    here (a builder stages its folder for microseconds)."""
    try:
        age = time.time() - os.lstat(folder).st_mtime
    except OSError:
        return False
    pid_text = folder.name.rsplit("-", 2)[-2] if folder.name.count("-") >= 2 else ""
    alive = pid_text.isdigit() and _pid_alive(int(pid_text))
    return age > _NO_LOCK_GRACE_S and not alive


def _clean_stale(parent: Path, name: str) -> None:
    """Remove temporary folders left by dead builders of ``parent/name``.  Names are compared
    exactly (``a*`` or ``corpus[v2]`` are names, not patterns); a temporary folder is removed
    only once its builder's lock is taken (see :func:`_builder_dead`)."""
    tmp_prefix, old_prefix = f".{name}{_TMP_TAG}", f".{name}{_OLD_TAG}"
    new_prefix = f".{name}{_NEW_TAG}"
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        folder = parent / entry
        if entry.startswith(tmp_prefix) and _tagged(entry[len(tmp_prefix) :]):
            dead, fd = _builder_dead(folder)
            try:
                if dead:
                    shutil.rmtree(folder, ignore_errors=True)
            finally:
                if fd is not None:
                    os.close(fd)
        elif entry.startswith(new_prefix) and _tagged(entry[len(new_prefix) :]):
            if _old_and_pid_dead(folder):
                shutil.rmtree(folder, ignore_errors=True)
        elif entry.startswith(old_prefix) and _tagged(entry[len(old_prefix) :]):
            # A previous store moved aside by the two-rename fallback; its builder removes it
            # right after the second rename.
            pid_text = entry[len(old_prefix) :].split("-", 1)[0]
            if not _pid_alive(int(pid_text)):
                shutil.rmtree(folder, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _tagged(suffix: str) -> bool:
    """``<pid>-<8 hex digits>``, exactly what a builder appends."""
    pid, _, rand = suffix.partition("-")
    return pid.isdigit() and len(rand) == 8 and all(c in "0123456789abcdef" for c in rand)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def _swap_into_place(tmp: Path, target: Path, overwrite: bool) -> None:
    if not os.path.lexists(target):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if not os.path.lexists(target):
                raise
    if not overwrite:
        raise StoreExistsError(f"{str(target)!r} appeared during the build; not replacing it")
    check_replaceable(target)  # what is there now, not what was there when the build began
    if _renameat2_exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the previous store
        return
    old = target.parent / f".{target.name}{_OLD_TAG}{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
