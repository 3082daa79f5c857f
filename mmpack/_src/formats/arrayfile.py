"""Named arrays in one checksummed file: a derived index written once, mapped when read back.

Layout: ``MMPKARRS``, a little-endian uint64 header length, a JSON header (``"format": 1``, the
caller's ``key``, each array's dtype, shape, offset and XXH64 (seed 0) of its bytes), the
little-endian uint32 CRC-32 of the header, then the raw C-order arrays, each aligned to 64
bytes.  :func:`save_arrays` writes it atomically
(:func:`~mmpack._src.store.checked_file.write_checked_file`: a reader sees no file or the whole file); :func:`load_arrays` maps every array read-only
and checks its digest (one read of the file, ~11 GB/s), so a damaged file is refused, never
served.  The key is compared whole: a file written for other data or other parameters is
refused with :class:`~mmpack.errors.StateMismatchError`.  The header and arrays are read by
:mod:`mmpack._src.store.checked_file`, as plan files are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mmpack._src.store.checked_file import (
    HEADER_PREFIX,
    aligned,
    map_array,
    read_header,
    write_checked_file,
)
from mmpack._src.store.integrity import stripe_digest
from mmpack.errors import FormatError, StateMismatchError

__all__ = ["load_arrays", "save_arrays"]

_ARRAY_FILE_FORMAT = 1
"""Version of the layout written and read."""

_MAGIC = b"MMPKARRS"


def save_arrays(
    path: str | os.PathLike[str],
    key: dict[str, Any],
    arrays: dict[str, Any],
    info: dict[str, Any] | None = None,
) -> None:
    """Write ``arrays`` (name -> numpy array of a fixed-size dtype) under ``key``, with ``info``
    (both JSON-able: what the file is for, and facts about its arrays), to ``path`` atomically
    (:func:`~mmpack._src.store.checked_file.write_checked_file`); its folder must exist."""
    path = Path(path)
    data = {}
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        data[name] = a.astype(a.dtype.newbyteorder("<"), copy=False)
    layout: dict[str, dict[str, Any]] = {
        name: {
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "offset": 0,
            "xxh64": stripe_digest(arr),
        }
        for name, arr in data.items()
    }
    header: dict[str, Any] = {
        "format": _ARRAY_FILE_FORMAT,
        "key": key,
        "info": info or {},
        "arrays": layout,
    }
    # Offsets depend on the header's length, which depends on the offsets: reserve digits.
    reserve = HEADER_PREFIX + len(json.dumps(header).encode()) + 24 * len(data)
    pos = data_start = aligned(reserve)
    offsets: dict[str, int] = {}
    for name, arr in data.items():
        layout[name]["offset"] = offsets[name] = pos
        pos = aligned(pos + arr.nbytes)

    def write_arrays(f: BinaryIO) -> dict[str, Any]:
        for name, arr in data.items():
            f.seek(offsets[name])
            f.write(memoryview(arr.reshape(-1)).cast("B"))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
        return header

    write_checked_file(path, _MAGIC, data_start, pos, write_arrays)


def load_arrays(
    path: str | os.PathLike[str], key: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays :func:`save_arrays` wrote to ``path`` under ``key``, mapped read-only, each
    digest checked, and the ``info`` written with them.

    Raises
    ------
    FormatError
        Not such a file, another format version, a failed checksum, or arrays that do not fit
        the file.
    StateMismatchError
        The file was written under another key.
    """
    path = Path(path)
    header, data_start, size = read_header(path, _MAGIC, "array file")
    try:
        version, stored_key, layout = header["format"], header["key"], header["arrays"]
        info = header["info"]
    except (KeyError, TypeError) as exc:
        raise FormatError(f"{path}: unreadable array file header ({exc})") from None
    if version != _ARRAY_FILE_FORMAT:
        raise FormatError(f"{path}: array file format {version!r}, this mmpack reads 1")
    if stored_key != json.loads(json.dumps(key)):
        raise StateMismatchError(
            f"{path} was written for {stored_key}, not for {key}: other data or other parameters"
        )
    if not isinstance(layout, dict) or not isinstance(info, dict):
        raise FormatError(f"{path}: unreadable array file header (arrays, info)")
    arrays = {
        name: map_array(path, size, data_start, name, spec, "array file")
        for name, spec in layout.items()
    }
    return arrays, info
