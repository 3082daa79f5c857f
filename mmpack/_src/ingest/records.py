"""The record protocol of the ingestion readers, and the checks of damaged compressed files.

Every source (:mod:`mmpack._src.ingest.readers`) yields ``(pos, value, count)``: ``value`` is the text,
or a :class:`_Reason` saying why the record has none; ``count`` is the number of documents the
record stands for (1, or a whole unreadable file's rows).  A read error part-way raises
:class:`_ReadFailed`; what reading raises is described in one line by :func:`_describe`.

A ``.gz`` input is decompressed through once before it is read (:func:`_check_gzip`: its CRC and
length are checked at the end; one more decompression, +35-42% of a byte-level build of a
``.jsonl.gz``); a damaged one is skipped whole, and :func:`_decodable_records` counts the records
decoded before the damage (64 KiB pieces, the damaged piece byte by byte; memory: one piece's
output).  The text of a JSON record or a dataset cell is checked by :func:`_text_of` and
:func:`_check_text` (O(1) a record).  With ``ingest(fields=...)`` the keys named travel as an
explicit ``keys`` argument, from the pipeline through each source to :func:`_text_of` and
:func:`_keyed` (the text field's name is a plain ``str``), and the text is a :class:`_Keyed`
carrying their values (:func:`_field_values`, the one check of a record's field values in every
format; O(keys)); the columns of a Parquet file or a dataset are checked first by
:func:`_check_columns`.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmpack.errors import Param, with_params

__all__: list[str] = []

_BOM = b"\xef\xbb\xbf"


class _Reason:
    """Why a record has no text (sources yield a text or a reason)."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg


class _ReadFailed(Exception):
    """A file's reading failed part-way (raised by a source's ``records``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_READ_ERRORS = (OSError, EOFError, zlib.error)  # what reading a file (gzip included) raises


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 at byte {exc.start}"
    if isinstance(exc, EOFError):
        return f"cannot read it (truncated: {exc})"
    if isinstance(exc, OSError):
        return f"cannot read it ({exc.strerror or exc})"
    if isinstance(exc, zlib.error):
        return f"cannot read it (corrupt compressed data: {exc})"
    return f"{type(exc).__name__}: {exc}"


class _Keyed(str):
    """A record's text with its values of the keys ``ingest(fields=...)`` names
    (``field_values``)."""

    field_values: tuple[Any, ...] = ()


_FIELD_TYPES = (str, int, float, bool)


def _text_of(obj: Any, field: str, keys: tuple[str, ...] = ()) -> str | _Reason:
    """The text of a record (a :class:`_Keyed` carrying its values of ``keys``, the keys
    ``fields=`` names), or the reason it has none (a record lacking one of ``keys``, or holding
    a value there that is not a number or a string, has none)."""
    if not isinstance(obj, Mapping):
        return _Reason(f"the record is a {_json_type(obj)}, not an object with a {field!r} field")
    if field not in obj:
        return _Reason(f"field {field!r} is missing")
    return _keyed(_check_text(obj[field], field), obj, keys)


def _keyed(text: str | _Reason, obj: Mapping, keys: tuple[str, ...], what: str = "field") -> Any:
    """``text`` carrying the values of ``keys`` in ``obj`` (a :class:`_Keyed`), or the reason
    it has none (:func:`_field_values`); ``text`` itself without keys or when it is a reason."""
    if not keys or isinstance(text, _Reason):
        return text
    values = _field_values(obj, keys, what)
    if isinstance(values, _Reason):
        return values
    keyed = _Keyed(text)
    keyed.field_values = values
    return keyed


def _field_values(obj: Mapping, keys: tuple[str, ...], what: str = "field") -> Any:
    """The values of ``keys`` in the record ``obj`` (a JSON object, a Parquet row, a dataset
    row: ``what`` is ``"field"`` or ``"column"``), or why it has none: a key missing, a null,
    a value that is not a number or a string (a list, an object)."""
    for key in keys:
        if key not in obj:
            return _Reason(f"{what} {key!r} (named by fields=) is missing")
        value = obj[key]
        if value is None:
            return _Reason(f"{what} {key!r} (named by fields=) is null")
        if not isinstance(value, _FIELD_TYPES):
            return _Reason(
                f"{what} {key!r} (named by fields=) holds a {_json_type(value)}, not a number "
                "or a string"
            )
    return tuple(obj[key] for key in keys)


def _check_columns(schema: Any, keys: tuple[str, ...], where: str) -> None:
    """Refuse an Arrow ``schema`` (a Parquet file's, a dataset's) lacking a column ``fields=``
    names, or holding one of a type that is no field's (lists, structs, binary, dates, ...).

    Raises
    ------
    ValueError
        A column is missing; the message names it, ``where`` and the columns there are.
    TypeError
        A column is not of integers, floats, booleans or strings (or a dictionary of them).
    """
    import pyarrow as pa

    for key in keys:
        if key not in schema.names:
            raise with_params(
                ValueError,
                f"{where} has no column {key!r} (named by ",
                Param("fields"),
                f"); its columns: {', '.join(schema.names)}",
            )
        typ = schema.field(key).type
        value = typ.value_type if pa.types.is_dictionary(typ) else typ
        if not (
            pa.types.is_integer(value)
            or pa.types.is_floating(value)
            or pa.types.is_boolean(value)
            or pa.types.is_null(value)
            or _is_text_type(value)
        ):
            raise with_params(
                TypeError,
                f"{where}: column {key!r} (named by ",
                Param("fields"),
                f") has type {typ}; a field holds numbers or short strings, one per document",
            )


def _is_text_type(typ: Any) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(typ))
    )


def _check_text(value: Any, field: str) -> str | _Reason:
    if isinstance(value, str):
        return value
    if value is None:
        return _Reason(f"field {field!r} is null")
    return _Reason(f"field {field!r} holds a {_json_type(value)}, not a string")


def _json_type(value: Any) -> str:
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _check_gzip(path: Path) -> str | None:
    """Decompress a ``.gz`` file through once (its CRC and length are checked at the end): the
    reason it is damaged, or None.  Other files: None."""
    if path.suffix.lower() != ".gz":
        return None
    try:
        if os.stat(path).st_size == 0:  # gzip reads it as empty; it is a file cut to nothing
            return "cannot read it (the file is empty: not even a gzip header)"
        with gzip.open(path, "rb") as f:
            while f.read(1 << 22):
                pass
    except _READ_ERRORS as exc:
        return _describe(exc)
    return None


def _decodable_records(path: Path, nonblank: bool) -> tuple[int, bytes]:
    """Records in the longest prefix of a damaged ``.gz`` that decodes (what a decoder outputs
    before it detects the damage): lines, or with ``nonblank`` non-blank lines; and the first
    bytes of that prefix.  The compressed data is fed in 64 KiB pieces; the piece holding the
    damage again one byte at a time from a copy of the decoder state, so that no output before the
    damage is lost.  Memory: one piece's output."""
    n, carry, head = 0, b"", b""

    def feed(out: bytes) -> None:
        nonlocal n, carry, head
        if len(head) < 64:
            head += out[: 64 - len(head)]
        rows = (carry + out).split(b"\n")
        carry = rows.pop()
        n += sum(1 for r in rows if r.strip()) if nonblank else len(rows)

    try:
        with open(path, "rb") as f:
            d = zlib.decompressobj(31)
            damaged = False
            while not damaged and (piece := f.read(1 << 16)):
                while piece and not damaged:
                    saved = d.copy()
                    try:
                        feed(d.decompress(piece))
                    except zlib.error:
                        d, damaged = saved, True
                        for k in range(len(piece)):
                            try:
                                feed(d.decompress(piece[k : k + 1]))
                            except zlib.error:
                                break
                        break
                    piece, d = (d.unused_data, zlib.decompressobj(31)) if d.eof else (b"", d)
    except OSError:  # an I/O error ends the prefix as damage does
        pass
    if carry.strip() if nonblank else carry:
        n += 1
    return n, head
