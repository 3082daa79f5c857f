"""Ingestion: raw text (files, datasets, iterables) -> tokenized documents -> a token store.

Pipeline.  The main process reads the inputs in order (files in the order given, each glob's
matches sorted), one record at a time, and groups the texts into batches of ``batch_size``
documents (or ``batch_chars`` characters, whichever comes first).  Each batch is tokenized (in
this process with ``workers=1``; otherwise in a pool of ``workers`` processes, at most
``2 * workers`` batches in flight) and the results are consumed *in submission order* and
streamed into :class:`mmpack.store.writer.StoreWriter` with ``add_batch``.  So memory is bounded by the
batches in flight, never by the corpus, and the store is a pure function of the inputs and the
tokenizer: the same bytes with one worker or many.  Workers are forked where the platform can
(Linux; so a script needs no ``if __name__ == "__main__"`` guard there; elsewhere Python's
default start method applies, which needs it) and rebuild the tokenizer once from its picklable
spec; a Hugging Face tokenizer runs single-threaded in each.

Inputs (format from the extension, after an optional ``.gz`` or ``.zst``; more extensions read
as text with ``text_extensions=``; or forced with ``format=``, for every file or per pattern):

- text: ``.txt`` / ``.text`` / ``.md`` and common source and markup files (``.py``, ``.rst``,
  ``.c``, ``.js``, ``.html``, ``.yaml``, ... see ``TEXT_EXTENSIONS``): one document per file, or
  one per line with ``lines=True`` (``\\n`` or ``\\r\\n`` ends a line; the line ending is not part
  of the document);
- ``.jsonl`` / ``.ndjson``: one JSON object per line, the text in ``field`` (blank lines are not
  records); ``.json``: a JSON array of objects or one object (read whole), or JSON lines;
- ``.parquet``: the ``field`` column (string, or binary holding UTF-8), read in record batches;
- a folder saved by Hugging Face ``datasets`` (``save_to_disk``; needs ``datasets``, imported
  only then; every split of a ``DatasetDict``, in name order);
- in the API also a ``datasets``-like object (anything with ``.iter(batch_size=)`` yielding
  column dicts, or iterable of dicts) and any other iterable of strings or dicts (e.g. a
  generator, or ``iter(list_of_texts)``; a list or tuple means paths).

Bad records.  A record that is not valid UTF-8, not valid JSON, not an object, lacks ``field``,
holds a non-string (or null) there, or fails to tokenize is an :class:`IngestIssue` naming the
file and line (or row / item) and the reason.  It is reported (``on_issue`` callback, else a
warning for each of the first 20) and skipped; then ``on_error`` decides.  ``"skip-some"``
(default) refuses the build (:class:`IngestError`, nothing written) when a file was lost (below),
when an input as the caller named it (a path, a glob with all its matches, a dataset, an
iterable) held more than one record and none could be stored, or when more than half of all
records were skipped: the marks of a wrong ``field`` or of the wrong files, not of a few bad
records.  ``"skip"`` builds from whatever is left; ``"fail"`` stops at the first bad record,
nothing written.  Nothing is dropped silently: the report counts documents read, written, skipped
with an error and skipped as empty, and the files lost.

A file is all or nothing.  A ``.gz`` input is first decompressed through once to check its CRC
and length (one more decompression: +35-42% of a byte-level build of a 6.1 MiB ``.jsonl.gz``,
under 1% of a BPE one); a corrupt or truncated one is skipped whole, and its issue counts the
records decoded before the damage (damaged ones included; what follows the damage is lost with
the file).  A file whose reading fails part-way (an I/O error, a Parquet page that does not
decode) is also taken out whole while none of its documents has left the batch being filled;
after that the build stops with :class:`IngestError` and writes nothing, never a part of the
file.

A UTF-8 byte-order mark at the start of a file is an encoding marker, not text: it is dropped.
Empty documents (empty text) are written as empty documents (the store keeps them; the window
and packed views then see a lone end-of-text) unless ``skip_empty=True``, which counts them in
``empty_skipped``.

Cost: reading and batching run at disk speed in the main process; tokenization scales with the
workers (the byte-level tokenizer is cheaper than the pickling that a worker would need, so its
default is one worker).
"""

from __future__ import annotations

import collections
import contextlib
import glob
import gzip
import json
import multiprocessing
import os
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import MmpackError, Param, with_params
from mmpack.ingest.provenance import describe_store
from mmpack.ingest.templates import with_template
from mmpack.ingest.tokenizer import (
    ByteTokenizer,
    Tokenizer,
    TokenizerSpec,
    load_tokenizer,
)
from mmpack.store.writer import StoreWriter, TokenStore, store_writer

__all__ = [
    "FORMATS",
    "IngestError",
    "IngestIssue",
    "IngestReport",
    "IngestWarning",
    "ON_ERROR",
    "TEXT_EXTENSIONS",
    "ingest",
]

FORMATS = ("json", "jsonl", "parquet", "text")
"""Accepted ``format`` names (``None``: from each file's extension)."""

ON_ERROR = ("skip-some", "skip", "fail")
"""Accepted ``on_error`` policies (see the module docstring)."""

TEXT_EXTENSIONS = (
    ".txt",
    ".text",
    ".md",
    ".markdown",
    ".rst",
    ".adoc",
    ".org",
    ".tex",
    ".py",
    ".pyi",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".hh",
    ".cu",
    ".java",
    ".kt",
    ".scala",
    ".go",
    ".rs",
    ".rb",
    ".php",
    ".pl",
    ".lua",
    ".jl",
    ".r",
    ".swift",
    ".cs",
    ".js",
    ".mjs",
    ".jsx",
    ".ts",
    ".tsx",
    ".sh",
    ".bash",
    ".sql",
    ".html",
    ".htm",
    ".xml",
    ".css",
    ".yaml",
    ".yml",
    ".toml",
    ".ini",
    ".cfg",
)
"""Extensions read as text (one document per file, or per line with ``lines``) by default."""

_EXTENSIONS = {
    **dict.fromkeys(TEXT_EXTENSIONS, "text"),
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_BOM = b"\xef\xbb\xbf"
_MAX_ISSUES_KEPT = 1000
_MAX_WARNINGS = 20


class IngestError(MmpackError, ValueError):
    """A build refused by its ``on_error`` policy, or a file that failed part-way after some of its
    documents were passed on; the message names the file, line and reason.  Nothing is written.
    ``report`` (when set) holds the counts up to the refusal."""

    report: IngestReport | None = None


class IngestWarning(UserWarning):
    """A skipped input record (``on_error="skip"``)."""


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
            f" ({self.files_lost} unreadable file{'s' if self.files_lost != 1 else ''} "
            "skipped whole)"
            if self.files_lost
            else ""
        )
        return (
            f"read {self.docs_read} documents: wrote {self.docs_written} "
            f"({self.tokens_written} tokens, {dtype}), skipped {self.docs_skipped} with errors"
            f"{lost} and {self.empty_skipped} empty; {self.seconds:.2f} s, "
            f"{self.docs_per_s:,.0f} docs/s, {self.tokens_per_s:,.0f} tokens/s "
            f"({self.workers} worker{'s' if self.workers != 1 else ''}) -> {self.path}"
        )


# --------------------------------------------------------------------------------- the API
def ingest(
    inputs: Any,
    output: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    field: str = "text",
    lines: bool = False,
    format: str | None = None,
    text_extensions: Iterable[str] = (),
    workers: int | None = None,
    batch_size: int = 1000,
    batch_chars: int = 1 << 20,
    on_error: str = "skip-some",
    skip_empty: bool = False,
    backend: str = "memmap",
    overwrite: bool = False,
    progress: bool | None = None,
    on_issue: Callable[[IngestIssue], None] | None = None,
    copy_tokenizer: bool = True,
    split: str | None = None,
    template: str | None = None,
) -> IngestReport:
    """Tokenize text inputs into a new token store at ``output``.

    Parameters
    ----------
    inputs : path, glob, list of paths/globs, datasets-like object, or iterable of str / dict
        See the module docstring for the formats.  A list or tuple always means paths.
    output : str or os.PathLike
        The store folder (written atomically by :class:`~mmpack.store.writer.StoreWriter`).
    tokenizer : None, "byte", path, TokenizerSpec or Tokenizer
        See :func:`mmpack.ingest.tokenizer.load_tokenizer`; None is the byte-level tokenizer.  The store
        dtype is ``tokenizer.token_dtype`` (``uint8`` for bytes, ``uint16`` up to 65536 ids).
    field : str
        The text field of JSON records, the Parquet column, the dataset column.
    lines : bool
        Text files hold one document per line instead of one per file.
    format : {"text", "jsonl", "json", "parquet"} or dict, optional
        Force the format of every input file (default: from its extension), or per pattern:
        ``{"*.py": "text", "*.jsonl": "jsonl"}`` (``fnmatch`` patterns tried in order against
        the file's name, then its path; files that match none go by their extension).
    text_extensions : iterable of str
        More extensions (``".py"`` or ``"py"``, any case) whose files are read as text, on top of
        ``TEXT_EXTENSIONS``; they take precedence over the built-in table.
    workers : int, optional
        Tokenizer processes.  Default ``os.cpu_count()``, except 1 for the byte-level tokenizer.
        With 1 (or when the input fits in one batch) no process is started.
    batch_size, batch_chars : int
        A batch ends at this many documents or characters.
    on_error : {"skip-some", "skip", "fail"}
        ``"skip-some"``: skip bad records, but refuse the build (nothing written) when no record
        of some input was stored or more than half of all records were skipped; ``"skip"``: skip
        any number; ``"fail"``: refuse at the first bad record.
    skip_empty : bool
        Drop empty documents (counted in ``empty_skipped``) instead of storing them.
    backend : {"memmap", "zarr"}
    overwrite : bool
        Replace an existing store.
    progress : bool, optional
        A tqdm bar (documents/s, tokens/s) on stderr; default: when stderr is a terminal.
    on_issue : callable, optional
        Called with every :class:`IngestIssue` (default: a warning for each of the first 20).
    copy_tokenizer : bool
        Copy the tokenizer's ``tokenizer.json`` into the store (default); the metadata records
        the tokenizer and the provenance either way (:mod:`mmpack.ingest.provenance`).
    split : str, optional
        Read only this split of every ``DatasetDict`` (saved folder or object) instead of all
        of them (``ValueError`` naming the splits if one lacks it); other inputs are read whole.
    template : str, optional
        Special tokens around every document: ``"tokenizer"`` (the tokenizer's post-processor)
        or e.g. ``"<s> $A"``, ``"[CLS] $A [SEP]"`` (:mod:`mmpack.ingest.templates`).

    Returns
    -------
    IngestReport
        The counts, the first 1000 issues, the timing and the opened ``store``.

    Raises
    ------
    IngestError
        A bad record with ``on_error="fail"``; with ``"skip-some"`` an input none of whose
        records was stored, or more than half of all records skipped; a file that failed
        part-way after some of its documents were passed on.
    FileNotFoundError
        An input path, or a glob with no match.
    ValueError
        An input of unknown format, a folder that is not a saved dataset, a bad argument.
    ImportError
        A saved dataset folder and ``datasets`` is not installed.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if isinstance(format, Mapping):
        _check_format_patterns(format)
    elif format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    extensions = {**_EXTENSIONS, **_text_extensions(text_extensions)}
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must be a non-empty string, got {field!r}")
    batch_size = _positive(batch_size, "batch_size")
    batch_chars = _positive(batch_chars, "batch_chars")
    tok = with_template(load_tokenizer(tokenizer), template)
    if workers is None:
        workers = 1 if isinstance(tok, ByteTokenizer) else (os.cpu_count() or 1)
    workers = _positive(workers, "workers")
    sources = _resolve_inputs(
        inputs, field=field, lines=bool(lines), fmt=format, extensions=extensions, split=split
    )
    if progress is None:
        progress = _stderr_is_tty()

    report = IngestReport(
        path=output if isinstance(output, str) and "://" in output else Path(output),
        tokenizer=str(tok.spec),
        workers=workers,
    )
    shown = [0]

    def emit(issue: IngestIssue) -> None:
        report.issues_total += 1
        if len(report.issues) < _MAX_ISSUES_KEPT:
            report.issues.append(issue)
        if on_error == "fail" and issue.is_error:
            _refuse(report, f"{issue} (", Param("on_error", "fail"), ")")
        if on_issue is not None:
            on_issue(issue)
        elif shown[0] < _MAX_WARNINGS:
            shown[0] += 1
            warnings.warn(
                f"{issue}; skipped" if issue.is_error else str(issue), IngestWarning, stacklevel=4
            )
        if on_error == "skip-some" and issue.file_lost:
            _refuse(
                report,
                f"{issue}; nothing is written. Pass ",
                Param("on_error", "skip"),
                " to build without this file",
            )

    def input_done(group: _Input) -> None:
        st, first = group.stats, group.stats.first  # first: set once errors > 0
        if (
            on_error == "skip-some"
            and first is not None
            and st.read - st.empty > 1
            and st.errors == st.read - st.empty
        ):
            hint: tuple = ()
            if "is missing" in first.reason or "has no column" in first.reason:
                hint = (" (is ", Param("field", field), " the right field?)")
            _refuse(
                report,
                f"no record of the input {group.name} could be stored ({st.errors} "
                f"skipped; the first: {first})",
                *hint,
                "; nothing is written. Pass ",
                Param("on_error", "skip"),
                " to build without its records",
            )

    t0 = time.perf_counter()
    bar = _progress_bar(progress)
    try:
        with store_writer(
            output, dtype=tok.token_dtype, backend=backend, overwrite=overwrite
        ) as writer:
            batches = _batches(sources, report, skip_empty, batch_size, batch_chars)
            with contextlib.closing(_tokenize(batches, tok, workers)) as encoded:
                for batch, (flat, lengths, failures) in encoded:
                    _consume(batch, flat, lengths, failures, writer, report, emit)
                    for group in batch.ended:
                        input_done(group)
                    if bar is not None:
                        bar.update(batch.n_read)
                        elapsed = time.perf_counter() - t0
                        bar.set_postfix_str(
                            f"{report.tokens_written / elapsed:,.0f} tokens/s", refresh=False
                        )
            if on_error == "skip-some" and 2 * report.docs_skipped > report.docs_read:
                _refuse(
                    report,
                    f"{report.docs_skipped} of {report.docs_read} records "
                    f"({report.docs_skipped / report.docs_read:.0%}) were skipped, more than "
                    "half; nothing is written. Pass ",
                    Param("on_error", "skip"),
                    " to build from the rest",
                )
            describe_store(
                writer, tok, report, [s.where(None) for s in sources], copy_tokenizer=copy_tokenizer
            )
        report.store = writer.store
    finally:
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - t0
    if on_issue is None and report.issues_total > shown[0]:
        warnings.warn(
            f"{report.issues_total - shown[0]} more input issues were not shown "
            "(see IngestReport.issues)",
            IngestWarning,
            stacklevel=2,
        )
    return report


def _refuse(report: IngestReport, *parts) -> None:
    exc = with_params(IngestError, *parts)
    exc.report = report
    raise exc


# --------------------------------------------------------------------------------- batching
@dataclass
class _Batch:
    texts: list[str]
    where: list[Callable[[], str]]
    issues: list[tuple[int, IngestIssue, Any]]  # (documents of the batch before it, issue, src)
    n_read: int = 0
    ended: list = dc_field(default_factory=list)  # inputs whose last record is in this batch


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


def _batches(
    sources, report: IngestReport, skip_empty: bool, batch_size: int, batch_chars: int
) -> Iterator[_Batch]:
    """Group the records of every source into batches; read issues ride with their batch so that
    they are reported in input order, whatever the number of workers.

    A source that fails to read (a corrupt ``.gz`` found by the check before reading, or an error
    part-way) is taken out whole: its records are removed from the batch being filled and one
    ``file_lost`` issue stands for them.  If some of them already left in a batch, the build stops
    (:class:`IngestError`): a file is never stored in part."""
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
            _source_done(src, batch)
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
                    batch.texts.append(value)
                    batch.where.append(_Where(src, pos))
                    chars += len(value)
                    if len(batch.texts) >= batch_size or chars >= batch_chars:
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
            del batch.texts[k:], batch.where[k:], batch.issues[i:]
            batch.issues.append(
                (
                    len(batch.texts),
                    _lost_issue(src, exc.reason, n_read - n_empty, "read before the error"),
                    src,
                )
            )
        _source_done(src, batch)
    if batch.texts or batch.issues or batch.n_read or batch.ended:
        yield batch


def _source_done(src, batch: _Batch) -> None:
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


class _Where:
    """The location of a record, formatted only if an issue needs it."""

    __slots__ = ("pos", "src")

    def __init__(self, src, pos) -> None:
        self.src, self.pos = src, pos

    def __call__(self) -> str:
        return self.src.where(self.pos)


def _consume(
    batch: _Batch, flat, lengths, failures, writer: StoreWriter, report: IngestReport, emit
) -> None:
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
        writer.add_batch(flat, lengths)
    report.docs_written += int(lengths.size)
    report.tokens_written += int(flat.size)


# --------------------------------------------------------------------------------- tokenizing
_worker_tokenizer: Tokenizer | None = None


def _init_worker(spec: TokenizerSpec) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _worker_tokenizer = load_tokenizer(spec)


def _worker_encode(texts: list[str]):
    assert _worker_tokenizer is not None  # set by _init_worker, the pool's initializer
    return _encode(_worker_tokenizer, texts)


def _encode(tok: Tokenizer, texts: list[str]):
    """Tokenize a batch -> (flat tokens, lengths int64 (k',), failures [(index, reason)])."""
    try:
        arrays = tok.encode_batch(texts)
        failures: list[tuple[int, str]] = []
    except Exception:  # find the texts that fail, one at a time
        arrays, failures = [], []
        for k, text in enumerate(texts):
            try:
                arrays.append(tok.encode_batch([text])[0])
            except Exception as exc:
                failures.append((k, f"cannot tokenize: {_describe(exc)}"))
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=tok.token_dtype)
    return flat, lengths, failures


def _tokenize(batches: Iterator[_Batch], tok: Tokenizer, workers: int):
    """Yield ``(batch, encoded)`` in input order; a pool only when it can help."""
    first = next(batches, None)
    if first is None:
        return
    second = next(batches, None) if workers > 1 else None
    if second is None:
        yield first, _encode(tok, first.texts)
        for batch in batches:
            yield batch, _encode(tok, batch.texts)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(tok.spec,)
    )
    try:
        pending: collections.deque = collections.deque()
        for n, batch in enumerate(_chain(first, second, batches)):
            with _quiet_tokenizers_fork() if n == 0 else contextlib.nullcontext():
                pending.append((batch, pool.submit(_worker_encode, batch.texts)))
            batch.texts = []  # the worker has them; keep only the locations
            if len(pending) >= 2 * workers:
                b, fut = pending.popleft()
                yield b, fut.result()
        while pending:
            b, fut = pending.popleft()
            yield b, fut.result()
    finally:  # also on an error downstream: drop the queued batches, stop the workers
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _quiet_tokenizers_fork():
    """Start the workers with ``TOKENIZERS_PARALLELISM=false``: a forked child then runs the Rust
    tokenizer single-threaded without warning that the parent's thread pool was in use."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def _chain(a, b, rest):
    yield a
    yield b
    yield from rest


# --------------------------------------------------------------------------------- inputs
def _resolve_inputs(
    inputs: Any,
    *,
    field: str,
    lines: bool,
    fmt: Any,
    extensions: Mapping[str, str] = _EXTENSIONS,
    split: str | None = None,
) -> list:
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if isinstance(inputs, (list, tuple)):
        sources = []
        for item in inputs:
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(
                    f"a list of inputs must hold paths or globs, got {type(item).__name__}; "
                    "to ingest in-memory texts pass an iterator, e.g. iter(texts)"
                )
            sources.extend(
                _grouped(
                    _sources_for_path(os.fspath(item), field, lines, fmt, extensions, split),
                    os.fspath(item),
                )
            )
        return sources
    if isinstance(inputs, bytes):
        raise TypeError("inputs must be a path, a list of paths or an iterable of texts, not bytes")
    if hasattr(inputs, "iter") or isinstance(inputs, Iterable):
        return _grouped(
            _object_sources(inputs, field, type(inputs).__name__, split), type(inputs).__name__
        )
    raise TypeError(
        f"inputs must be a path, a glob, a list of them, a dataset or an iterable of texts, "
        f"got {type(inputs).__name__}"
    )


def _sources_for_path(
    item: str,
    field: str,
    lines: bool,
    fmt: Any,
    extensions: Mapping[str, str],
    split: str | None = None,
) -> list:
    if glob.has_magic(item):
        matches = sorted(glob.glob(item, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {item!r}")
        paths = [Path(m) for m in matches if Path(m).is_file() or _is_saved_dataset(Path(m))]
        if not paths:
            raise FileNotFoundError(f"{item!r} matches only folders, no files")
    else:
        path = Path(item)
        if not path.exists():
            raise FileNotFoundError(f"input {item!r} does not exist")
        paths = [path]
    out = []
    for path in paths:
        if path.is_dir():
            if not _is_saved_dataset(path):
                raise ValueError(
                    f"input {str(path)!r} is a folder but not a saved Hugging Face dataset; "
                    f"pass its files or a glob such as '{path}/**/*.jsonl'"
                )
            out.extend(_object_sources(_load_saved_dataset(path), field, str(path), split))
            continue
        kind = _pattern_format(path, fmt) if isinstance(fmt, Mapping) else fmt
        kind = kind or _format_of(path, extensions)
        if kind == "text":
            out.append(_TextFile(path, lines))
        elif kind == "parquet":
            out.append(_ParquetFile(path, field))
        else:
            out.append(_JsonFile(path, field, array_ok=kind == "json"))
    return out


def _grouped(sources: list, name: str) -> list:
    group = _Input(name, len(sources))
    for src in sources:
        src.input = group
    return sources


def _format_of(path: Path, extensions: Mapping[str, str] = _EXTENSIONS) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".zst"):
        suffixes = suffixes[:-1]
    kind = extensions.get(suffixes[-1]) if suffixes else None
    if kind is None:
        ext = suffixes[-1] if suffixes else None
        known = ", ".join(e for e in extensions if e not in TEXT_EXTENSIONS[3:])
        read_as_text: tuple = (
            ("pass ", Param("text_extensions", [ext]), " to read it as text, or ")
            if ext
            else ("or pass ",)
        )
        raise with_params(
            ValueError,
            f"cannot tell the format of {str(path)!r} from its extension "
            f"({ext or 'it has none'}); known: {known}, common source and markup files "
            "(.py, .rst, .c, .html, ...), optionally .gz or .zst; ",
            *read_as_text,
            Param("format"),
            f" (one of {', '.join(FORMATS)}) for every input",
        )
    return kind


def _text_extensions(exts: Any) -> dict[str, str]:
    if isinstance(exts, (str, bytes)) or not isinstance(exts, Iterable):
        raise TypeError(
            f"text_extensions must be an iterable of extensions such as ['.py'], "
            f"got {type(exts).__name__} {exts!r}"
        )
    out = {}
    for ext in exts:
        if not isinstance(ext, str) or not ext.strip(". ") or "/" in ext:
            raise ValueError(f"text_extensions must hold extensions such as '.py', got {ext!r}")
        out["." + ext.strip().lstrip(".").lower()] = "text"
    return out


def _check_format_patterns(patterns: Mapping) -> None:
    for pattern, kind in patterns.items():
        if not isinstance(pattern, str) or kind not in FORMATS:
            raise ValueError(
                f"format patterns map glob patterns to one of {FORMATS}, got {pattern!r}: {kind!r}"
            )


def _pattern_format(path: Path, patterns: Mapping) -> str | None:
    import fnmatch

    for pattern, kind in patterns.items():
        if fnmatch.fnmatch(path.name, pattern) or fnmatch.fnmatch(str(path), pattern):
            return kind
    return None


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _DATASET_MARKERS)


def _load_saved_dataset(path: Path):
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"{str(path)!r} is a saved Hugging Face dataset; reading it needs the `datasets` "
            "package, which is not installed (pip install datasets)"
        ) from None
    return datasets.load_from_disk(str(path))


def _object_sources(obj: Any, field: str, name: str, split: str | None = None) -> list:
    """A dataset, a DatasetDict (every split, in name order, or only ``split``) or a plain
    iterable."""
    if isinstance(obj, Mapping) and obj and all(hasattr(v, "iter") for v in obj.values()):
        if split is not None:
            if split not in obj:
                raise ValueError(
                    f"split={split!r} is not a split of {name} (its splits: "
                    f"{', '.join(sorted(map(str, obj)))})"
                )
            return [_ObjectSource(obj[split], field, f"{name}[{split!r}]")]
        return [_ObjectSource(obj[k], field, f"{name}[{k!r}]") for k in sorted(obj)]
    return [_ObjectSource(obj, field, name)]


def _open_binary(path: Path):
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rb")
    if path.suffix.lower() == ".zst":
        from mmpack.ingest.compression import open_zstd

        return open_zstd(path)
    return open(path, "rb")


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


_READ_ERRORS = (OSError, EOFError, zlib.error)  # what reading a file (gzip included) raises


class _ReadFailed(Exception):
    """A file's reading failed part-way (raised by a source's ``records``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


# Every source yields (pos, value, count): value is the text, or the reason it has none; count is
# the number of documents the record stands for (1, or a whole unreadable file's rows).  A read
# error part-way raises _ReadFailed; ``check()`` finds damage before reading (None: none found);
# ``whole`` says whether the file is one value read at once (its loss counts 1 document).
class _TextFile:
    def __init__(self, path: Path, lines: bool) -> None:
        self.path, self.lines = path, lines
        self.whole = not lines

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path}:{pos}"

    def check(self) -> str | None:
        return _check_gzip(self.path)

    def damaged_count(self) -> int:
        """Documents decoded from a damaged ``.gz`` before the damage (1: one document a file)."""
        return 1 if self.whole else _decodable_records(self.path, nonblank=False)[0]

    def records(self):
        try:
            with _open_binary(self.path) as f:
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


class _JsonFile:
    def __init__(self, path: Path, field: str, array_ok: bool) -> None:
        self.path, self.field, self.array_ok = path, field, array_ok
        self._array = False
        self.whole = False

    def check(self) -> str | None:
        return _check_gzip(self.path)

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
            yield n, _text_of(obj, self.field), 1
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
            yield None, _text_of(value, self.field), 1
            return
        self._array = True
        if not value:
            yield None, _Reason("the JSON array is empty"), 0
        for k, obj in enumerate(value):
            yield k, _text_of(obj, self.field), 1


class _ParquetFile:
    whole = False

    def __init__(self, path: Path, field: str) -> None:
        self.path, self.field = path, field

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path} row {pos}"

    def check(self) -> None:
        return None

    def records(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as exc:
            yield None, _Reason(f"cannot read it as Parquet ({exc})"), 1
            return
        n_rows = pf.metadata.num_rows
        schema = pf.schema_arrow
        if self.field not in schema.names:
            yield (
                None,
                _Reason(
                    f"has no column {self.field!r} (columns: "
                    f"{', '.join(schema.names)}); its {n_rows} rows are skipped"
                ),
                n_rows,
            )
            return
        typ = schema.field(self.field).type
        is_text = (
            pa.types.is_string(typ)
            or pa.types.is_large_string(typ)
            or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(typ))
        )
        is_binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
        if not (is_text or is_binary):
            yield (
                None,
                _Reason(
                    f"column {self.field!r} has type {typ}, not string; its "
                    f"{n_rows} rows are skipped"
                ),
                n_rows,
            )
            return
        if n_rows == 0:
            yield None, _Reason("the file holds no rows"), 0
        row = 0
        batches = pf.iter_batches(batch_size=1024, columns=[self.field])
        while True:
            try:
                rb = next(batches, None)
            except (OSError, pa.ArrowException) as exc:
                raise _ReadFailed(f"cannot read it as Parquet past row {row} ({exc})") from None
            if rb is None:
                break
            for value in rb.column(0).to_pylist():
                if value is None:
                    yield row, _Reason(f"column {self.field!r} is null"), 1
                elif is_binary:
                    try:
                        yield row, value.decode("utf-8"), 1
                    except UnicodeDecodeError as exc:
                        yield row, _Reason(_describe(exc)), 1
                else:
                    yield row, value, 1
                row += 1


class _ObjectSource:
    whole = False

    def __init__(self, obj: Any, field: str, name: str) -> None:
        self.obj, self.field, self.name = obj, field, name

    def where(self, pos: int | None) -> str:
        return self.name if pos is None else f"{self.name}[{pos}]"

    def check(self) -> None:
        return None

    def records(self):
        obj = self.obj
        if hasattr(obj, "iter") and callable(obj.iter):
            pos = 0
            for cols in obj.iter(batch_size=1000):
                if self.field not in cols:
                    n = len(obj) - pos if hasattr(obj, "__len__") else 1
                    yield (
                        None,
                        _Reason(
                            f"has no column {self.field!r} (columns: "
                            f"{', '.join(map(str, cols))}); {n} rows skipped"
                        ),
                        n,
                    )
                    return
                for value in cols[self.field]:
                    yield pos, _check_text(value, self.field), 1
                    pos += 1
            return
        for pos, item in enumerate(obj):
            if isinstance(item, str):
                yield pos, item, 1
            elif isinstance(item, (bytes, bytearray)):
                try:
                    yield pos, bytes(item).decode("utf-8"), 1
                except UnicodeDecodeError as exc:
                    yield pos, _Reason(_describe(exc)), 1
            else:
                yield pos, _text_of(item, self.field), 1


def _text_of(obj: Any, field: str) -> str | _Reason:
    """The text of a record, or the reason it has none."""
    if not isinstance(obj, Mapping):
        return _Reason(f"the record is a {_json_type(obj)}, not an object with a {field!r} field")
    if field not in obj:
        return _Reason(f"field {field!r} is missing")
    return _check_text(obj[field], field)


def _check_text(value: Any, field: str) -> str | _Reason:
    if isinstance(value, str):
        return value
    if value is None:
        return _Reason(f"field {field!r} is null")
    return _Reason(f"field {field!r} holds a {_json_type(value)}, not a string")


class _Reason:
    """Why a record has no text (sources yield a text or a reason)."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg


def _json_type(value: Any) -> str:
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------------- helpers
def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _progress_bar(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(unit=" docs", unit_scale=True, desc="tokenizing", file=sys.stderr, smoothing=0.1)
