"""What a build reports: :class:`IngestIssue`, :class:`IngestReport`, and the accounting of the
issues under the ``on_error`` policy.

Every issue goes through :meth:`_IssuePolicy.emit`: counted, the first 1000 kept in the report,
passed to ``on_issue`` (else a warning for each of the first 20), and refused by the policy
(:class:`~mmpack.errors.IngestError`, nothing written): ``"fail"`` at the first lost document,
``"skip-some"`` at a lost file, at an input (:class:`_Input`) none of whose records was stored,
or when more than half of all records were skipped.  Cost: O(1) an issue.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

from mmpack._src.store.writer import TokenStore
from mmpack.errors import IngestError, IngestWarning, Param, with_params

__all__ = ["IngestIssue", "IngestReport", "ON_ERROR", "counted"]

ON_ERROR = ("skip-some", "skip", "fail")
"""Accepted ``on_error`` policies (see the module docstring)."""

_MAX_ISSUES_KEPT = 1000
_MAX_WARNINGS = 20


@dataclass(frozen=True)
class IngestIssue:
    """A record that could not become a document.

    ``where`` is ``"FILE:LINE"`` (text lines, JSON lines), ``"FILE row R"`` (Parquet, 0-based),
    ``"NAME[i]"`` (datasets, iterables, JSON arrays; 0-based) or ``"FILE"`` for the whole file;
    ``skipped`` is the number of documents lost (0 for a notice such as an empty file);
    ``file_lost`` marks a file that could not be read through: none of its documents is stored,
    ``skipped`` counts those read before the error (what followed the error is unknown)."""

    where: str
    reason: str
    skipped: int = 1
    file_lost: bool = False

    @property
    def is_error(self) -> bool:
        """Whether documents were lost (otherwise the issue is a notice)."""
        return bool(self.skipped) or self.file_lost

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class IngestReport:
    """What :func:`ingest` did.  ``docs_read == docs_written + docs_skipped + empty_skipped``;
    ``files_lost``: files skipped whole because they could not be read through (their documents
    decoded before the error are in ``docs_read`` and ``docs_skipped``)."""

    path: Path | str
    tokenizer: str
    workers: int
    docs_read: int = 0
    docs_written: int = 0
    docs_skipped: int = 0
    empty_skipped: int = 0
    files_lost: int = 0
    tokens_written: int = 0
    seconds: float = 0.0
    issues: list[IngestIssue] = dc_field(default_factory=list)
    issues_total: int = 0
    store: TokenStore | None = None

    @property
    def docs_per_s(self) -> float:
        return self.docs_read / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.seconds if self.seconds > 0 else float("nan")

    def summary(self) -> str:
        """One line: the counts, the store and the throughput."""
        dtype = self.store.dtype.name if self.store is not None else "?"
        lost = (
            f" ({counted(self.files_lost, 'unreadable file')} skipped whole)"
            if self.files_lost
            else ""
        )
        return (
            f"read {counted(self.docs_read, 'document')}: wrote {self.docs_written} "
            f"({counted(self.tokens_written, 'token')}, {dtype}), skipped {self.docs_skipped} "
            f"with errors{lost} and {self.empty_skipped} empty; {self.seconds:.2f} s, "
            f"{self.docs_per_s:,.0f} docs/s, {self.tokens_per_s:,.0f} tokens/s "
            f"({counted(self.workers, 'worker')}) -> {self.path}"
        )


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in agreement: ``"1 part"``, ``"2 parts"``, ``"0 parts"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _refuse(report: IngestReport, *parts) -> None:
    exc = with_params(IngestError, *parts)
    exc.report = report
    raise exc


class _Stats:
    """Counts of an input: records read, skipped as empty, skipped with an error; its first
    error."""

    __slots__ = ("empty", "errors", "first", "read")

    def __init__(self) -> None:
        self.read = self.empty = self.errors = 0
        self.first: IngestIssue | None = None


class _Input:
    """One input as the caller named it (a path, a glob with all its matches, a dataset, an
    iterable): the unit of the ``on_error="skip-some"`` rule "no record of an input stored"."""

    def __init__(self, name: str, n_sources: int) -> None:
        self.name, self.left = name, n_sources
        self.stats = _Stats()


class _IssuePolicy:
    """The ``on_error`` policy of one build over its issues (see the module docstring); the
    warnings it gives point at the caller of :func:`~mmpack.ingest.ingest`."""

    def __init__(
        self,
        report: IngestReport,
        on_error: str,
        on_issue: Callable[[IngestIssue], None] | None,
        field: str,
    ) -> None:
        self.report, self.on_error, self.on_issue, self.field = report, on_error, on_issue, field
        self.shown = 0

    def emit(self, issue: IngestIssue) -> None:
        """Count, keep, report and judge one issue (called by ``_consume`` in ``_write``)."""
        report, on_error = self.report, self.on_error
        report.issues_total += 1
        if len(report.issues) < _MAX_ISSUES_KEPT:
            report.issues.append(issue)
        if on_error == "fail" and issue.is_error:
            _refuse(report, f"{issue} (", Param("on_error", "fail"), ")")
        if self.on_issue is not None:
            self.on_issue(issue)
        elif self.shown < _MAX_WARNINGS:
            self.shown += 1
            warnings.warn(
                f"{issue}; skipped" if issue.is_error else str(issue), IngestWarning, stacklevel=5
            )
        if on_error == "skip-some" and issue.file_lost:
            _refuse(
                report,
                f"{issue}; nothing is written. Pass ",
                Param("on_error", "skip"),
                " to build without this file",
            )

    def input_done(self, group: _Input) -> None:
        """Refuse (``"skip-some"``) an input that held records, none of which could be stored."""
        st, first = group.stats, group.stats.first  # first: set once errors > 0
        if (
            self.on_error == "skip-some"
            and first is not None
            and st.read - st.empty > 1
            and st.errors == st.read - st.empty
        ):
            hint: tuple = ()
            if "is missing" in first.reason or "has no column" in first.reason:
                hint = (" (is ", Param("field", self.field), " the right field?)")
            _refuse(
                self.report,
                f"no record of the input {group.name} could be stored ({st.errors} "
                f"skipped; the first: {first})",
                *hint,
                "; nothing is written. Pass ",
                Param("on_error", "skip"),
                " to build without its records",
            )

    def all_read(self) -> None:
        """Refuse (``"skip-some"``) a build that skipped more than half of all records."""
        report = self.report
        if self.on_error == "skip-some" and 2 * report.docs_skipped > report.docs_read:
            _refuse(
                report,
                f"{report.docs_skipped} of {report.docs_read} records "
                f"({report.docs_skipped / report.docs_read:.0%}) were skipped, more than "
                "half; nothing is written. Pass ",
                Param("on_error", "skip"),
                " to build from the rest",
            )

    def warn_unshown(self) -> None:
        """One warning for the issues not shown (no ``on_issue`` and more than 20)."""
        if self.on_issue is None and self.report.issues_total > self.shown:
            warnings.warn(
                f"{self.report.issues_total - self.shown} more input issues were not shown "
                "(see IngestReport.issues)",
                IngestWarning,
                stacklevel=3,
            )
