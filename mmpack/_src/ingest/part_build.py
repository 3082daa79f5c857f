"""The engine-neutral per-task function of a distributed build: one part store from its files.

Owns :func:`build_part` and the ingest options a task accepts.  A task tokenizes its files with
:func:`~mmpack.ingest.ingest` in one process (``workers=1``) into ONE store at a path
fixed by the task's index, written atomically with ``overwrite=True``: a task that the engine
retries or runs twice leaves exactly one, identical, part.  It is a plain function of picklable
arguments, so any engine (Dask, Ray, a loop) can call it.  Cost: that of ``ingest`` over the
task's files; the result carries at most :data:`MAX_ISSUES` issues.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmpack._src.ingest.pipeline import IngestIssue, ingest

__all__ = ["MAX_ISSUES", "OPTION_NAMES", "build_part"]

OPTION_NAMES = frozenset(
    {
        "tokenizer",
        "field",
        "fields",
        "lines",
        "format",
        "batch_size",
        "batch_chars",
        "on_error",
        "skip_empty",
        "backend",
        "split",
        "template",
        "shuffle_docs",
        "loss_on",
    }
)
"""The :func:`~mmpack.ingest.ingest` keywords a part build passes on."""
MAX_ISSUES = 1000
"""Issues a part's result keeps (the count of all of them is ``issues_total``)."""


def build_part(inputs: Sequence[str], part_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """Tokenize ``inputs`` into one store at ``part_path``; the per-task function of every engine.

    Atomic and idempotent: the store is written in a temporary folder and renamed onto
    ``part_path`` (replacing an earlier attempt's, which holds the same content).  ``options``
    are :func:`~mmpack.ingest.ingest` keywords (``tokenizer`` as a path, ``"byte"`` or a
    :class:`~mmpack._src.ingest.tokenizer.TokenizerSpec``).

    Returns
    -------
    dict
        ``docs_read``, ``docs_written``, ``docs_skipped``, ``empty_skipped``, ``tokens_written``,
        ``issues`` (the first 1000 :class:`IngestIssue`), ``issues_total``, ``fingerprint``,
        ``seconds``.
    """
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise TypeError(f"unexpected build options {sorted(unknown)}")
    issues: list[IngestIssue] = []

    def keep(issue: IngestIssue) -> None:
        if len(issues) < MAX_ISSUES:
            issues.append(issue)

    report = ingest(
        list(inputs),
        part_path,
        workers=1,
        overwrite=True,
        progress=False,
        copy_tokenizer=False,
        on_issue=keep,
        **options,
    )
    assert report.store is not None
    return {
        "docs_read": report.docs_read,
        "docs_written": report.docs_written,
        "docs_skipped": report.docs_skipped,
        "empty_skipped": report.empty_skipped,
        "tokens_written": report.tokens_written,
        "issues": issues,
        "issues_total": report.issues_total,
        "fingerprint": report.store.fingerprint,
        "seconds": report.seconds,
    }
