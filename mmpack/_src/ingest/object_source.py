"""A dataset or an iterable as an input source of ingestion: a ``datasets.Dataset`` (in memory
or saved to disk) read in batches of its columns, any other iterable item by item (a string,
UTF-8 bytes, or a record holding the text field).

It follows the record protocol of :mod:`mmpack._src.ingest.records` as the file readers of
:mod:`mmpack._src.ingest.readers` do: ``records()`` yields ``(pos, value, count)`` in order,
``where(pos)`` names a row (``NAME[i]``); with ``ingest(fields=...)`` each document carries its
row's values of the columns named, checked against the dataset's Arrow schema first where it
has one.  Cost: one pass, a batch of 1000 rows (a dataset) or one item in memory at a time.
"""

from __future__ import annotations

from typing import Any

from mmpack._src.ingest.records import (
    _check_columns,
    _check_text,
    _describe,
    _keyed,
    _Reason,
    _text_of,
)
from mmpack.errors import Param, with_params

__all__: list[str] = []


class _ObjectSource:
    """A dataset or an iterable.  For the progress bar: ``nbytes``, the size on disk of a saved
    dataset's folder (None in memory), and ``length``, its number of rows where it has one."""

    whole = False
    _pos = 0

    def __init__(
        self,
        obj: Any,
        field: str,
        name: str,
        nbytes: int | None = None,
        keys: tuple[str, ...] = (),
    ) -> None:
        self.obj, self.field, self.name = obj, field, name
        self.keys = tuple(keys)
        self.nbytes = nbytes
        try:
            self.length: int | None = len(obj)
        except TypeError:
            self.length = None

    def read_bytes(self) -> int:
        """The share of ``nbytes`` of the rows read so far."""
        if not self.nbytes or not self.length:
            return 0
        return self.nbytes * min(self._pos, self.length) // self.length

    def where(self, pos: int | None) -> str:
        return self.name if pos is None else f"{self.name}[{pos}]"

    def check(self) -> None:
        return None

    def check_keys(self) -> None:
        """Refuse a dataset lacking a column ``keys`` names, or holding one of a type that is no
        field's, before anything is read (from its Arrow schema, ``features.arrow_schema``;
        other objects: per batch, :meth:`_missing`)."""
        schema = getattr(getattr(self.obj, "features", None), "arrow_schema", None)
        if self.keys and schema is not None and hasattr(schema, "names"):
            _check_columns(schema, self.keys, self.name)

    def _missing(self, cols: Any) -> None:
        """Refuse a batch of columns lacking one ``keys`` names (a dataset without a schema)."""
        for key in self.keys:
            if key not in cols:
                raise with_params(
                    ValueError,
                    f"{self.name} has no column {key!r} (named by ",
                    Param("fields"),
                    f"); its columns: {', '.join(map(str, cols))}",
                )

    def records(self):
        obj = self.obj
        if hasattr(obj, "iter") and callable(obj.iter):
            pos = 0
            for cols in obj.iter(batch_size=1000):
                values = self._cells(cols)
                if isinstance(values, _Reason):
                    n = len(obj) - pos if hasattr(obj, "__len__") else 1
                    yield None, _Reason(f"{values.msg}; {n} rows skipped"), n
                    return
                for value in values:
                    yield pos, value, 1
                    pos += 1
                    self._pos = pos
            return
        for pos, item in enumerate(obj):
            self._pos = pos + 1
            yield pos, self._item(item), 1

    def _cells(self, cols: Any) -> Any:
        """The documents of a batch of a dataset's columns, or why it has none."""
        if self.field not in cols:
            return _Reason(f"has no column {self.field!r} (columns: {', '.join(map(str, cols))})")
        texts = (_check_text(value, self.field) for value in cols[self.field])
        if not self.keys:
            return texts
        self._missing(cols)
        rows = (dict(zip(self.keys, row)) for row in zip(*(cols[k] for k in self.keys)))
        return (_keyed(text, row, self.keys, "column") for text, row in zip(texts, rows))

    def _item(self, item: Any) -> Any:
        """The document of an item of an iterable (or the reason it has none; with ``keys``
        only a dict has one)."""
        if self.keys:
            return _text_of(item, self.field, self.keys)
        if isinstance(item, str):
            return item
        if isinstance(item, (bytes, bytearray)):
            try:
                return bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                return _Reason(_describe(exc))
        return _text_of(item, self.field)
