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

Inputs (format from the extension, after an optional ``.gz`` or ``.zst``; or forced with
``format=``):

- ``.txt`` / ``.text`` / ``.md``: one document per file, or one per line with ``lines=True``
  (``\\n`` or ``\\r\\n`` ends a line; the line ending is not part of the document);
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
file and line (or row / item) and the reason.  With ``on_error="skip"`` (default) it is reported
(``on_issue`` callback, else a warning for each of the first 20) and skipped; with ``"fail"``
:class:`IngestError` is raised and nothing is written.  Nothing is dropped silently: the report
counts documents read, written, skipped with an error and skipped as empty.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import MmpackError
from mmpack.ingest.provenance import describe_store
from mmpack.ingest.templates import with_template
from mmpack.ingest.tokenizer import (
    ByteTokenizer,
    Tokenizer,
    TokenizerSpec,
    load_tokenizer,
)
from mmpack.store.writer import StoreWriter, TokenStore

__all__ = [
    "FORMATS",
    "IngestError",
    "IngestIssue",
    "IngestReport",
    "IngestWarning",
    "ingest",
]

FORMATS = ("json", "jsonl", "parquet", "text")
"""Accepted ``format`` names (``None``: from each file's extension)."""

_EXTENSIONS = {
    ".txt": "text", ".text": "text", ".md": "text",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
    ".parquet": "parquet", ".pq": "parquet",
}
_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_BOM = b"\xef\xbb\xbf"
_MAX_ISSUES_KEPT = 1000
_MAX_WARNINGS = 20


class IngestError(MmpackError, ValueError):
    """A bad input record with ``on_error="fail"``; the message names the file, line and reason."""


class IngestWarning(UserWarning):
    """A skipped input record (``on_error="skip"``)."""


@dataclass(frozen=True)
class IngestIssue:
    """A record that could not become a document.

    ``where`` is ``"FILE:LINE"`` (text lines, JSON lines), ``"FILE row R"`` (Parquet, 0-based),
    ``"NAME[i]"`` (datasets, iterables, JSON arrays; 0-based) or ``"FILE"`` for the whole file;
    ``skipped`` is the number of documents lost (0 for a notice such as an empty file)."""

    where: str
    reason: str
    skipped: int = 1

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class IngestReport:
    """What :func:`ingest` did.  ``docs_read == docs_written + docs_skipped + empty_skipped``."""

    path: Path
    tokenizer: str
    workers: int
    docs_read: int = 0
    docs_written: int = 0
    docs_skipped: int = 0
    empty_skipped: int = 0
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
        return (
            f"read {self.docs_read} documents: wrote {self.docs_written} "
            f"({self.tokens_written} tokens, {dtype}), skipped {self.docs_skipped} with errors"
            f" and {self.empty_skipped} empty; {self.seconds:.2f} s, "
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
    workers: int | None = None,
    batch_size: int = 1000,
    batch_chars: int = 1 << 20,
    on_error: str = "skip",
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
    workers : int, optional
        Tokenizer processes.  Default ``os.cpu_count()``, except 1 for the byte-level tokenizer.
        With 1 (or when the input fits in one batch) no process is started.
    batch_size, batch_chars : int
        A batch ends at this many documents or characters.
    on_error : {"skip", "fail"}
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
        A bad record with ``on_error="fail"``.
    FileNotFoundError
        An input path, or a glob with no match.
    ValueError
        An input of unknown format, a folder that is not a saved dataset, a bad argument.
    ImportError
        A saved dataset folder and ``datasets`` is not installed.
    """
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if isinstance(format, Mapping):
        _check_format_patterns(format)
    elif format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must be a non-empty string, got {field!r}")
    batch_size = _positive(batch_size, "batch_size")
    batch_chars = _positive(batch_chars, "batch_chars")
    tok = with_template(load_tokenizer(tokenizer), template)
    if workers is None:
        workers = 1 if isinstance(tok, ByteTokenizer) else (os.cpu_count() or 1)
    workers = _positive(workers, "workers")
    sources = _resolve_inputs(inputs, field=field, lines=bool(lines), fmt=format, split=split)
    if progress is None:
        progress = _stderr_is_tty()

    report = IngestReport(path=Path(output), tokenizer=str(tok.spec), workers=workers)
    shown = [0]

    def emit(issue: IngestIssue) -> None:
        report.issues_total += 1
        if len(report.issues) < _MAX_ISSUES_KEPT:
            report.issues.append(issue)
        if on_error == "fail" and issue.skipped:
            raise IngestError(f"{issue} (on_error='fail')")
        if on_issue is not None:
            on_issue(issue)
        elif shown[0] < _MAX_WARNINGS:
            shown[0] += 1
            warnings.warn(f"{issue}; skipped" if issue.skipped else str(issue),
                          IngestWarning, stacklevel=4)

    t0 = time.perf_counter()
    bar = _progress_bar(progress)
    try:
        with StoreWriter(output, dtype=tok.token_dtype, backend=backend,
                         overwrite=overwrite) as writer:
            batches = _batches(sources, report, skip_empty, batch_size, batch_chars)
            with contextlib.closing(_tokenize(batches, tok, workers)) as encoded:
                for batch, (flat, lengths, failures) in encoded:
                    _consume(batch, flat, lengths, failures, writer, report, emit)
                    if bar is not None:
                        bar.update(batch.n_read)
                        elapsed = time.perf_counter() - t0
                        bar.set_postfix_str(f"{report.tokens_written / elapsed:,.0f} tokens/s",
                                            refresh=False)
            describe_store(writer, tok, report, [s.where(None) for s in sources],
                           copy_tokenizer=copy_tokenizer)
        report.store = writer.store
    finally:
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - t0
    if on_issue is None and report.issues_total > shown[0]:
        warnings.warn(
            f"{report.issues_total - shown[0]} more input issues were not shown "
            "(see IngestReport.issues)", IngestWarning, stacklevel=2,
        )
    return report


# --------------------------------------------------------------------------------- batching
@dataclass
class _Batch:
    texts: list[str] | None
    where: list[Callable[[], str]]
    issues: list[tuple[int, IngestIssue]]  # (documents of the batch before it, issue)
    n_read: int = 0


def _batches(sources, report: IngestReport, skip_empty: bool, batch_size: int,
             batch_chars: int) -> Iterator[_Batch]:
    """Group the records of every source into batches; read issues ride with their batch so that
    they are reported in input order, whatever the number of workers."""
    batch = _Batch([], [], [])
    chars = 0
    for src in sources:
        for pos, value, count in src.records():
            report.docs_read += count
            batch.n_read += count
            if not isinstance(value, _Reason):
                if not value and skip_empty:
                    report.empty_skipped += 1
                    continue
                batch.texts.append(value)
                batch.where.append(_Where(src, pos))
                chars += len(value)
                if len(batch.texts) >= batch_size or chars >= batch_chars:
                    yield batch
                    batch, chars = _Batch([], [], []), 0
            else:
                issue = IngestIssue(src.where(pos), value.msg, count)
                batch.issues.append((len(batch.texts), issue))
    if batch.texts or batch.issues or batch.n_read:
        yield batch


class _Where:
    """The location of a record, formatted only if an issue needs it."""

    __slots__ = ("pos", "src")

    def __init__(self, src, pos) -> None:
        self.src, self.pos = src, pos

    def __call__(self) -> str:
        return self.src.where(self.pos)


def _consume(batch: _Batch, flat, lengths, failures, writer: StoreWriter,
             report: IngestReport, emit) -> None:
    events = list(batch.issues)
    events += [(k, IngestIssue(batch.where[k](), reason)) for k, reason in failures]
    events.sort(key=lambda e: e[0])  # stable: read issues before tokenize issues at a position
    for _, issue in events:
        report.docs_skipped += issue.skipped
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
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                               initargs=(tok.spec,))
    try:
        pending: collections.deque = collections.deque()
        for n, batch in enumerate(_chain(first, second, batches)):
            with _quiet_tokenizers_fork() if n == 0 else contextlib.nullcontext():
                pending.append((batch, pool.submit(_worker_encode, batch.texts)))
            batch.texts = None  # the worker has them; keep only the locations
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
def _resolve_inputs(inputs: Any, *, field: str, lines: bool, fmt: str | None,
                    split: str | None = None) -> list:
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
            sources.extend(_sources_for_path(os.fspath(item), field, lines, fmt, split))
        return sources
    if isinstance(inputs, bytes):
        raise TypeError("inputs must be a path, a list of paths or an iterable of texts, not bytes")
    if hasattr(inputs, "iter") or isinstance(inputs, Iterable):
        return _object_sources(inputs, field, type(inputs).__name__, split)
    raise TypeError(
        f"inputs must be a path, a glob, a list of them, a dataset or an iterable of texts, "
        f"got {type(inputs).__name__}"
    )


def _sources_for_path(item: str, field: str, lines: bool, fmt: str | None,
                      split: str | None = None) -> list:
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
        kind = kind or _format_of(path)
        if kind == "text":
            out.append(_TextFile(path, lines))
        elif kind == "parquet":
            out.append(_ParquetFile(path, field))
        else:
            out.append(_JsonFile(path, field, array_ok=kind == "json"))
    return out


def _format_of(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".zst"):
        suffixes = suffixes[:-1]
    kind = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if kind is None:
        raise ValueError(
            f"cannot tell the format of {str(path)!r} from its extension; accepted: "
            f"{', '.join(sorted(_EXTENSIONS))} (optionally .gz or .zst), or pass format= "
            f"(one of {', '.join(FORMATS)})"
        )
    return kind


def _check_format_patterns(patterns: Mapping) -> None:
    for pattern, kind in patterns.items():
        if not isinstance(pattern, str) or kind not in FORMATS:
            raise ValueError(f"format patterns map glob patterns to one of {FORMATS}, got "
                             f"{pattern!r}: {kind!r}")


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
                raise ValueError(f"split={split!r} is not a split of {name} (its splits: "
                                 f"{', '.join(sorted(map(str, obj)))})")
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
    if isinstance(exc, OSError):
        return f"cannot read it ({exc.strerror or exc})"
    return f"{type(exc).__name__}: {exc}"


# Every source yields (pos, value, count): value is the text, or the reason it has none; count is
# the number of documents the record stands for (1, or a whole unreadable file's rows).
class _TextFile:
    def __init__(self, path: Path, lines: bool) -> None:
        self.path, self.lines = path, lines

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path}:{pos}"

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
        except (OSError, EOFError) as exc:
            yield None, _Reason(_describe(exc)), 1


class _JsonFile:
    def __init__(self, path: Path, field: str, array_ok: bool) -> None:
        self.path, self.field, self.array_ok = path, field, array_ok
        self._array = False

    def where(self, pos: int | None) -> str:
        if pos is None:
            return str(self.path)
        return f"{self.path}[{pos}]" if self._array else f"{self.path}:{pos}"

    def records(self):
        try:
            with _open_binary(self.path) as f:
                if self.array_ok and self._whole_value(f):
                    yield from self._value_records(f)
                else:
                    yield from self._line_records(f)
        except (OSError, EOFError) as exc:
            yield None, _Reason(_describe(exc)), 1

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
    def __init__(self, path: Path, field: str) -> None:
        self.path, self.field = path, field

    def where(self, pos: int | None) -> str:
        return str(self.path) if pos is None else f"{self.path} row {pos}"

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
            yield None, _Reason(f"has no column {self.field!r} (columns: "
                                f"{', '.join(schema.names)}); its {n_rows} rows are skipped"), n_rows
            return
        typ = schema.field(self.field).type
        is_text = pa.types.is_string(typ) or pa.types.is_large_string(typ) or (
            hasattr(pa.types, "is_string_view") and pa.types.is_string_view(typ))
        is_binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
        if not (is_text or is_binary):
            yield None, _Reason(f"column {self.field!r} has type {typ}, not string; its "
                                f"{n_rows} rows are skipped"), n_rows
            return
        if n_rows == 0:
            yield None, _Reason("the file holds no rows"), 0
        row = 0
        for rb in pf.iter_batches(batch_size=1024, columns=[self.field]):
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
    def __init__(self, obj: Any, field: str, name: str) -> None:
        self.obj, self.field, self.name = obj, field, name

    def where(self, pos: int | None) -> str:
        return self.name if pos is None else f"{self.name}[{pos}]"

    def records(self):
        obj = self.obj
        if hasattr(obj, "iter") and callable(obj.iter):
            pos = 0
            for cols in obj.iter(batch_size=1000):
                if self.field not in cols:
                    n = len(obj) - pos if hasattr(obj, "__len__") else 1
                    yield None, _Reason(f"has no column {self.field!r} (columns: "
                                        f"{', '.join(map(str, cols))}); {n} rows skipped"), n
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
    return {bool: "boolean", int: "number", float: "number", list: "list", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)


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
