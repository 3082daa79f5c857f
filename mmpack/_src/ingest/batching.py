"""Batching: the records of every source grouped into batches of texts, and each tokenized batch
accounted for and written.

:func:`_batches` reads the sources in order and cuts a batch at ``batch_size`` documents or
``batch_chars`` characters; the read issues ride with their batch (so they are reported in input
order whatever the number of workers).  A file is all or nothing: one whose reading fails is taken
out of the batch being filled, or stops the build if some of its documents already left.
:func:`_consume` reports a batch's issues in position order and streams its tokens into the
writer.  Memory: one batch of texts; the locations are formatted only when an issue needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from mmpack._src.ingest.records import _Keyed, _ReadFailed, _Reason
from mmpack._src.ingest.report import IngestIssue, IngestReport, _refuse
from mmpack._src.store.writer import StoreWriter

__all__: list[str] = []


@dataclass
class _Batch:
    texts: list[Any]  # texts, or a chat build's records
    where: list[Callable[[], str]]
    issues: list[tuple[int, IngestIssue, Any]]  # (documents of the batch before it, issue, src)
    n_read: int = 0
    ended: list = dc_field(default_factory=list)  # inputs whose last record is in this batch
    read_to: int = 0  # how far reading the inputs had got when the batch was cut (_InputMeter)
    values: list = dc_field(default_factory=list)  # per text, its fields= values (if named)


class _InputMeter:
    """The total and the progress of reading the inputs: in bytes on disk when every source
    has a size (files, saved datasets: known before reading), else in documents (``total``:
    the sources' lengths where all have one, else None)."""

    def __init__(self, sources: list) -> None:
        sizes: list[int | None] = [getattr(s, "nbytes", None) for s in sources]
        lengths: list[int | None] = [getattr(s, "length", None) for s in sources]
        self.total: int | None = None
        self.unit = "B" if all(n is not None for n in sizes) else " docs"
        if self.unit == "B":
            self.total = sum(n or 0 for n in sizes)
        elif all(n is not None for n in lengths):
            self.total = sum(n or 0 for n in lengths)
        self._done = 0  # bytes of the sources read to their end

    def position(self, src: Any, report: IngestReport) -> int:
        """Bytes read so far, ``src`` being read now (documents read without sizes)."""
        if self.unit != "B":
            return report.docs_read
        return self._done + (src.read_bytes() if src is not None else 0)

    def finished(self, src: Any) -> None:
        if self.unit == "B":
            self._done += src.nbytes


def _batches(
    sources,
    report: IngestReport,
    skip_empty: bool,
    batch_size: int,
    batch_chars: int,
    meter: _InputMeter | None = None,
) -> Iterator[_Batch]:
    """Group the records of every source into batches; read issues ride with their batch so that
    they are reported in input order, whatever the number of workers.

    A source that fails to read (a corrupt ``.gz`` found by the check before reading, or an error
    part-way) is taken out whole: its records are removed from the batch being filled and one
    ``file_lost`` issue stands for them.  If some of them already left in a batch, the build stops
    (:class:`IngestError`): a file is never stored in part.  ``meter`` (the progress bar's)
    gives each batch its ``read_to``."""
    meter = meter if meter is not None else _InputMeter(sources)
    batch = _Batch([], [], [])
    chars = 0
    for src in sources:
        stats = src.input.stats
        damage = src.check()
        if damage is not None:
            n = src.damaged_count()
            report.docs_read += n
            batch.n_read += n
            stats.read += n
            batch.issues.append(
                (
                    len(batch.texts),
                    _lost_issue(src, damage, n, "decoded before the damage, damaged ones included"),
                    src,
                )
            )
            _source_done(src, batch, meter)
            continue
        mark = (len(batch.texts), len(batch.issues), chars)
        sent = False
        n_read = n_empty = 0  # of this source
        try:
            for pos, value, count in src.records():
                report.docs_read += count
                batch.n_read += count
                stats.read += count
                n_read += count
                if not isinstance(value, _Reason):
                    if not value and skip_empty:
                        report.empty_skipped += 1
                        stats.empty += 1
                        n_empty += 1
                        continue
                    keyed = getattr(value, "field_values", None)  # a record's fields= values
                    if keyed is not None:
                        batch.values.append(keyed)
                        value = str(value) if isinstance(value, _Keyed) else value
                    batch.texts.append(value)
                    batch.where.append(_Where(src, pos))
                    chars += len(value)
                    if len(batch.texts) >= batch_size or chars >= batch_chars:
                        batch.read_to = meter.position(src, report)
                        yield batch
                        sent = True
                        batch, chars = _Batch([], [], []), 0
                        mark = (0, 0, 0)
                else:
                    issue = IngestIssue(src.where(pos), value.msg, count)
                    batch.issues.append((len(batch.texts), issue, src))
        except _ReadFailed as exc:
            if sent:
                _refuse(
                    report,
                    f"{src.where(None)}: {exc.reason} after {n_read} records, some "
                    "of which were already passed to the store; the build stops and nothing "
                    "is written (a file is never stored in part)",
                )
            k, i, chars = mark
            del batch.texts[k:], batch.where[k:], batch.issues[i:], batch.values[k:]
            batch.issues.append(
                (
                    len(batch.texts),
                    _lost_issue(src, exc.reason, n_read - n_empty, "read before the error"),
                    src,
                )
            )
        _source_done(src, batch, meter)
    if batch.texts or batch.issues or batch.n_read or batch.ended:
        batch.read_to = meter.position(None, report)
        yield batch


def _source_done(src, batch: _Batch, meter: _InputMeter) -> None:
    meter.finished(src)
    src.input.left -= 1
    if src.input.left == 0:
        batch.ended.append(src.input)


def _lost_issue(src, reason: str, n: int, counted: str) -> IngestIssue:
    what = (
        ""
        if src.whole
        else (f" ({n} record{'s' if n != 1 else ''} {counted}; what follows is lost)")
    )
    return IngestIssue(
        src.where(None),
        f"{reason}; the file is skipped whole, none of its documents stored{what}",
        n,
        file_lost=True,
    )


class _Where:
    """The location of a record, formatted only if an issue needs it."""

    __slots__ = ("pos", "src")

    def __init__(self, src, pos) -> None:
        self.src, self.pos = src, pos

    def __call__(self) -> str:
        return self.src.where(self.pos)


def _consume(
    batch: _Batch,
    flat,
    lengths,
    failures,
    writer: StoreWriter,
    report: IngestReport,
    emit,
    rows: list,
    masks=None,
) -> None:
    """Report a tokenized batch's issues in position order, write its documents (with their
    loss masks, ``masks`` flat like ``flat``, for a chat build), and append to ``rows`` the
    fields= values of each document written."""
    if batch.values:
        failed = {k for k, _ in failures}
        rows.extend(v for k, v in enumerate(batch.values) if k not in failed)
    events = list(batch.issues)
    events += [
        (k, IngestIssue(batch.where[k](), reason), batch.where[k].src) for k, reason in failures
    ]
    events.sort(key=lambda e: e[0])  # stable: read issues before tokenize issues at a position
    for _, issue, src in events:
        report.docs_skipped += issue.skipped
        report.files_lost += issue.file_lost
        st = src.input.stats
        st.errors += issue.skipped
        if st.first is None and issue.is_error:
            st.first = issue
        emit(issue)
    if lengths.size:
        writer.add_batch(flat, lengths, masks)
    report.docs_written += int(lengths.size)
    report.tokens_written += int(flat.size)
