"""Megatron-LM ``PREFIX.bin`` + ``PREFIX.idx`` datasets, opened in place.

The ``.idx`` layout (Megatron-core's ``indexed_dataset``; every integer little-endian)::

    magic      9 bytes   b"MMIDIDX\\x00\\x00"
    version    uint64    1
    dtype      uint8     1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    S, D       uint64    sequence count, document-index count (documents + 1)
    lengths    int32[S]  tokens per sequence
    pointers   int64[S]  byte offset of each sequence in the .bin
    doc_index  int64[D]  document d is the sequences doc_index[d] .. doc_index[d + 1] - 1
    modes      int8[S]   only in multimodal datasets (refused here)

mmpack's documents are Megatron's documents: ``offsets`` is each sequence's token offset
(pointer / itemsize, then the total) taken at ``doc_index``.  Opening maps the ``.idx`` and the
``.bin`` (no byte of the ``.bin`` is read) and checks in one vectorized pass that the sizes match
the counts, ``doc_index`` runs from 0 to S without decreasing, no length is negative and the
pointers are contiguous in order.  Signed token dtypes (int32, Megatron's default) are served as
the unsigned dtype of the same width; ``verify()`` and ``verify_reads=True`` check no id is
negative.  Fingerprint: SHA-256 of the ``.idx`` bytes and the ``.bin`` size (a ``.bin``
rewritten with the same size is caught by ``verify()``'s checksum sidecar).

Cost: the first open validates and hashes the index, caching ``offsets`` and the fingerprint
(``cache_root()/megatron/``); a reopen maps them (``python -m benchmarks.bench_foreign``).
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.formats.foreign import (
    ForeignStore,
    TokenSource,
    cache_root,
    file_identity,
    load_index,
    map_tokens,
    recently_changed,
    save_index,
)
from mmpack._src.formats.token_ids import check_ids_nonnegative, unsigned_view_dtype
from mmpack._src.store.backends._mapping import map_file
from mmpack.errors import FormatError, StoreNotFoundError

__all__ = [
    "HEADER_BYTES",
    "MAGIC",
    "MegatronIndex",
    "MegatronStore",
    "detect_megatron",
    "megatron_paths",
    "open_megatron",
    "read_index",
]

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34  # magic 9 + version 8 + dtype code 1 + S 8 + D 8
_DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("<u1"),
    2: np.dtype("<i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
"""Megatron-core's ``DType`` codes."""


def megatron_paths(location: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    """``(prefix, prefix.bin, prefix.idx)`` for a prefix or for the path of either file."""
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(location).__name__}")
    text = os.fspath(location)
    if text.endswith((".bin", ".idx")):
        text = text[:-4]
    return Path(text), Path(text + ".bin"), Path(text + ".idx")


def detect_megatron(path: Path) -> str | None:
    """``"megatron"`` when ``path`` is a prefix (or a ``.bin``/``.idx``) with a ``.idx`` beside it."""
    _, _, idx = megatron_paths(path)
    return "megatron" if idx.is_file() else None


class MegatronIndex:
    """A parsed, validated ``.idx`` (arrays are read-only views of its mapping)."""

    def __init__(self, idx_path: Path) -> None:
        if not idx_path.is_file():
            raise StoreNotFoundError(f"no Megatron index at {str(idx_path)!r}")
        with open(idx_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES or head[:9] != MAGIC:
                raise FormatError(
                    f"{idx_path}: not a Megatron index (expected the magic "
                    f"{MAGIC!r}, got {head[:9]!r})"
                )
            version, code, seqs, docs = struct.unpack("<QBQQ", head[9:])
            if version != 1:
                raise FormatError(
                    f"{idx_path}: Megatron index version {version}; this mmpack reads version 1"
                )
            if code not in _DTYPE_CODES:
                raise FormatError(f"{idx_path}: unknown Megatron dtype code {code}")
            expected = HEADER_BYTES + 12 * seqs + 8 * docs
            if size == expected + seqs and seqs > 0:
                raise FormatError(
                    f"{idx_path}: a multimodal Megatron index (a mode per sequence follows the "
                    "document index); mmpack serves token-only datasets and refuses it"
                )
            if size != expected:
                raise FormatError(
                    f"{idx_path} holds {size} bytes but its header ({seqs} sequences, {docs} "
                    f"document indices) implies {expected}: truncated or not understood"
                )
            if docs < 1:
                raise FormatError(f"{idx_path}: an empty document index (it must start with 0)")
            raw = map_file(f.fileno(), 0, size)  # no descriptor kept
        self.path = idx_path
        self.size = size
        self.version = version
        self.dtype_code = code
        self.dtype = _DTYPE_CODES[code]
        self.sequence_count = seqs
        self.document_count = docs - 1
        self.raw = raw
        o = HEADER_BYTES
        self.sequence_lengths = raw[o : o + 4 * seqs].view("<i4")
        o += 4 * seqs
        self.sequence_pointers = raw[o : o + 8 * seqs].view("<i8")
        o += 8 * seqs
        self.document_indices = raw[o : o + 8 * docs].view("<i8")

    def token_offsets(self) -> tuple[np.ndarray, int]:
        """Validate the arrays; return ``(offsets, num_tokens)``: the int64 token offset of every
        document boundary (shape (documents + 1,)) and the total token count."""
        where = self.path
        lens, ptrs, di = self.sequence_lengths, self.sequence_pointers, self.document_indices
        if di[0] != 0 or di[-1] != self.sequence_count:
            raise FormatError(
                f"{where}: the document index runs {int(di[0])}..{int(di[-1])}, "
                f"expected 0..{self.sequence_count} (the sequence count)"
            )
        bad = np.flatnonzero(di[1:] < di[:-1])
        if bad.size:
            raise FormatError(f"{where}: the document index decreases at document {int(bad[0])}")
        if lens.size and int(lens.min()) < 0:
            k = int(np.argmin(lens))
            raise FormatError(f"{where}: sequence {k} has negative length {int(lens[k])}")
        itemsize = self.dtype.itemsize
        starts = np.empty(self.sequence_count + 1, dtype=np.int64)
        starts[0] = 0
        np.cumsum(lens, dtype=np.int64, out=starts[1:])
        num_tokens = int(starts[-1])
        if self.sequence_count:
            stray = np.flatnonzero(ptrs != starts[:-1] * itemsize)
            if stray.size:
                k = int(stray[0])
                raise FormatError(
                    f"{where}: sequence {k} starts at byte {int(ptrs[k])} of the .bin but the "
                    f"sequences before it end at byte {int(starts[k]) * itemsize}; mmpack serves "
                    "the .bin as one flat array and refuses pointers that are not contiguous "
                    "in order (Megatron's builder always writes them so)"
                )
        return starts[di], num_tokens


def read_index(location: str | os.PathLike[str]) -> MegatronIndex:
    """Parse the ``.idx`` of a prefix (or of a ``.bin``/``.idx`` path)."""
    return MegatronIndex(megatron_paths(location)[2])


class MegatronStore(ForeignStore):
    """A Megatron dataset served in place (see the module docstring)."""

    kind = "megatron"

    def _check_structure(self) -> dict[str, Any]:
        _, bin_path, idx_path = megatron_paths(self.location)
        index = MegatronIndex(idx_path)
        offsets, num_tokens = index.token_offsets()
        if not np.array_equal(offsets, self.offsets):
            raise FormatError(f"{idx_path} changed since the store was opened")
        size = _check_bin(bin_path, num_tokens, index.dtype)
        if _fingerprint(index, size) != self.fingerprint:
            raise FormatError(f"{idx_path} changed since the store was opened")
        check_ids_nonnegative(self._mapped, index.dtype, bin_path)
        return {"sequences": index.sequence_count}


def _check_bin(bin_path: Path, num_tokens: int, dtype: np.dtype) -> int:
    try:
        size = os.stat(bin_path).st_size
    except FileNotFoundError:
        raise StoreNotFoundError(f"{bin_path} is missing (its .idx is there)") from None
    if size != num_tokens * dtype.itemsize:
        raise FormatError(
            f"{bin_path} holds {size} bytes but its .idx indexes {num_tokens} tokens of {dtype} "
            f"({num_tokens * dtype.itemsize} bytes): truncated, or not the .idx's .bin"
        )
    return size


def _fingerprint(index: MegatronIndex, bin_size: int) -> str:
    h = hashlib.sha256(b"megatron\0")
    h.update(index.raw.data)
    h.update(str(bin_size).encode())
    return h.hexdigest()[:16]


def open_megatron(
    location: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    verify_reads: bool = False,
) -> MegatronStore:
    """Open the Megatron dataset ``PREFIX`` (``PREFIX.bin`` + ``PREFIX.idx``) read-only, in place.

    Parameters
    ----------
    location : str or os.PathLike
        The prefix, or the path of the ``.bin`` or the ``.idx``.
    cache_dir : str or os.PathLike, optional
        Root of the local cache for plans and checksum sidecars (default ``~/.cache/mmpack``,
        see :func:`mmpack._src.formats.foreign.cache_root`).
    verify_reads : bool
        Check each 16 MiB block of the ``.bin`` against the checksum sidecar the first time a
        read touches it (and its ids for negative ones; the ``.idx`` is checked in full now),
        recording the sidecar now, one read of both files, if there is none yet.

    Raises
    ------
    StoreNotFoundError
        The ``.idx`` or the ``.bin`` is missing.
    FormatError
        Anything not understood (see the module docstring), a multimodal index, float tokens.
    """
    prefix, bin_path, idx_path = megatron_paths(location)
    started = time.time_ns()  # before the identity: see recently_changed
    index = MegatronIndex(idx_path)
    dtype = unsigned_view_dtype(index.dtype, str(idx_path))
    try:
        bin_size = os.stat(bin_path).st_size
    except FileNotFoundError:
        raise StoreNotFoundError(f"{bin_path} is missing (its .idx is there)") from None
    idx_identity = file_identity(idx_path)
    key = {"idx": idx_identity, "bin_size": bin_size}
    root = cache_root(cache_dir) / MegatronStore.kind
    cached = load_index(root, key, bin_size // dtype.itemsize)
    if cached is not None and cached[0].shape[0] == index.document_count + 1:
        offsets, record = cached
        fingerprint = str(record["fingerprint"])
        num_tokens = int(offsets[-1])
    else:
        offsets, num_tokens = index.token_offsets()
        _check_bin(bin_path, num_tokens, index.dtype)
        fingerprint = _fingerprint(index, bin_size)
        if not recently_changed(started, idx_identity):
            save_index(root, key, offsets, {"fingerprint": fingerprint, "source": str(idx_path)})
    _check_bin(bin_path, num_tokens, index.dtype)
    tokens = map_tokens(bin_path, dtype, 0, num_tokens)
    info = {
        "version": index.version,
        "dtype": index.dtype.name,
        "dtype_code": index.dtype_code,
        "sequences": index.sequence_count,
        "bin": str(bin_path),
        "idx": str(idx_path),
    }
    options = {} if cache_dir is None else {"cache_dir": cache_dir}
    return MegatronStore(
        prefix,
        dtype=dtype,
        tokens=tokens,
        offsets=offsets,
        fingerprint=fingerprint,
        source_files=(idx_path, bin_path),
        token_source=TokenSource(bin_path, b"", index.dtype),
        info=info,
        location=str(prefix),
        cache_dir=cache_dir,
        open_options=options,
        index_cache=(root, key),
        verify_reads=verify_reads,
    )
