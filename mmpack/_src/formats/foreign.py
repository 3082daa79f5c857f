"""What the foreign stores share: a store over files another tool wrote, served in place.

The files are mapped read-only (no byte is copied, no file descriptor kept); ``offsets`` is
derived from the other tool's index (Megatron) or from one scan of the tokens (EOS-separated
files).  Nothing is ever written beside the user's files: derived indexes, packing plans and
checksum sidecars live in a local cache folder, ``cache_root() / <kind> / <fingerprint>``, where
``cache_root()`` is the ``cache_dir=`` open option, else ``$MMPACK_CACHE_DIR``, else
``$XDG_CACHE_HOME/mmpack``, else ``~/.cache/mmpack``.

The derived index is cached under a key of the source files' identities (:func:`file_identity`):
size, mtime, inode, **ctime** and a SHA-256 of the first and last MiB.  The key trusts the
kernel's ctime: every write, truncation, ``utime`` (``touch``) or rename sets it to the current
time, and no system call sets it back, so a file rewritten in any way (even in its middle with
its mtime restored) gets a new key and is read afresh.  One race remains with any timestamp: a
write in the same clock tick as the scan that read the file; so a file whose ctime is less than
:data:`INDEX_SETTLE_NS` (2 s) older than the open is not cached (it is read again on every open
until it settles).  What defeats the key: changing the bytes without the kernel (a raw block
device, a file system that does not keep ctime) or setting the system clock back; ``verify()``
still re-derives the index from the files and removes a stale cache entry.

``verify()`` checks the structure again, then reads every byte of the source files and compares
CRC-32s of 16 MiB blocks with a sidecar (:mod:`mmpack._src.formats.sidecar`); ``verify_reads=True``
checks each block of the token file against it on first read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.formats.sidecar import (
    CHECKSUM_FILE,
    SidecarReads,
    Sums,
    compare_sums,
    file_sums,
    load_sidecar,
    save_sidecar,
)
from mmpack._src.store.backends import Backend
from mmpack._src.store.backends._mapping import map_file
from mmpack._src.store.format import STRIPE_BYTES, StoreMeta
from mmpack._src.store.reader import TokenStore, reopen_pickled
from mmpack.errors import FormatError

__all__ = [
    "ForeignStore",
    "INDEX_SETTLE_NS",
    "TokenSource",
    "cache_root",
    "file_identity",
    "load_index",
    "map_tokens",
    "recently_changed",
    "save_index",
]

_IDENTITY_BYTES = 1 << 20
INDEX_SETTLE_NS = 2_000_000_000
"""A source file whose ctime is less than this before an open is not cached (see the module
docstring: a write in the clock tick of the scan would keep its ctime)."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The local folder under which foreign stores keep derived files (see the module doc)."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(
                f"cache_dir must be a str or os.PathLike, got {type(cache_dir).__name__}"
            )
        return Path(cache_dir)
    env = os.environ.get("MMPACK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mmpack"


def file_identity(path: Path) -> dict[str, Any]:
    """Size, mtime_ns, inode, ctime_ns and a SHA-256 of the first and last MiB of ``path``:
    cheap (one ``fstat``, two small reads); any change of the file's bytes through the kernel
    sets a new ctime (see the module docstring for what this trusts)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(_IDENTITY_BYTES))
        if st.st_size > _IDENTITY_BYTES:
            f.seek(max(_IDENTITY_BYTES, st.st_size - _IDENTITY_BYTES))
            h.update(f.read())
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
        "head_tail_sha256": h.hexdigest(),
    }


def recently_changed(started_ns: int, *identities: dict[str, Any] | None) -> bool:
    """Whether a file of ``identities`` (:func:`file_identity`, read after ``started_ns``, a
    ``time.time_ns()``) changed less than :data:`INDEX_SETTLE_NS` before: its index must not be
    cached (a ctime in the future, another machine's clock, counts as recent)."""
    return any(
        ident is not None and started_ns - int(ident["ctime_ns"]) < INDEX_SETTLE_NS
        for ident in identities
    )


def _index_files(root: Path, key: dict[str, Any]) -> tuple[Path, Path]:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return root / f"index-{digest}.npy", root / f"index-{digest}.json"


def load_index(
    root: Path, key: dict[str, Any], num_tokens: int
) -> tuple[np.ndarray, dict[str, Any]] | None:
    """A derived ``offsets`` cached by :func:`save_index` under ``key`` (a JSON-able description
    of the source's identity), mapped read-only, with its record; None when absent, unreadable
    or inconsistent (``offsets[-1] != num_tokens``) - the caller then rebuilds it."""
    index_file, record_file = _index_files(root, key)
    try:
        record = json.loads(record_file.read_text())
        if record.get("key") != json.loads(json.dumps(key)):
            return None
        offsets = _map_npy(index_file)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if (
        offsets.dtype != np.int64
        or offsets.ndim != 1
        or offsets.shape[0] < 1
        or offsets[0] != 0
        or offsets[-1] != num_tokens
    ):
        return None
    return offsets.view(np.ndarray), record


def _map_npy(path: Path) -> np.ndarray:
    """A 1-D ``.npy`` file mapped read-only without keeping its descriptor (``np.load`` with
    ``mmap_mode`` keeps one per file)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = (
            np.lib.format.read_array_header_1_0(f)
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0(f)
        )
        header = f.tell()
        if (
            len(shape) != 1
            or fortran
            or os.fstat(f.fileno()).st_size != header + shape[0] * dtype.itemsize
        ):
            raise ValueError(f"{path}: not a whole 1-D array")
        if shape[0] == 0:
            return np.empty(0, dtype=dtype)
        return map_file(f.fileno(), header, shape[0] * dtype.itemsize).view(dtype)


def _drop_index(root: Path, key: dict[str, Any]) -> None:
    """Remove the cached index of ``key`` (found stale by ``verify()``)."""
    for p in _index_files(root, key):
        with contextlib.suppress(OSError):
            p.unlink(missing_ok=True)


def save_index(
    root: Path, key: dict[str, Any], offsets: np.ndarray, record: dict[str, Any]
) -> Path | None:
    """Write ``offsets`` and ``record`` (plus ``key``) atomically under ``root``; the record is
    written last, so a half-written index is never loaded.  A cache that cannot be written
    (read-only home, full disk) only warns: the store opens all the same, uncached."""
    index_file, record_file = _index_files(root, key)
    unique = uuid.uuid4().hex[:12]  # concurrent openers (processes or threads) never collide
    tmps = [p.with_name(f".{p.name}.tmp-{unique}") for p in (index_file, record_file)]
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(tmps[0], "wb") as f:
            np.save(f, np.ascontiguousarray(offsets, dtype=np.int64))
        os.replace(tmps[0], index_file)
        with open(tmps[1], "w") as f:
            json.dump({**record, "key": key}, f)
        os.replace(tmps[1], record_file)
    except OSError as exc:
        warnings.warn(
            f"could not cache the document index in {root} ({exc}); set "
            "cache_dir= or $MMPACK_CACHE_DIR to a writable folder",
            stacklevel=3,
        )
        return None
    finally:
        for t in tmps:
            with contextlib.suppress(OSError):
                t.unlink(missing_ok=True)
    return index_file


def map_tokens(path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` at byte ``offset`` of ``path`` as a read-only mapping (no
    copy, no file descriptor kept: :mod:`mmpack._src.store.backends._mapping`)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    with open(path, "rb") as f:
        return map_file(f.fileno(), offset, count * dtype.itemsize).view(dtype)


class _FlatBackend(Backend):
    """Tokens as one mapped array and an in-memory (or mapped) int64 ``offsets``."""

    name = "foreign"
    tokens: np.ndarray

    def __init__(
        self, path: Path, meta: StoreMeta, tokens: np.ndarray, offsets: np.ndarray
    ) -> None:
        super().__init__(path, meta)
        self.tokens = tokens
        offsets.flags.writeable = False
        self._offsets = offsets

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        return None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        raise TypeError("foreign stores are read-only; write mmpack stores with mmpack.build")

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def read_range(self, start: int, stop: int) -> np.ndarray:
        return self.tokens[start:stop]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens, starts


@dataclass(frozen=True)
class TokenSource:
    """The file a foreign store's tokens are mapped from: its path, its bytes before the first
    token (a ``.npy`` header; empty otherwise) and its own dtype (signed files are served
    unsigned: :mod:`mmpack._src.formats.token_ids`)."""

    path: Path
    header: bytes
    file_dtype: np.dtype


class ForeignStore(TokenStore):
    """A :class:`TokenStore` over files written by another tool (read-only, mapped in place).

    Subclasses set ``kind`` (the ``format=`` name) and implement :meth:`_check_structure`.
    With ``verify_reads`` every block of the token file is checked against the checksum sidecar
    the first time a read touches it (the sidecar is recorded now, reading every file once, if
    there is none yet; the other source files, consumed at open, are checked in full now).
    """

    kind = "foreign"

    def __init__(
        self,
        path: Path,
        *,
        dtype: np.dtype,
        tokens: np.ndarray,
        offsets: np.ndarray,
        fingerprint: str,
        source_files: tuple[Path, ...],
        token_source: TokenSource,
        info: dict[str, Any],
        location: str,
        cache_dir: str | os.PathLike[str] | None,
        open_options: dict[str, Any],
        index_cache: tuple[Path, dict[str, Any]] | None = None,
        verify_reads: bool = False,
    ) -> None:
        num_docs = int(offsets.shape[0]) - 1
        meta = StoreMeta(
            backend=self.kind,
            dtype=dtype,
            num_docs=num_docs,
            num_tokens=int(tokens.shape[0]),
            block_bytes=STRIPE_BYTES,
            tokens_digests=(),
            offsets_crc32=(),
        )
        raw = {
            "format": self.kind,
            "version": info.get("version"),
            "backend": self.kind,
            "dtype": dtype.str,
            "num_docs": num_docs,
            "num_tokens": meta.num_tokens,
            "fingerprint": fingerprint,
            "source": info,
        }
        self._fingerprint = fingerprint
        self._index_cache = index_cache
        self._source_files = source_files
        self._token_source = token_source
        self._sums: dict[str, Sums] | None = None  # recorded sums kept in memory
        backend = _FlatBackend(path, meta, tokens, offsets)
        reads = None
        if verify_reads:
            reads = SidecarReads(
                token_source.path, token_source.header, tokens, token_source.file_dtype
            )
        super().__init__(
            path,
            meta,
            raw,
            backend,
            location=location,
            cache_dir=cache_root(cache_dir) / self.kind / fingerprint,
            open_options=open_options,
            verify_reads=verify_reads,
            read_checker=reads,
        )
        if reads is not None:
            self._start_verified_reads(reads)

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the content (see the opener of each kind)."""
        return self._fingerprint

    @property
    def extra(self) -> dict[str, Any]:
        """Empty: another tool's files carry no optional mmpack sections (their record
        describes the files, ``"source"``)."""
        return {}

    @property
    def source_files(self) -> tuple[Path, ...]:
        """The user's files this store reads (never written by mmpack)."""
        return self._source_files

    def _check_structure(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def _mapped(self) -> np.ndarray:
        """The mapped tokens (also with ``verify_reads``, where :attr:`tokens` is None)."""
        tokens = self._backend.tokens
        assert tokens is not None  # a foreign store's backend maps its tokens
        return tokens

    def _recorded(self) -> tuple[dict[str, Sums] | None, str]:
        """The recorded sums (the sidecar's, else those kept in memory, else None) and where
        they are (for messages)."""
        sidecar = self.cache_dir / CHECKSUM_FILE
        on_disk = load_sidecar(sidecar)
        if on_disk is not None or self._sums is None:
            return on_disk, str(sidecar)
        return self._sums, "memory (the sidecar could not be kept)"

    def _start_verified_reads(self, reads: SidecarReads) -> None:
        recorded, where = self._recorded()
        if recorded is None:
            self.verify()  # records the sums (the files are trusted now)
            recorded, where = self._recorded()
            assert recorded is not None
        else:
            others = {
                p.name: file_sums(p) for p in self._source_files if p != self._token_source.path
            }
            compare_sums(others, recorded, where)
        reads.expect(recorded, where)

    def verify(self, *, progress: Any = False) -> dict[str, Any]:
        """Check the structure, then every byte of the source files against the checksum sidecar
        (recorded by the first call, ``"recorded": True``; ``"sidecar"`` is None when the cache
        folder cannot be written, with a warning: the sums are then kept in memory).
        ``progress``: a bar over the source files' bytes (as :meth:`TokenStore.verify`).

        Raises
        ------
        FormatError
            The structure is wrong, or a block differs from the recorded sidecar (naming the file
            and its byte range).
        """
        try:
            extra = self._check_structure()
        except FormatError as exc:
            if self._index_cache is None:
                raise
            _drop_index(*self._index_cache)
            raise FormatError(
                f"{exc} (the cached document index was removed: opening again reads the files "
                "afresh)"
            ) from None
        sidecar = self.cache_dir / CHECKSUM_FILE
        total = sum(p.stat().st_size for p in self._source_files)
        with progress_bar(progress, total, desc="verifying") as bar:
            current = {p.name: file_sums(p, bar.update) for p in self._source_files}
        recorded, where = self._recorded()
        kept = self._sums is None or sidecar.is_file()
        if recorded is not None:
            compare_sums(current, recorded, where)
        else:
            self._sums = current
            kept = save_sidecar(sidecar, self.fingerprint, current)
        return {
            "blocks": sum(len(c) for _, c in current.values()),
            "bytes": sum(size for size, _ in current.values()),
            "recorded": recorded is None,
            "sidecar": str(sidecar) if kept else None,
            **extra,
        }

    def __getstate__(self) -> dict[str, Any]:
        options = dict(self._open_options)
        if self.verify_reads:
            options["verify_reads"] = True
        return {
            "kind": self.kind,
            "location": self._location,
            "options": options,
            "fingerprint": self._fingerprint,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        current = reopen_pickled(
            state["location"],
            state["fingerprint"],
            f"the {state['kind']} data",
            "changed",
            format=state["kind"],
            **state["options"],
        )
        self.__dict__.update(current.__dict__)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._location!r}, docs={len(self)}, "
            f"tokens={self.num_tokens}, dtype={self.dtype.name})"
        )
