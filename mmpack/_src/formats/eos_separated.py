"""Flat token files with an end-of-sequence id between documents (OLMo-core / Dolma), in place.

OLMo-core's token files are one flat array of ``uint16`` or ``uint32`` ids, documents separated
by an EOS id, headerless despite the usual ``.npy`` name (read with ``np.memmap(path,
dtype=dtype)``); an optional ``NAME.csv.gz`` beside ``NAME.npy`` lists each document's
``start,end``.  mmpack opens such a file, or a real numpy ``.npy`` (1-D integer array), with
``format="eos-separated", eos=ID`` (plus ``dtype=`` for a headerless file).  Each document ends
with its EOS (kept); tokens after the last EOS form a final document without one (OLMo-core's
iterator drops it), so the documents concatenate to exactly the file and ``WindowDataset(store,
L)`` gives OLMo-core's ``NumpyFSLDataset`` instances.  ``metadata=True`` (or a path) takes the
documents from the ``.csv.gz`` instead (ranges contiguous from 0).

Finding the documents is ONE pass over the file (:func:`mmpack._src.kernels.eos.find_eos`, chunks of
4 Mi tokens); a signed file is served as its unsigned twin after one more pass checks that no id
is negative (:mod:`mmpack._src.formats.token_ids`).  ``offsets`` is cached in
``cache_root()/eos-separated/index-<key>.npy``, the key hashing the file's identity (size, times,
inode, its first and last MiB: :mod:`mmpack._src.formats.foreign` says what this trusts), the header
offset, dtype and ``eos``; a file changed less than 2 s before the open is not cached, and
nothing is written beside the user's file.  Cost: the first open runs at numpy's ``(np.memmap(path)
== eos).nonzero()`` speed while writing the index, a reopen is two small reads (``python -m
benchmarks.bench_foreign``, docs/benchmarks.md).

Fingerprint: SHA-256 of the dtype, token count, EOS, the file's head/tail hash and the offsets.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.validation import check_dtype, check_int_range
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
from mmpack.errors import FormatError, Param, StoreNotFoundError, with_params

__all__ = [
    "EosSeparatedStore",
    "detect_npy",
    "eos_offsets",
    "olmo_metadata_path",
    "open_eos_separated",
    "read_layout",
]

_NPY_MAGIC = b"\x93NUMPY"
_SCAN_CHUNK = 1 << 22


def detect_npy(path: Path) -> str | None:
    """``"eos-separated"`` for an existing ``.npy`` file (its opener then asks for ``eos=``)."""
    return "eos-separated" if path.suffix == ".npy" and path.is_file() else None


def olmo_metadata_path(path: Path) -> Path:
    """OLMo-core's metadata file of a token file: ``NAME.npy`` -> ``NAME.csv.gz``."""
    return path.with_name(
        path.name.replace(".npy", ".csv.gz") if ".npy" in path.name else path.name + ".csv.gz"
    )


def read_layout(path: Path, dtype: Any = None) -> tuple[np.dtype, int, int]:
    """``(file dtype, header bytes, token count)`` of a flat token file.

    A file that starts with numpy's magic and holds a consistent 1-D header is a ``.npy``;
    anything else is headerless and needs ``dtype``."""
    if not path.is_file():
        raise StoreNotFoundError(f"no token file at {str(path)!r}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(6) == _NPY_MAGIC:
            f.seek(0)
            try:
                version = np.lib.format.read_magic(f)
                reader = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _fortran, file_dtype = reader(f)
            except ValueError as exc:
                raise FormatError(f"{path}: a .npy header that numpy cannot read: {exc}") from None
            header = f.tell()
            if len(shape) != 1:
                raise FormatError(
                    f"{path}: a .npy of shape {shape}; a flat 1-D token array is expected"
                )
            if size != header + shape[0] * file_dtype.itemsize:
                raise FormatError(
                    f"{path}: {size} bytes, but its .npy header says {shape[0]} "
                    f"items of {file_dtype} after {header} header bytes"
                )
            if dtype is not None and check_dtype(dtype) != file_dtype:
                raise ValueError(
                    f"dtype={dtype!r} disagrees with the .npy header of {path} "
                    f"({file_dtype}); omit dtype for a .npy file"
                )
            return file_dtype, header, int(shape[0])
    if dtype is None:
        raise with_params(
            ValueError,
            f"{path} has no .npy header (OLMo-core writes headerless files): pass ",
            Param("dtype"),
            " (OLMo-core uses uint16 for vocabularies up to 65536 ids, else uint32)",
        )
    file_dtype = check_dtype(dtype)
    if size % file_dtype.itemsize:
        raise FormatError(
            f"{path} holds {size} bytes, not a whole number of {file_dtype} "
            f"tokens ({file_dtype.itemsize} bytes each): wrong dtype?"
        )
    return file_dtype, 0, size // file_dtype.itemsize


def eos_offsets(tokens: np.ndarray, eos: int) -> np.ndarray:
    """int64 offsets (shape (docs + 1,)) of the documents of ``tokens``: each ends right after an
    ``eos``; a tail without one is a last document.  One pass, in chunks, by the kernel."""
    from mmpack._src.kernels.eos import find_eos

    n = int(tokens.shape[0])
    out = np.empty(min(n, _SCAN_CHUNK), dtype=np.int64)
    pieces = [np.zeros(1, dtype=np.int64)]
    for lo in range(0, n, _SCAN_CHUNK):
        chunk = tokens[lo : lo + _SCAN_CHUNK]
        count = find_eos(chunk, eos, lo, out)
        pieces.append(out[:count] + 1)
    offsets = np.concatenate(pieces)
    if offsets[-1] != n:
        offsets = np.append(offsets, np.int64(n))
    return offsets


def _metadata_offsets(meta_path: Path, n: int) -> np.ndarray:
    try:
        with gzip.open(meta_path, "rt") as f:
            rows = [line.split(",")[:2] for line in f if line.strip()]
        ranges = np.array(rows, dtype=np.int64).reshape(-1, 2)
    except FileNotFoundError:
        raise StoreNotFoundError(f"no OLMo-core metadata file at {str(meta_path)!r}") from None
    except (OSError, ValueError, EOFError) as exc:
        raise FormatError(
            f"{meta_path}: not an OLMo-core start,end metadata file ({exc})"
        ) from None
    if ranges.size:
        starts, ends = ranges[:, 0], ranges[:, 1]
        gap = np.flatnonzero(starts != np.concatenate(([0], ends[:-1])))
        if gap.size or (ends < starts).any() or ends[-1] > n:
            k = int(gap[0]) if gap.size else int(np.flatnonzero((ends < starts) | (ends > n))[0])
            raise FormatError(
                f"{meta_path}: document {k} ({int(starts[k])},{int(ends[k])}) does not follow "
                f"the previous one or lies outside the {n} tokens; mmpack needs documents that "
                "cover the file contiguously from 0"
            )
    offsets = np.concatenate(([0], ranges[:, 1])).astype(np.int64)
    if offsets[-1] != n:
        offsets = np.append(offsets, np.int64(n))
    return offsets


class EosSeparatedStore(ForeignStore):
    """A flat EOS-separated token file served in place (see the module docstring)."""

    kind = "eos-separated"

    def _check_structure(self) -> dict[str, Any]:
        src = self.meta["source"]
        check_ids_nonnegative(self._mapped, self._token_source.file_dtype, self.location)
        if src["eos"] is None or src["metadata"] is not None:
            return {}
        found = eos_offsets(self._mapped, src["eos"])
        if not np.array_equal(found, self.offsets):
            raise FormatError(
                f"{self.location}: the EOS positions changed since the index was "
                "built: the cached index is stale"
            )
        return {}


def open_eos_separated(
    location: str | os.PathLike[str],
    *,
    eos: int | None = None,
    dtype: Any = None,
    metadata: bool | str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    verify_reads: bool = False,
) -> EosSeparatedStore:
    """Open a flat token file read-only, in place, its documents separated by ``eos``.

    Parameters
    ----------
    location : str or os.PathLike
        A ``.npy`` file (header read with numpy) or a headerless token file.
    eos : int
        The end-of-sequence id that ends each document (required unless ``metadata`` is used).
    dtype : numpy dtype, optional
        Token dtype of a headerless file (OLMo-core: uint16 or uint32).
    metadata : bool or path, optional
        ``True``: read the documents from OLMo-core's ``NAME.csv.gz`` beside the file; a path:
        from that file; default: scan for ``eos``.
    cache_dir : str or os.PathLike, optional
        Root of the local cache (index, plans, checksum sidecar); default ``~/.cache/mmpack``.
    verify_reads : bool
        Check each 16 MiB block of the file against the checksum sidecar the first time a read
        touches it (recording the sidecar now, one read of the file, if there is none yet).

    Raises
    ------
    ValueError
        ``eos`` missing or outside the dtype, ``dtype`` missing for a headerless file.
    FormatError
        A file or metadata that is not understood, or a signed file holding a negative id.
    """
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(location).__name__}")
    path = Path(location)
    if path.is_dir():
        raise FormatError(f"{str(path)!r} is a folder; format='eos-separated' opens one token file")
    file_dtype, header, n = read_layout(path, dtype)
    view_dtype = unsigned_view_dtype(file_dtype, str(path))
    meta_path = _metadata_path(path, metadata)
    if eos is None and meta_path is None:
        raise ValueError(
            f"{str(path)!r}: eos= is required to find the documents of a flat token file "
            "(e.g. mmpack.open(PATH, format='eos-separated', eos=ID), or --eos ID)"
        )
    if eos is not None:
        eos = check_int_range(eos, "eos", 0, int(np.iinfo(view_dtype).max) + 1)
    tokens = map_tokens(path, view_dtype, header, n)
    started = time.time_ns()  # before the identity: see recently_changed
    identity = file_identity(path)
    meta_identity = None if meta_path is None else file_identity(meta_path)
    key = {
        "identity": identity,
        "header": header,
        "dtype": file_dtype.str,
        "eos": eos,
        "metadata": meta_identity,
    }
    root = cache_root(cache_dir) / EosSeparatedStore.kind
    cache = not recently_changed(started, identity, meta_identity)
    offsets, fingerprint = _document_index(root, key, path, tokens, meta_path, eos, cache)
    info = {
        "version": None,
        "dtype": file_dtype.name,
        "header_bytes": header,
        "eos": eos,
        "metadata": None if meta_path is None else str(meta_path),
    }
    sources = (path,) if meta_path is None else (path, meta_path)
    return EosSeparatedStore(
        path,
        dtype=view_dtype,
        tokens=tokens,
        offsets=np.asarray(offsets, dtype=np.int64),
        fingerprint=fingerprint,
        source_files=sources,
        token_source=TokenSource(path, _header_bytes(path, header), file_dtype),
        info=info,
        location=str(path),
        cache_dir=cache_dir,
        open_options=_open_options(eos, dtype, meta_path, cache_dir),
        index_cache=(root, key),
        verify_reads=verify_reads,
    )


def _header_bytes(path: Path, header: int) -> bytes:
    if not header:
        return b""
    with open(path, "rb") as f:
        return f.read(header)


def _metadata_path(path: Path, metadata: Any) -> Path | None:
    """The OLMo-core metadata file the ``metadata`` argument names (``True``: the one beside
    ``path``), checked to exist; None without metadata."""
    if metadata is True:
        meta_path = olmo_metadata_path(path)
    elif metadata in (None, False):
        return None
    elif isinstance(metadata, (str, os.PathLike)):
        meta_path = Path(metadata)
    else:
        raise TypeError(f"metadata must be a bool or a path, got {type(metadata).__name__}")
    if not meta_path.is_file():
        raise StoreNotFoundError(f"no OLMo-core metadata file at {str(meta_path)!r}")
    return meta_path


def _document_index(
    root: Path,
    key: dict[str, Any],
    path: Path,
    tokens: np.ndarray,
    meta_path: Path | None,
    eos: int | None,
    cache: bool,
) -> tuple[np.ndarray, str]:
    """``(offsets, fingerprint)`` of the file's documents: from the index cache under ``root``
    when ``key`` matches, else read from the metadata or found by an EOS scan (a signed file
    checked for negative ids first), fingerprinted and cached when ``cache``."""
    n = int(tokens.shape[0])
    cached = load_index(root, key, n)
    if cached is not None:
        offsets, record = cached
        return offsets, str(record["fingerprint"])
    check_ids_nonnegative(tokens, np.dtype(key["dtype"]), path)
    if meta_path is not None:
        offsets = _metadata_offsets(meta_path, n)
    elif eos is not None:
        offsets = eos_offsets(tokens, eos)
    else:  # refused by the caller already
        raise ValueError("eos= is required without metadata")
    h = hashlib.sha256(b"eos-separated\0")
    h.update(json.dumps([tokens.dtype.str, n, eos, key["identity"]["head_tail_sha256"]]).encode())
    h.update(np.ascontiguousarray(offsets).tobytes())
    fingerprint = h.hexdigest()[:16]
    if cache:
        save_index(root, key, offsets, {"fingerprint": fingerprint, "source": str(path)})
    return offsets, fingerprint


def _open_options(
    eos: int | None, dtype: Any, meta_path: Path | None, cache_dir: Any
) -> dict[str, Any]:
    """The options that reopen the store the same way (after a pickle)."""
    options: dict[str, Any] = {"eos": eos}
    if dtype is not None:
        options["dtype"] = np.dtype(dtype).str
    if meta_path is not None:
        options["metadata"] = str(meta_path)
    if cache_dir is not None:
        options["cache_dir"] = cache_dir
    return options
