"""Writing and reading a file of named arrays behind a checksummed JSON header, the layout of mmpack's derived
indexes (the cached Megatron order of :mod:`mmpack._src.formats.arrayfile`, packing plans of
:mod:`mmpack._src.packing.plan_file`).

Layout: an 8-byte magic, a little-endian uint64 header length ``h``, ``h`` bytes of JSON, the
little-endian uint32 CRC-32 of those bytes, then raw C-order arrays; the header names each
array's ``dtype``, ``shape``, ``offset`` and the XXH64 (seed 0) of its bytes.
:func:`write_checked_file` writes one through :func:`~mmpack._src.store.format.atomic_file` (no
half-written file under its name, ever); :func:`read_header`
checks the magic and the CRC (one read of the header); :func:`map_array` maps one array
read-only, after checking that it lies inside the file after the header, and compares its
digest (one pass over its bytes, ~11 GB/s), so a damaged file is refused, never served.  What a
header must hold beyond its arrays is the caller's.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mmpack._src.store.format import atomic_file
from mmpack._src.store.integrity import stripe_digest
from mmpack.errors import FormatError

__all__ = ["HEADER_PREFIX", "aligned", "map_array", "read_header", "write_checked_file"]

HEADER_PREFIX = 20
"""Bytes of magic, header length and CRC around the JSON header."""

_ALIGN = 64
"""Where each array (and the data after the header) starts: a multiple of this many bytes."""


def aligned(pos: int) -> int:
    """``pos`` rounded up to a multiple of :data:`_ALIGN`."""
    return (pos + _ALIGN - 1) // _ALIGN * _ALIGN


def write_checked_file(
    path: str | os.PathLike[str],
    magic: bytes,
    data_start: int,
    end: int,
    fill: Callable[[BinaryIO], dict[str, Any]],
) -> None:
    """Write a checksummed array file to ``path`` atomically.

    ``fill(f)`` writes the arrays at their offsets (>= ``data_start``) of the temporary file
    ``f`` (opened ``"w+b"``; a fill that reads its bytes back, e.g. through ``numpy.memmap(f)``,
    flushes first) and returns the header; the file is then cut to ``end`` bytes, the header
    (``magic``, its length, the JSON, its CRC-32) written at the start, and the file fsynced
    and renamed onto ``path``; on any error the temporary file is removed.  ``AssertionError``
    if the header does not fit before ``data_start`` (the caller reserves the room).
    """
    with atomic_file(path) as f:
        header = fill(f)
        f.truncate(end)
        blob = json.dumps(header).encode()
        if HEADER_PREFIX + len(blob) > data_start:
            raise AssertionError(f"{path}: the header overflows its room")
        f.seek(0)
        f.write(magic + struct.pack("<Q", len(blob)) + blob + struct.pack("<I", zlib.crc32(blob)))


def read_header(path: Path, magic: bytes, what: str) -> tuple[dict[str, Any], int, int]:
    """The JSON header of the file at ``path``, its magic and CRC-32 checked.

    Parameters
    ----------
    path : pathlib.Path
    magic : bytes
        The 8 bytes the file must start with.
    what : str
        What the file is, for messages (``"plan"``, ``"array file"``).

    Returns
    -------
    header : dict
    data_start : int
        The first byte after the header's CRC (no array may start before it).
    size : int
        The file's size in bytes.

    Raises
    ------
    FormatError
        Another magic, a truncated header, a failed CRC, or a header that is not a JSON object.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) != 16 or head[:8] != magic:
            raise FormatError(f"{path} is not an mmpack {what}")
        (hlen,) = struct.unpack("<Q", head[8:])
        if hlen > size - HEADER_PREFIX:
            raise FormatError(f"{path}: truncated {what} header")
        blob = f.read(hlen)
        (stored_crc,) = struct.unpack("<I", f.read(4))
    if zlib.crc32(blob) != stored_crc:
        raise FormatError(f"{path}: the {what} header fails its checksum (damaged file)")
    try:
        header = json.loads(blob)
    except ValueError as exc:
        raise FormatError(f"{path}: unreadable {what} header ({exc})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: unreadable {what} header (not an object)")
    return header, HEADER_PREFIX + hlen, size


def map_array(
    path: Path,
    size: int,
    data_start: int,
    name: str,
    spec: Any,
    what: str,
    dtype: np.dtype | None = None,
    *,
    check: bool = True,
) -> np.ndarray:
    """Array ``name`` described by ``spec`` (``{"dtype", "shape", "offset", "xxh64"}``),
    memory-mapped read-only (an empty array when it has no entries), its place and digest checked.

    Parameters
    ----------
    dtype : numpy.dtype, optional
        The dtype the caller expects: another recorded dtype is refused.
    check : bool, default True
        Compare the whole array's ``"xxh64"``; False leaves the digests to the caller (a file
        that records one per chunk, checked on use: :class:`mmpack._src.packing.plan_pages.PlanPages`).

    Raises
    ------
    FormatError
        A malformed ``spec``, an array outside the file or of an object or unexpected dtype, or
        one whose XXH64 differs from the recorded one.
    """
    try:
        stored_dtype = np.dtype(spec["dtype"])
        shape = tuple(int(n) for n in spec["shape"])
        offset = int(spec["offset"])
        stored = int(spec["xxh64"]) if check else 0
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: bad layout of array {name!r} ({exc})") from None
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if (
        stored_dtype.hasobject
        or (dtype is not None and stored_dtype != dtype)
        or any(n < 0 for n in shape)
        or offset < data_start
        or offset + count * stored_dtype.itemsize > size
    ):
        raise FormatError(f"{path}: array {name!r} does not fit the file")
    if count == 0:
        arr = np.empty(shape, dtype=stored_dtype)
    else:
        arr = np.memmap(path, dtype=stored_dtype, mode="r", offset=offset, shape=shape)
        arr = arr.view(np.ndarray)
    if check and stripe_digest(arr) != stored:
        raise FormatError(f"{path}: {what} array {name!r} fails its checksum (xxh64; damaged file)")
    return arr
