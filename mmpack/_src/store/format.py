"""The on-disk format of a token store: metadata, dtypes, block checksums, validation.

A store is a folder holding two logical arrays and a small JSON metadata record::

    tokens   shape (num_tokens,)   unsigned int, little-endian ('<u1', '<u2', '<u4' or '<u8')
    offsets  shape (num_docs + 1,) int64, little-endian; offsets[0] == 0,
             offsets[j + 1] - offsets[j] == length of document j, offsets[-1] == num_tokens

Explicitly little-endian, so a store reads identically on any machine.  Integrity: each array's
bytes are cut into blocks of ``block_bytes`` (16 MiB) and every block's digest is recorded
(``checksum.tokens``: XXH64, ``checksum.algorithm`` ``"xxh64"``, the only one read;
``checksum.offsets``: CRC-32, :func:`crc32_blocks`); ``verify()`` recomputes them (cost:
``python -m benchmarks.bench_store``, docs/benchmarks.md).  The *fingerprint* hashes the dtype,
the counts and every digest: it identifies the content without reading data and keys plans and
sampler states.  ``files`` lists the files a build wrote besides the layout's own.

A loss mask is a second store of the same layout in the folder (:data:`LOSS_MASK_STORE`, uint8
0/1 tokens, same offsets), named by its fingerprint in ``loss_mask``; per-document fields
(:mod:`mmpack._src.store.fields`) are ``field.<name>.bin`` files listed with their CRC-32 in
``fields``.  The fingerprint covers both.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mmpack._src.core.validation import check_dtype
from mmpack._src.store.fields import FieldSpec, fields_record, parse_fields_record
from mmpack.errors import FormatError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LOSS_MASK_STORE",
    "META_FILE",
    "OFFSETS_DTYPE",
    "RECORD_KEYS",
    "STRIPE_BYTES",
    "StoreMeta",
    "StripeChecksum",
    "TOKEN_DTYPES",
    "atomic_file",
    "check_count",
    "check_version",
    "normalize_token_dtype",
    "plain_file_name",
    "smallest_token_dtype",
    "write_json_atomic",
]

FORMAT_NAME = "mmpack-token-store"
FORMAT_VERSION = 1
META_FILE = "mmpack.json"
LOSS_MASK_STORE = "loss_mask"
"""The folder (or object prefix) of a store's loss mask store, inside the store's own."""
STRIPE_BYTES = 16 << 20
TOKENS_CHECKSUM = "xxh64"
"""The digest of the token blocks (``checksum.algorithm``): XXH64, seed 0; a record naming
another is refused."""

# Explicit little-endian: the bytes on disk must not depend on the writing machine.
TOKEN_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(s) for s in ("<u1", "<u2", "<u4", "<u8"))
OFFSETS_DTYPE = np.dtype("<i8")

RECORD_KEYS = frozenset(
    ("format", "version", "backend", "dtype", "num_docs", "num_tokens", "checksum", "files")
    + ("fingerprint", "remote", "fields", "loss_mask")
)
"""The keys of a metadata record that describe the store itself (:meth:`StoreMeta.to_json`, and
the ``"remote"`` record of a store's objects); the others are optional sections
(``"tokenizer"``, ``"provenance"``...)."""

_KNOWN_BACKENDS: set[str] = {"memmap", "zarr"}
"""Backend names a metadata record may carry (a backend module adds its own name here)."""


def smallest_token_dtype(max_token: int) -> np.dtype:
    """The narrowest unsigned little-endian dtype that holds ``max_token`` (>= 0)."""
    for dt in TOKEN_DTYPES:
        if max_token <= np.iinfo(dt).max:
            return dt
    raise ValueError(f"token {max_token} does not fit in 64 bits")


def normalize_token_dtype(dtype: Any) -> np.dtype:
    """Validate a user-given token dtype and return its little-endian form."""
    dt = check_dtype(dtype)
    if dt.kind != "u":
        raise ValueError(
            f"dtype={dtype!r} is not supported: token dtypes are unsigned integers "
            "(uint8, uint16, uint32, uint64)"
        )
    return dt.newbyteorder("<")


def crc32_blocks(data: bytes | memoryview, block: int) -> list[int]:
    """CRC-32 of every ``block`` bytes of ``data`` (the last piece may be short): the digests
    of an offsets array (``checksum.offsets``, a join's global offsets)."""
    mv = memoryview(data).cast("B")
    return [zlib.crc32(mv[i : i + block]) for i in range(0, len(mv), block)]


class StripeChecksum:
    """Incremental CRC-32 over consecutive blocks of ``block_bytes`` of a byte stream (the
    offsets as a build writes them; :func:`crc32_blocks` of the whole)."""

    def __init__(self, block_bytes: int = STRIPE_BYTES) -> None:
        self.block_bytes = block_bytes
        self.crcs: list[int] = []
        self._crc = 0
        self._filled = 0

    def update(self, data: memoryview | bytes | np.ndarray) -> None:
        mv = memoryview(data).cast("B")  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
        while len(mv):
            take = min(len(mv), self.block_bytes - self._filled)
            self._crc = zlib.crc32(mv[:take], self._crc)
            self._filled += take
            mv = mv[take:]
            if self._filled == self.block_bytes:
                self.crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def finish(self) -> list[int]:
        if self._filled:
            self.crcs.append(self._crc)
            self._crc, self._filled = 0, 0
        return self.crcs


@dataclass(frozen=True)
class StoreMeta:
    """The validated metadata record of a store (``mmpack.json`` or the Zarr group attributes)."""

    backend: str
    dtype: np.dtype
    num_docs: int
    num_tokens: int
    block_bytes: int
    tokens_digests: tuple[int, ...]
    """The XXH64 of every ``block_bytes`` of the tokens' bytes."""
    offsets_crc32: tuple[int, ...]
    """The CRC-32 of every ``block_bytes`` of the offsets' bytes (CRC-32 in every store)."""
    files: tuple[str, ...] = ()
    """The files a build wrote into the store folder besides its layout's (e.g.
    ``tokenizer.json``), sorted: the store's own, which ``overwrite`` replaces with it
    (:func:`mmpack._src.store.publish.check_replaceable`).  Not part of the fingerprint."""
    loss_mask: str | None = None
    """The fingerprint of the store's loss mask store (:data:`LOSS_MASK_STORE`), or None for a
    store without a loss mask.  Part of the fingerprint."""
    fields: tuple[FieldSpec, ...] = ()
    """The per-document fields (:mod:`mmpack._src.store.fields`), in order.  Part of the
    fingerprint."""

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the content (dtype, counts and checksums)."""
        fields: list[Any] = [
            self.dtype.str,
            self.num_docs,
            self.num_tokens,
            self.block_bytes,
            list(self.tokens_digests),
            list(self.offsets_crc32),
            TOKENS_CHECKSUM,
        ]
        if self.loss_mask is not None:
            fields.append(["loss_mask", self.loss_mask])
        if self.fields:
            fields.append(["fields", fields_record(self.fields)])
        payload = json.dumps(fields, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "backend": self.backend,
            "dtype": self.dtype.str,
            "num_docs": self.num_docs,
            "num_tokens": self.num_tokens,
            "checksum": {
                "algorithm": TOKENS_CHECKSUM,
                "block_bytes": self.block_bytes,
                "tokens": list(self.tokens_digests),
                "offsets": list(self.offsets_crc32),
            },
        }
        if self.files:
            record["files"] = list(self.files)
        if self.loss_mask is not None:
            record["loss_mask"] = {"store": LOSS_MASK_STORE, "fingerprint": self.loss_mask}
        if self.fields:
            record["fields"] = fields_record(self.fields)
        record["fingerprint"] = self.fingerprint
        return record

    @classmethod
    def from_json(cls, obj: Any, where: Path) -> StoreMeta:
        """Parse and validate a metadata record; any defect is a :class:`FormatError`."""
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: metadata is not a JSON object")
        if obj.get("format") != FORMAT_NAME:
            raise FormatError(f"{where}: format is {obj.get('format')!r}, expected {FORMAT_NAME!r}")
        check_version(obj.get("version"), FORMAT_VERSION, where)
        try:
            dtype = np.dtype(obj["dtype"])
            checksum = obj["checksum"]
            meta = cls(
                backend=str(obj["backend"]),
                dtype=dtype,
                num_docs=check_count(obj["num_docs"], "num_docs", where),
                num_tokens=check_count(obj["num_tokens"], "num_tokens", where),
                block_bytes=check_count(checksum["block_bytes"], "block_bytes", where),
                tokens_digests=tuple(check_count(c, "checksum", where) for c in checksum["tokens"]),
                offsets_crc32=tuple(check_count(c, "checksum", where) for c in checksum["offsets"]),
                files=_listed_files(obj.get("files", []), where),
                loss_mask=_loss_mask_record(obj.get("loss_mask"), where),
                fields=parse_fields_record(obj.get("fields"), where),
            )
        except (KeyError, TypeError) as exc:
            raise FormatError(f"{where}: metadata field missing or malformed: {exc!r}") from exc
        if dtype not in TOKEN_DTYPES or dtype.byteorder == ">":
            raise FormatError(f"{where}: unsupported token dtype {obj['dtype']!r}")
        if checksum.get("algorithm") != TOKENS_CHECKSUM:
            raise FormatError(
                f"{where}: unsupported checksum record {checksum.get('algorithm')!r}: the token "
                f"blocks' checksum is {TOKENS_CHECKSUM!r}; rebuild the store"
            )
        if meta.block_bytes < 1:
            raise FormatError(f"{where}: unsupported checksum record (block_bytes 0)")
        if meta.backend not in _KNOWN_BACKENDS:
            raise FormatError(f"{where}: unknown backend {meta.backend!r}")
        for name, nbytes, digests in (
            ("tokens", meta.num_tokens * dtype.itemsize, meta.tokens_digests),
            ("offsets", (meta.num_docs + 1) * 8, meta.offsets_crc32),
        ):
            if len(digests) != -(-nbytes // meta.block_bytes):
                raise FormatError(
                    f"{where}: {len(digests)} {name} checksums for {nbytes} bytes "
                    f"(block size {meta.block_bytes})"
                )
        stated = obj.get("fingerprint")
        if stated is not None and stated != meta.fingerprint:
            raise FormatError(f"{where}: fingerprint {stated!r} does not match the metadata")
        return meta


def plain_file_name(name: Any) -> bool:
    """Whether ``name`` may name a file of a store folder: a non-empty string with no path
    separator or NUL, not hidden (``.``-names are mmpack's temporary and lock files)."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(".")
        and not any(c in name for c in "/\\\0")
    )


def _listed_files(files: Any, where: Path) -> tuple[str, ...]:
    """The ``files`` field of a metadata record: a list of distinct plain file names."""
    if not isinstance(files, list) or not all(map(plain_file_name, files)):
        raise FormatError(f"{where}: files must be a list of file names, got {files!r}")
    if len(set(files)) != len(files):
        raise FormatError(f"{where}: files lists a name twice: {files!r}")
    return tuple(files)


def _loss_mask_record(rec: Any, where: Path) -> str | None:
    """The ``loss_mask`` field of a metadata record: absent, or ``{"store": "loss_mask",
    "fingerprint": <16 hex digits>}``; the fingerprint is returned."""
    if rec is None:
        return None
    fp = rec.get("fingerprint") if isinstance(rec, dict) else None
    if (
        not isinstance(rec, dict)
        or rec.get("store") != LOSS_MASK_STORE
        or not isinstance(fp, str)
        or len(fp) != 16
        or any(c not in "0123456789abcdef" for c in fp)
    ):
        raise FormatError(f"{where}: malformed loss_mask record {rec!r}")
    return fp


def check_version(version: Any, newest: int, where: Path, what: str = "format") -> int:
    """A ``what`` version read from a file (``where``): an int from 1 to ``newest``;
    :class:`FormatError` otherwise (a newer version says to upgrade mmpack)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise FormatError(f"{where}: invalid {what} version {version!r}")
    if version > newest:
        raise FormatError(
            f"{where}: {what} version {version} was written by a newer mmpack; this one "
            f"reads versions up to {newest} (upgrade mmpack)"
        )
    return version


def check_count(value: Any, name: str, where: Path) -> int:
    """A count read from a file (``where``): a non-negative int; :class:`FormatError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FormatError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return value


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A new file to become ``path``: a temporary file beside it, opened ``"w+b"``; on a clean
    exit it is flushed, fsynced (unless ``fsync=False``) and renamed onto ``path`` (a reader sees
    the old file or the whole new one, never a part of it); on any error it is removed and the
    error raised.  The one rule of mmpack's file writers; the folder must exist.  The file's
    permissions are those of ``open(path, "w")`` (0o666 less the umask)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON (indented by 1) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as f:
        f.write(json.dumps(obj, indent=1).encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (its folder created) through :func:`atomic_file`, not fsynced
    (a cache's copy: a reader sees the old file or the whole new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, fsync=False) as f:
        f.write(data)
