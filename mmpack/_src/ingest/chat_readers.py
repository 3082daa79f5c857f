"""The sources of a chat build (``ingest(..., loss_on=)``): JSON lines / JSON, Parquet and
datasets of chat records, read as :mod:`mmpack._src.ingest.readers` reads text but yielding each
checked record (:class:`~mmpack._src.ingest.chat_template.ChatRecord`) instead of a text.

A record is ``{"messages": [...]}`` (``loss_on="completion"``: ``{"prompt", "completion"}``): a
JSON object, a Parquet row of those columns (``messages`` a list of structs of ``role`` and
``content``), a dataset row.  A bad record is a reason naming what is wrong
(:func:`~mmpack._src.ingest.chat_template.record_problem`), reported with its file and line or row
like any bad record.  A record's ``tools`` and ``chat_template_kwargs`` (keys, or columns where a
file or dataset has them) come with it, for the template.  With ``ingest(fields=...)`` (``keys``) each conversation is a document
whose fields are its record's values of those keys (JSON) or columns (Parquet, datasets),
checked as for text (:func:`~mmpack._src.ingest.records._field_values`; a Parquet file's or a
dataset's schema first, :func:`~mmpack._src.ingest.records._check_columns`).  Cost: the readers',
plus one check per record (O(messages + keys)).
"""

from __future__ import annotations

from typing import Any

from mmpack._src.ingest.chat_template import CHAT_OPTIONS, checked_record
from mmpack._src.ingest.object_source import _ObjectSource
from mmpack._src.ingest.readers import _JsonFile, _ParquetFile
from mmpack._src.ingest.records import _field_values, _Reason

__all__: list[str] = []


def _chat_keys(loss_on: str) -> tuple[str, ...]:
    """The keys (columns) a chat record of ``loss_on`` is read from."""
    return ("prompt", "completion") if loss_on == "completion" else ("messages",)


def _record(obj: Any, loss_on: str, keys: tuple[str, ...] = (), what: str = "field") -> Any:
    """The checked record of ``obj``, carrying its values of ``keys`` (``field_values``), or
    the reason it has none."""
    got = checked_record(obj, loss_on)
    if isinstance(got, str):
        return _Reason(got)
    if keys:
        values = _field_values(obj, keys, what)
        if isinstance(values, _Reason):
            return values
        got.field_values = values
    return got


class _ChatJsonFile(_JsonFile):
    def __init__(self, path: Any, loss_on: str, array_ok: bool, keys: tuple[str, ...] = ()) -> None:
        super().__init__(path, "messages", array_ok, keys)
        self.loss_on = loss_on

    def _value(self, obj: Any) -> Any:
        return _record(obj, self.loss_on, self.keys)


class _ChatParquetFile(_ParquetFile):
    def __init__(self, path: Any, loss_on: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(path, "messages", keys)
        self.loss_on = loss_on

    def _columns(self, schema: Any, n_rows: int) -> list[str] | _Reason:
        keys = _chat_keys(self.loss_on)
        missing = [k for k in keys if k not in schema.names]
        if missing:
            return _Reason(
                f"holds no {' or '.join(map(repr, missing))} column of chat records (columns: "
                f"{', '.join(schema.names)}); its {n_rows} rows are skipped"
            )
        return [*keys, *(k for k in CHAT_OPTIONS if k in schema.names), *self.keys]

    def _values(self, rb: Any):
        for row in rb.to_pylist():
            yield _record(row, self.loss_on, self.keys, "column")


class _ChatObjectSource(_ObjectSource):
    def __init__(
        self,
        obj: Any,
        loss_on: str,
        name: str,
        nbytes: int | None = None,
        keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(obj, "messages", name, nbytes, keys)
        self.loss_on = loss_on

    def _cells(self, cols: Any) -> Any:
        keys = _chat_keys(self.loss_on)
        missing = [k for k in keys if k not in cols]
        if missing:
            return _Reason(
                f"holds no {' or '.join(map(repr, missing))} column of chat records (columns: "
                f"{', '.join(map(str, cols))})"
            )
        self._missing(cols)
        names = (*keys, *(k for k in CHAT_OPTIONS if k in cols), *self.keys)
        rows = zip(*(cols[k] for k in names))
        return (_record(dict(zip(names, row)), self.loss_on, self.keys, "column") for row in rows)

    def _item(self, item: Any) -> Any:
        return _record(item, self.loss_on, self.keys)
