"""The input files of ingestion: text files, JSON (lines, arrays, objects) and Parquet (a
dataset or an iterable in memory is :mod:`mmpack._src.ingest.object_source`).

Each file follows the record protocol of :mod:`mmpack._src.ingest.records`: ``records()`` yields
``(pos, value, count)`` in file order, ``where(pos)`` names a record (``FILE:LINE``, ``FILE row
R``; ``None``: the whole file), ``check()`` finds damage before reading (None: none
found) and ``whole`` says whether the file is one value read at once (its loss counts 1 document).
Files are opened by :func:`_open_binary` (``.gz`` and ``.zst`` decompressed on the fly).

With ``ingest(fields=...)`` each document carries its record's values of the keys named
(:func:`~mmpack._src.ingest.records._field_values`): the keys of a JSON object, the columns of a
Parquet file, whose Arrow schema is checked first
(:func:`~mmpack._src.ingest.records._check_columns`: a missing column or one of lists, structs, ...
refuses the build before anything is written).

Cost: one pass over each file, one record in memory at a time, except a JSON array or a
multi-line JSON object (read whole) and Parquet (record batches of 1024 rows); ``fields=``
adds the named columns to each batch and one schema read (the file's footer) a file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from mmpack._src.ingest.records import (
    _BOM,
    _READ_ERRORS,
    _check_columns,
    _check_gzip,
    _decodable_records,
    _describe,
    _is_text_type,
    _keyed,
    _ReadFailed,
    _Reason,
    _text_of,
)
from mmpack.errors import MissingDependencyError, Param, with_params

__all__: list[str] = []


def _open_binary(path: Path):
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rb")
    if path.suffix.lower() == ".zst":
        from mmpack._src.ingest.compression import open_zstd

        return open_zstd(path)
    return open(path, "rb")


def _disk_position(f: Any) -> int:
    """How far reading the file under ``f`` got, in bytes on disk: the compressed file's
    position for ``.gz`` (``GzipFile.fileobj``) and ``.zst`` (its raw reader's ``compressed``),
    the file's own otherwise."""
    inner = getattr(f, "fileobj", None)
    if inner is None:
        inner = getattr(getattr(f, "raw", None), "compressed", None)
    return int((inner if inner is not None else f).tell())


class _OnDisk:
    """What a file source tells the build's progress bar: its size on disk (the compressed
    size of a ``.gz``/``.zst``, known before reading) and the bytes of it read so far (the
    position of the file being read; one ``lseek``, asked once a batch)."""

    path: Path
    _reading: Any = None
    _size: int | None = None

    @property
    def nbytes(self) -> int:
        if self._size is None:
            try:
                self._size = self.path.stat().st_size
            except OSError:
                self._size = 0
        return self._size

    def check_keys(self) -> None:
        """Refuse the source before it is read if it cannot hold the fields ``fields=`` names
        (a JSON file: checked record by record instead)."""
        return None

    def read_bytes(self) -> int:
        f = self._reading
        if f is None:
            return 0
        try:
            return min(_disk_position(f), self.nbytes)
        except (OSError, ValueError, AttributeError):
            return 0


class _TextFile(_OnDisk):
    def __init__(self, path: Path, lines: bool, keys: tuple[str, ...] = ()) -> None:
        self.path, self.lines, self.keys = path, lines, keys
        self.whole = not lines

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path}:{pos}"

    def check(self) -> str | None:
        return _check_gzip(self.path)

    def check_keys(self) -> None:
        """A text file holds no fields: refused when ``fields=`` names some (``keys``)."""
        if self.keys:
            raise with_params(
                ValueError,
                f"{str(self.path)!r} is read as text, which holds no fields; ",
                Param("fields"),
                " reads the keys of JSON records and the columns of Parquet files and datasets",
            )

    def damaged_count(self) -> int:
        """Documents decoded from a damaged ``.gz`` before the damage (1: one document a file)."""
        return 1 if self.whole else _decodable_records(self.path, nonblank=False)[0]

    def records(self):
        try:
            with _open_binary(self.path) as f:
                self._reading = f
                if not self.lines:
                    try:
                        yield None, f.read().decode("utf-8-sig"), 1
                    except UnicodeDecodeError as exc:
                        yield None, _Reason(_describe(exc)), 1
                    return
                n = 0
                for n, raw in enumerate(f, 1):
                    raw = raw[:-1] if raw.endswith(b"\n") else raw
                    raw = raw[:-1] if raw.endswith(b"\r") else raw
                    try:
                        yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8"), 1
                    except UnicodeDecodeError as exc:
                        yield n, _Reason(_describe(exc)), 1
                if n == 0:
                    yield None, _Reason("the file holds no lines"), 0
        except _READ_ERRORS as exc:
            raise _ReadFailed(_describe(exc)) from None


class _JsonFile(_OnDisk):
    def __init__(self, path: Path, field: str, array_ok: bool, keys: tuple[str, ...] = ()) -> None:
        self.path, self.field, self.array_ok, self.keys = path, field, array_ok, keys
        self._array = False
        self.whole = False

    def check(self) -> str | None:
        return _check_gzip(self.path)

    def _value(self, obj: Any) -> Any:
        """The document of a JSON value: its text, carrying its values of ``keys`` (a chat
        source: the record)."""
        return _text_of(obj, self.field, self.keys)

    def damaged_count(self) -> int:
        """Records decoded from a damaged ``.gz`` before the damage (1 for a JSON array)."""
        n, head = _decodable_records(self.path, nonblank=True)
        if self.array_ok and head.removeprefix(_BOM).lstrip().startswith(b"["):
            self.whole = True
            return 1
        return n

    def where(self, pos: int | None) -> str:
        if pos is None:
            return str(self.path)
        return f"{self.path}[{pos}]" if self._array else f"{self.path}:{pos}"

    def records(self):
        try:
            with _open_binary(self.path) as f:
                self._reading = f
                self.whole = self.array_ok and self._whole_value(f)
                if self.whole:
                    yield from self._value_records(f)
                else:
                    yield from self._line_records(f)
        except _READ_ERRORS as exc:
            raise _ReadFailed(_describe(exc)) from None

    @staticmethod
    def _whole_value(f) -> bool:
        """Whether a ``.json`` file is one JSON value (an array, or an object spread over
        several lines) rather than JSON lines."""
        head = f.peek(64).removeprefix(_BOM).lstrip()
        if head.startswith(b"["):
            return True
        if not head.startswith(b"{"):
            return False
        first = f.readline()
        f.seek(0)
        try:
            json.loads(first.removeprefix(_BOM))
        except ValueError:
            return True
        return False

    def _line_records(self, f):
        n_records = 0
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            n_records += 1
            try:
                obj = json.loads(raw.decode("utf-8-sig" if n == 1 else "utf-8"))
            except UnicodeDecodeError as exc:
                yield n, _Reason(_describe(exc)), 1
                continue
            except ValueError as exc:
                yield n, _Reason(f"invalid JSON ({exc})"), 1
                continue
            yield n, self._value(obj), 1
        if n_records == 0:
            yield None, _Reason("the file holds no records"), 0

    def _value_records(self, f):
        try:
            value = json.loads(f.read().decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            yield None, _Reason(_describe(exc) + "; the whole file is skipped"), 1
            return
        except ValueError as exc:
            yield None, _Reason(f"invalid JSON ({exc}); the whole file is skipped"), 1
            return
        if not isinstance(value, list):
            yield None, self._value(value), 1
            return
        self._array = True
        if not value:
            yield None, _Reason("the JSON array is empty"), 0
        for k, obj in enumerate(value):
            yield k, self._value(obj), 1


def _pyarrow(path: Path) -> Any:
    """``pyarrow`` (with ``pyarrow.parquet`` loaded), or the error saying to install it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet
    except ImportError:
        raise MissingDependencyError(
            f"{str(path)!r} is a Parquet file; reading it needs the `pyarrow` package, "
            "which is not installed",
            "pyarrow",
            "ingest",
        ) from None
    return pa


class _ParquetFile(_OnDisk):
    """The ``field`` column of a Parquet file (and the columns its ``keys`` name: ``fields=``),
    read in record batches."""

    whole = False
    _row = 0
    _rows = 0

    def __init__(self, path: Path, field: str, keys: tuple[str, ...] = ()) -> None:
        self.path, self.field = path, field
        self.keys = tuple(keys)

    def check_keys(self) -> None:
        """Refuse the file before anything is read if it lacks a column ``keys`` names or holds
        one of a type that is no field's (:func:`~mmpack._src.ingest.records._check_columns`); a
        file that cannot be read as Parquet is left to :meth:`records`, which reports it as
        any unreadable file."""
        if not self.keys:
            return
        pa = _pyarrow(self.path)
        try:
            schema = pa.parquet.read_schema(self.path)
        except (OSError, pa.ArrowException):
            return
        _check_columns(schema, self.keys, str(self.path))

    def read_bytes(self) -> int:
        """The share of the file's bytes of the rows read so far."""
        return self.nbytes * self._row // self._rows if self._rows else 0

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path} row {pos}"

    def check(self) -> None:
        return None

    def records(self):
        pa = _pyarrow(self.path)
        try:
            pf = pa.parquet.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as exc:
            yield None, _Reason(f"cannot read it as Parquet ({exc})"), 1
            return
        n_rows = pf.metadata.num_rows
        columns = self._columns(pf.schema_arrow, n_rows)
        if isinstance(columns, _Reason):
            yield None, columns, n_rows
            return
        if n_rows == 0:
            yield None, _Reason("the file holds no rows"), 0
        row = 0
        self._rows = n_rows
        batches = pf.iter_batches(batch_size=1024, columns=columns)
        while True:
            try:
                rb = next(batches, None)
            except (OSError, pa.ArrowException) as exc:
                raise _ReadFailed(f"cannot read it as Parquet past row {row} ({exc})") from None
            if rb is None:
                break
            for value in self._values(rb):
                yield row, value, 1
                row += 1
                self._row = row

    _binary = False

    def _columns(self, schema: Any, n_rows: int) -> list[str] | _Reason:
        """The columns to read, or why the file's rows are all skipped."""
        import pyarrow as pa

        if self.field not in schema.names:
            return _Reason(
                f"has no column {self.field!r} (columns: {', '.join(schema.names)}); its "
                f"{n_rows} rows are skipped"
            )
        typ = schema.field(self.field).type
        self._binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
        if not (_is_text_type(typ) or self._binary):
            return _Reason(
                f"column {self.field!r} has type {typ}, not string; its {n_rows} rows are skipped"
            )
        return [self.field, *(k for k in self.keys if k != self.field)]

    def _values(self, rb: Any):
        """The document (or the reason it has none) of each row of a record batch; with
        ``keys``, each document carrying the row's values of them."""
        texts = (self._text(value) for value in rb.column(0).to_pylist())
        if not self.keys:
            yield from texts
            return
        columns = {k: rb.column(k).to_pylist() for k in self.keys}
        for r, text in enumerate(texts):
            yield _keyed(text, {k: col[r] for k, col in columns.items()}, self.keys, "column")

    def _text(self, value: Any) -> str | _Reason:
        if value is None:
            return _Reason(f"column {self.field!r} is null")
        if self._binary:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError as exc:
                return _Reason(_describe(exc))
        return value
