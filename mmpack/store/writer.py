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
the previous store keep their mappings.  Stale temporary folders of dead builders are removed by
the next build of the same target.

Measured (``python -m benchmarks store``, 200M C4-like tokens): ``StoreWriter.add_batch`` of flat
tokens writes at about half the rate of ``ndarray.tofile`` of the same bytes; ``build`` from a
list of ~430k numpy arrays at a fifth to a quarter (the rest is per-document Python and the
concatenation); see the README's benchmark table.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import shutil
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.store.backends import get_backend
from mmpack.store.backends._base import OFFSETS_FILE, TOKENS_FILE
from mmpack.errors import StoreExistsError
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
from mmpack.store.reader import TokenStore, _as_path, open_store

__all__ = ["StoreWriter", "build"]

_TMP_TAG = ".mmpack-tmp-"
_OLD_TAG = ".mmpack-old-"
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
) -> TokenStore:
    """Build a store at ``path`` from ``docs`` and return it opened.

    Parameters
    ----------
    path : str or os.PathLike
        Target folder; must not exist unless ``overwrite=True``.
    docs : iterable of 1-D integer sequences
        Lists, tuples, numpy arrays, torch tensors, a generator over a corpus larger than memory.
        Empty documents are kept.
    dtype : numpy dtype, optional
        Unsigned token dtype.  Default: the narrowest of uint8/16/32/64 that holds the largest
        token.
    backend : {"memmap", "zarr"}
    overwrite : bool
        Replace an existing store at ``path`` (atomically).
    buffer_tokens : int
        Tokens buffered before a write; bounds the memory used.
    fsync : bool
        Flush the files to stable storage before the rename (survives power loss too).

    Raises
    ------
    ValueError
        A negative, non-integer or too large token (the message names the document and value),
        or a bad argument.  Nothing is left on disk.
    TypeError
        A document that is not a 1-D sequence of integers.
    StoreExistsError
        ``path`` exists and ``overwrite`` is false.
    """
    with StoreWriter(
        path, dtype=dtype, backend=backend, overwrite=overwrite,
        buffer_tokens=buffer_tokens, fsync=fsync,
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
    return writer.store


class StoreWriter:
    """Streaming, atomic writer of a store; :func:`build` is a thin loop over it.

    Use as a context manager: documents go in with :meth:`add` or :meth:`add_batch`; a clean
    exit commits (rename into place) and sets ``writer.store``; an exception removes everything
    written.
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
        self.path = _as_path(path, "path")
        get_backend(backend)
        self.backend = backend
        self.fixed_dtype = None if dtype is None else normalize_token_dtype(dtype)
        if isinstance(buffer_tokens, bool) or not isinstance(buffer_tokens, int) or buffer_tokens < 1:
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
        if self.path.exists() and not self.overwrite:
            raise StoreExistsError(
                f"{str(self.path)!r} exists; pass overwrite=True to replace it"
            )
        if not parent.is_dir():
            if parent.exists():
                raise NotADirectoryError(
                    f"the parent {str(parent)!r} of the store is a file, not a folder"
                )
            raise FileNotFoundError(f"parent folder {str(parent)!r} of the store does not exist")
        _clean_stale(parent, self.path.name)
        self._tmp = parent / f".{self.path.name}{_TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"
        self._tmp.mkdir()
        self._tokens_file = open(self._tmp / TOKENS_FILE, "wb")
        self._offsets_file = open(self._tmp / OFFSETS_FILE, "wb")
        self._dtype = self.fixed_dtype
        self._tokens_crc = _BackgroundChecksum(BlockChecksum(BLOCK_BYTES))
        self._offsets_crc = BlockChecksum(BLOCK_BYTES)
        self._buffer: list[np.ndarray] = []
        self._buffer_lens: list[int] = []
        self._buffer_has_u64 = False
        self._buffer_unchecked = False
        self._buffered = 0
        self._num_docs = 0
        self._num_tokens = 0
        self._write_offsets(np.zeros(1, dtype=np.int64))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
        finally:
            crc = getattr(self, "_tokens_crc", None)
            if crc is not None:
                crc.close()
            for f in (getattr(self, "_tokens_file", None), getattr(self, "_offsets_file", None)):
                if f is not None and not f.closed:
                    f.close()
            if self._tmp is not None and self._tmp.exists():
                shutil.rmtree(self._tmp, ignore_errors=True)

    # --------------------------------------------------------------------------- adding
    def add(self, doc: Any) -> None:
        """Append one document (a 1-D sequence of non-negative integers)."""
        self.add_many((doc,))

    def add_many(self, docs: Iterable[Any]) -> None:
        """Append every document of ``docs``.

        Documents are taken in chunks: a chunk of plain sequences (numpy arrays, tensors, lists
        of Python ints) is buffered as it is, with its lengths read by ``map(len, ...)``, and the
        whole buffer is converted by one ``np.concatenate`` at the flush; no Python work runs per
        document.  A chunk with anything else (strings, lists holding bools or floats, scalars),
        or a buffer that does not concatenate into 1-D integers, goes document by document through
        the exact checks, which name the offending document."""
        iterator = iter(docs)
        seen_docs = seen_tokens = 0
        while True:
            # Chunks hold about a quarter of the buffer, so memory stays bounded by buffer_tokens
            # whatever the documents' lengths (one document at a time when they are huge).
            avg = seen_tokens // seen_docs if seen_docs else 64
            size = max(1, min(_CHUNK_DOCS, self.buffer_tokens // (4 * max(avg, 1))))
            chunk = list(islice(iterator, size))
            if not chunk:
                return
            lens = _plain_lengths(chunk)
            if lens is None:
                self._add_one_by_one(chunk)
                n_tokens = int(sum(self._buffer_lens[-len(chunk):])) if self._buffer_lens else 0
            else:
                n_tokens = int(lens.sum())
                self._buffer.extend(chunk)
                self._buffer_lens.extend(lens.tolist())
                self._buffer_unchecked = True
                self._buffered += n_tokens
                if self._buffered >= self.buffer_tokens:
                    self._flush()
            seen_docs += len(chunk)
            seen_tokens += n_tokens

    def _add_one_by_one(self, docs: list[Any]) -> None:
        for doc in docs:
            arr = _as_doc_array(doc, self._num_docs + len(self._buffer_lens))
            if arr.dtype.itemsize == 8 and arr.dtype.kind == "u":
                self._buffer_has_u64 = True
            self._buffer.append(arr)
            self._buffer_lens.append(arr.size)
            self._buffered += arr.size
            if self._buffered >= self.buffer_tokens:
                self._flush()

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` documents given flat: ``tokens`` (integer, shape (sum(lengths),))
        and ``lengths`` (integer, shape (k,), non-negative)."""
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths.size and lengths.min() < 0):
            raise ValueError("lengths must be a 1-D array of non-negative integers")
        tokens = _as_doc_array(tokens, self._num_docs + len(self._buffer))
        if tokens.size != int(lengths.sum()):
            raise ValueError(
                f"tokens holds {tokens.size} items but lengths sum to {int(lengths.sum())}"
            )
        self._flush()
        self._write_block(tokens, lengths.astype(np.int64), first_doc=self._num_docs)

    def attach(self, name: str, data: bytes) -> None:
        """Write a small file ``name`` (e.g. ``tokenizer.json``) into the store folder at commit."""
        if not isinstance(name, str) or "/" in name or name.startswith(".") or name in (
            TOKENS_FILE, OFFSETS_FILE, META_FILE, "zarr.json", "tokens", "offsets", "cache",
        ):
            raise ValueError(f"cannot attach a file named {name!r} to a store")
        self._attached[name] = bytes(data)

    # --------------------------------------------------------------------------- internals
    def _flush(self) -> None:
        if not self._buffer:
            return
        lengths = np.array(self._buffer_lens, dtype=np.int64)
        first_doc = self._num_docs
        flat = None
        if self._buffer_unchecked:
            flat = _concat_plain(self._buffer, int(lengths.sum()))
            if flat is None:  # something numpy misreads: check every document exactly
                self._buffer[:] = [
                    _as_doc_array(d, first_doc + k) for k, d in enumerate(self._buffer)
                ]
                self._buffer_has_u64 = any(
                    d.dtype.kind == "u" and d.dtype.itemsize == 8 for d in self._buffer
                )
        if flat is None:
            flat = _concat_docs(self._buffer, lengths, first_doc, self._buffer_has_u64)
        self._buffer.clear()
        self._buffer_lens.clear()
        self._buffer_has_u64 = False
        self._buffer_unchecked = False
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
            self._tokens_file.write(memoryview(data))
            self._tokens_crc.update(data)
        self._num_tokens += flat.size
        self._num_docs += lengths.size
        ends = np.cumsum(lengths) + (self._num_tokens - flat.size)
        self._write_offsets(ends)

    def _write_offsets(self, values: np.ndarray) -> None:
        data = values.astype(OFFSETS_DTYPE, copy=False)
        self._offsets_file.write(memoryview(data))
        self._offsets_crc.update(data)

    def _widen(self, dtype: np.dtype) -> None:
        """Rewrite the tokens written so far with a wider dtype (sequential, chunked)."""
        self._tokens_crc.close()
        self._tokens_file.close()
        old_path = self._tmp / TOKENS_FILE
        new_path = self._tmp / (TOKENS_FILE + ".widen")
        crc = BlockChecksum(BLOCK_BYTES)
        old = np.memmap(old_path, dtype=self._dtype, mode="r") if self._num_tokens else None
        with open(new_path, "wb") as out:
            step = 1 << 22
            for lo in range(0, self._num_tokens, step):
                chunk = old[lo : lo + step].astype(dtype)
                out.write(memoryview(chunk))
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
        get_backend(self.backend).commit(self._tmp, meta)
        for name, data in self._attached.items():
            with open(self._tmp / name, "wb") as f:
                f.write(data)
                if self.fsync:
                    os.fsync(f.fileno())
        if self.extra:
            _write_extra(self._tmp, self.backend, meta, self.extra)
        if self.fsync:
            _fsync_dir(self._tmp)
        _swap_into_place(self._tmp, self.path, self.overwrite)
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
        bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0) | (arr >= 2.0**64)
        if bad.any():
            p = int(np.argmax(bad))
            v = arr[p].item()
            if not np.isfinite(v) or v != np.floor(v):
                what = "non-integer"
            else:
                what = "negative" if v < 0 else "too large"
            raise ValueError(
                f"document {j} has a {what} token {v!r} at position {p}; "
                "tokens must be integers in [0, 2**64)"
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
        if iv >= 2**64:
            raise ValueError(
                f"document {j} has a token {iv} at position {p} that does not fit in 64 bits"
            )
        out[p] = iv
    return out


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_CHUNK_DOCS = 1024


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
    if flat.ndim != 1 or flat.size != total or flat.dtype.kind not in "iu" or flat.dtype == np.uint64:
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


def _validate_block(
    flat: np.ndarray, lengths: np.ndarray, first_doc: int, fixed: np.dtype | None
) -> None:
    """Raise naming the first document whose tokens are negative or exceed ``fixed``."""
    limit = None if fixed is None else np.iinfo(fixed).max
    bad = None
    if flat.dtype.kind == "i" and flat.min() < 0:
        bad = flat < 0
    elif limit is not None and int(flat.max()) > limit:
        bad = flat > limit
    if bad is None:
        return
    p = int(np.argmax(bad))
    ends = np.cumsum(lengths)
    d = int(np.searchsorted(ends, p, side="right"))
    pos = p - (int(ends[d - 1]) if d else 0)
    value = int(flat[p])
    if value < 0:
        raise ValueError(f"document {first_doc + d} has a negative token {value} at position {pos}")
    raise ValueError(
        f"document {first_doc + d} has token {value} at position {pos}, which does not fit "
        f"dtype={fixed.name} (max {limit}); pass a wider dtype or dtype=None"
    )


# --------------------------------------------------------------------------------- the rename
def _clean_stale(parent: Path, name: str) -> None:
    """Remove temporary folders left by dead builders of ``parent/name``."""
    for prefix in (f".{name}{_TMP_TAG}", f".{name}{_OLD_TAG}"):
        for entry in parent.glob(prefix + "*"):
            pid_text = entry.name[len(prefix):].split("-", 1)[0]
            if pid_text.isdigit() and _pid_alive(int(pid_text)):
                continue
            shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    if not target.exists():
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if not target.exists():
                raise
    if not overwrite:
        raise StoreExistsError(f"{str(target)!r} appeared during the build; not replacing it")
    if target.is_file() or target.is_symlink():
        raise FileExistsError(f"{str(target)!r} is a file, not a store; refusing to replace it")
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
