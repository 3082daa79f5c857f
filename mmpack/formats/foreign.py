"""What the foreign stores share: a store over files another tool wrote, served in place.

The files are mapped read-only (no byte is copied); ``offsets`` is derived from the other
tool's index (Megatron) or from one scan of the tokens (EOS-separated files).  Nothing is ever
written beside the user's files: derived indexes, packing plans and checksum sidecars live in a
local cache folder, ``cache_root() / <kind> / <fingerprint>``, where ``cache_root()`` is the
``cache_dir=`` open option, else ``$MMPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/mmpack``, else
``~/.cache/mmpack``.

``verify()`` checks the structure again, then reads every byte of the source files and compares
CRC-32s of 16 MiB blocks with a sidecar (``checksums.json`` in the store's cache folder).  The
first ``verify()`` records the sidecar (the files are trusted then); later ones check against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError
from mmpack.store.backends import Backend
from mmpack.store.format import BLOCK_BYTES, StoreMeta, write_json_atomic
from mmpack.store.reader import TokenStore, reopen_pickled

__all__ = [
    "CHECKSUM_FILE",
    "FlatBackend",
    "ForeignStore",
    "cache_root",
    "drop_index",
    "file_identity",
    "load_index",
    "map_tokens",
    "save_index",
    "unsigned_view_dtype",
]

CHECKSUM_FILE = "checksums.json"
_IDENTITY_BYTES = 1 << 20


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
    """Size, mtime_ns, inode and a SHA-256 of the first and last MiB of ``path``: cheap (two
    small reads) and changes whenever the file is replaced or rewritten in the usual ways."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(_IDENTITY_BYTES))
        if st.st_size > _IDENTITY_BYTES:
            f.seek(max(_IDENTITY_BYTES, st.st_size - _IDENTITY_BYTES))
            h.update(f.read())
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "head_tail_sha256": h.hexdigest(),
    }


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
        offsets = np.load(index_file, mmap_mode="r")
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


def drop_index(root: Path, key: dict[str, Any]) -> None:
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


def unsigned_view_dtype(dtype: np.dtype, where: str) -> np.dtype:
    """The little-endian unsigned dtype of the same width that serves a file's tokens.

    Token ids are never negative, so an int32 file (Megatron's default) is served as ``<u4``
    over the same bytes (zero copy); ``verify()`` checks that no stored id is negative."""
    if dtype.kind not in "ui":
        raise FormatError(f"{where}: tokens of dtype {dtype} are not token ids (integers expected)")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        raise FormatError(f"{where}: big-endian tokens ({dtype.str}) are not supported")
    return np.dtype(f"<u{dtype.itemsize}")


def map_tokens(path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` at byte ``offset`` of ``path`` as a read-only mapping (no
    copy: the array's base is the file's mmap)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    with open(path, "rb") as f:
        arr = np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=(count,))
    return arr.view(np.ndarray)


class FlatBackend(Backend):
    """Tokens as one mapped array and an in-memory (or mapped) int64 ``offsets``."""

    name = "foreign"

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


class ForeignStore(TokenStore):
    """A :class:`TokenStore` over files written by another tool (read-only, mapped in place).

    Subclasses set ``kind`` (the ``format=`` name) and implement :meth:`_check_structure`.
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
        info: dict[str, Any],
        location: str,
        cache_dir: str | os.PathLike[str] | None,
        open_options: dict[str, Any],
        index_cache: tuple[Path, dict[str, Any]] | None = None,
    ) -> None:
        num_docs = int(offsets.shape[0]) - 1
        meta = StoreMeta(
            backend=self.kind,
            dtype=dtype,
            num_docs=num_docs,
            num_tokens=int(tokens.shape[0]),
            block_bytes=BLOCK_BYTES,
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
        backend = FlatBackend(path, meta, tokens, offsets)
        super().__init__(
            path,
            meta,
            raw,
            backend,
            location=location,
            cache_dir=cache_root(cache_dir) / self.kind / fingerprint,
            open_options=open_options,
        )

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the content (see the opener of each kind)."""
        return self._fingerprint

    @property
    def source_files(self) -> tuple[Path, ...]:
        """The user's files this store reads (never written by mmpack)."""
        return self._source_files

    def _check_structure(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def verify(self) -> dict[str, Any]:
        """Check the structure, then every byte of the source files against the checksum sidecar
        (recorded by the first call; ``"recorded": True`` says so).

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
            drop_index(*self._index_cache)
            raise FormatError(
                f"{exc} (the cached document index was removed: opening again reads the files "
                "afresh)"
            ) from None
        sidecar = self.cache_dir / CHECKSUM_FILE
        current = {p.name: _file_crcs(p) for p in self._source_files}
        recorded = None
        if sidecar.is_file():
            try:
                recorded = json.loads(sidecar.read_text())["files"]
            except (ValueError, KeyError, TypeError) as exc:
                raise FormatError(
                    f"{sidecar}: unreadable checksum sidecar ({exc}); delete it to record a new one"
                ) from None
        if recorded is not None:
            for name, (size, crcs) in current.items():
                if name not in recorded:
                    raise FormatError(f"{sidecar} has no checksums for {name}; delete it")
                rsize, rcrcs = recorded[name]
                if rsize != size:
                    raise FormatError(
                        f"{name} holds {size} bytes but {rsize} when its checksums "
                        "were recorded: the file was modified"
                    )
                for b, (got, want) in enumerate(zip(crcs, rcrcs)):
                    if got != want:
                        lo = b * BLOCK_BYTES
                        raise FormatError(
                            f"{name} block {b} (bytes {lo}..{min(size, lo + BLOCK_BYTES)}) "
                            f"differs from the checksum recorded in {sidecar} "
                            f"({want:#010x} then, {got:#010x} now): the file was modified or "
                            "corrupted"
                        )
        else:
            sidecar.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(
                sidecar,
                {
                    "algorithm": "crc32",
                    "block_bytes": BLOCK_BYTES,
                    "fingerprint": self.fingerprint,
                    "files": current,
                },
            )
        blocks = sum(len(c) for _, c in current.values())
        nbytes = sum(s for s, _ in current.values())
        return {
            "blocks": blocks,
            "bytes": nbytes,
            "recorded": recorded is None,
            "sidecar": str(sidecar),
            **extra,
        }

    def __getstate__(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "location": self._location,
            "options": self._open_options,
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


def _file_crcs(path: Path) -> tuple[int, list[int]]:
    crcs = []
    size = 0
    buf = bytearray(BLOCK_BYTES)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = 0
            while n < BLOCK_BYTES:  # fill the whole block: short reads must not shift blocks
                got = f.readinto(memoryview(buf)[n:])
                if not got:
                    break
                n += got
            if not n:
                break
            crcs.append(zlib.crc32(memoryview(buf)[:n]))
            size += n
    return size, crcs
