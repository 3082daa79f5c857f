"""Ingestion: raw text (files, datasets, iterables) -> tokenized documents -> a token store.

Pipeline: the main process reads the inputs in order (each glob's matches sorted), one record at
a time, in batches of ``batch_size`` documents (or ``batch_chars`` characters); each batch is
tokenized (in ``workers`` processes, at most ``2 * workers`` batches in flight, forked where the
platform can) and the results are consumed *in submission order* into
:class:`mmpack.store.StoreWriter`.  Memory is bounded by the batches in flight, and the
store is a pure function of the inputs and the tokenizer, whatever the workers.  Inputs (by
extension, after an optional ``.gz`` / ``.zst``; ``format=`` forces one): text files (one document
each, or per line with ``lines=True``), ``.jsonl`` / ``.json`` (the text in ``field``),
``.parquet`` (the ``field`` column), a saved Hugging Face dataset (one split), or in the API any
iterable of strings or dicts.

Bad records (invalid UTF-8 or JSON, a missing or non-string ``field``, a failed tokenization) are
an :class:`IngestIssue` naming file, line and reason, reported and skipped; ``on_error="skip-some"``
(default) refuses the build (:class:`IngestError`, nothing written) when a file was lost, an
input held records and none was stored, or more than half were skipped; ``"skip"`` builds from
the rest; ``"fail"`` stops at the first.  A file is all or nothing: a ``.gz`` is decompressed
through once first to check its CRC and length (a corrupt one is skipped whole), and a file whose
reading fails part-way is taken out whole, or the build stops.  A UTF-8 BOM is dropped; empty
documents are kept unless ``skip_empty=True``.

Cost: reading at disk speed, tokenization scaling with the workers (``python -m
benchmarks.bench_ingest``).  This module holds :func:`ingest` and its writing loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import Progress, progress_bar
from mmpack._src.core.validation import check_positive_int
from mmpack._src.ingest.batching import _Batch, _batches, _consume, _InputMeter
from mmpack._src.ingest.chat_readers import _chat_keys
from mmpack._src.ingest.chat_template import ChatTokenizer
from mmpack._src.ingest.inputs import (
    _EXTENSIONS,
    FORMATS,
    TEXT_EXTENSIONS,
    _check_format_patterns,
    _resolve_inputs,
    _text_extensions,
)
from mmpack._src.ingest.provenance import describe_store
from mmpack._src.ingest.report import ON_ERROR, IngestIssue, IngestReport, _IssuePolicy
from mmpack._src.ingest.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer, with_template
from mmpack._src.ingest.workers import _tokenize
from mmpack._src.store.doc_order import check_shuffle_docs
from mmpack._src.store.fields import check_field_name, check_fields
from mmpack._src.store.publish import check_target
from mmpack._src.store.writer import store_writer
from mmpack.errors import IngestError, IngestWarning

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
    progress: bool | None = False,
    on_issue: Callable[[IngestIssue], None] | None = None,
    copy_tokenizer: bool = True,
    split: str | None = None,
    template: str | None = None,
    shuffle_docs: Any = None,
    loss_on: str | None = None,
    fields: Iterable[str] | None = None,
) -> IngestReport:
    """Tokenize text inputs into a new token store at ``output``.

    Parameters
    ----------
    inputs : path, glob, list of paths/globs, datasets-like object, or iterable of str / dict
        See the module docstring for the formats.  A list or tuple always means paths.  A
        glob's matches inside ``output`` (the store an ``overwrite`` replaces) are never read;
        a path named inside it is refused (``ValueError``).
    output : str or os.PathLike
        The store folder (written atomically by :class:`~mmpack.store.StoreWriter`).
    tokenizer : None, "byte", path, TokenizerSpec or Tokenizer
        See :func:`mmpack.ingest.load_tokenizer`; None is the byte-level tokenizer.  The store
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
    progress : bool or None
        A bar on stderr over the inputs' bytes on disk (compressed sizes for ``.gz``/``.zst``),
        with the documents written, tokens/s and an ETA (documents, for an in-memory dataset),
        then, for a URL ``output``, over the upload; none by default; ``None``: when stderr is a
        terminal (what ``mmpack build`` does unless told ``--progress`` or ``--no-progress``).
    on_issue : callable, optional
        Called with every :class:`IngestIssue` (default: a warning for each of the first 20).
    copy_tokenizer : bool
        Copy the tokenizer's ``tokenizer.json`` into the store (default); the metadata records
        the tokenizer and the provenance either way (:mod:`mmpack._src.ingest.provenance`).
    split : str, optional
        The split of every ``DatasetDict`` (saved folder or object) to read; needed when one
        holds several (``ValueError`` naming them otherwise, or if one lacks it); a DatasetDict
        of one split is read without it; other inputs are read whole.
    template : str, optional
        Special tokens around every document: ``"tokenizer"`` (the tokenizer's post-processor)
        or e.g. ``"<s> $A"``, ``"[CLS] $A [SEP]"`` (:class:`mmpack._src.ingest.tokenizer.TemplateTokenizer`).
    shuffle_docs : int or tuple of int, optional
        Store the documents in a keyed order of this seed instead of the input order
        (:func:`mmpack.build`'s ``shuffle_docs``; the metadata's ``"order"``
        section records it; the provenance still lists the inputs and counts, which do not
        depend on the order).
    loss_on : {"assistant", "all", "completion"}, optional
        A fine-tuning build: the inputs hold chat records (``{"messages": [...]}``, or
        ``{"prompt", "completion"}`` for ``"completion"``; JSON lines, JSON, Parquet, saved
        datasets, datasets or iterables of dicts; ``field`` and ``lines`` are unused), tokenized
        with the ``tokenizer`` folder's chat template into documents with a loss mask
        (:mod:`mmpack._src.ingest.chat_template`; a bad record is an issue like any other).
    fields : iterable of str, optional
        Keys of JSON records (or of the dicts an iterable yields) stored as per-document fields
        (``store.fields[key]``; :mod:`mmpack._src.store.fields`: numbers, or strings as categories).
        A record lacking one, or holding ``null``, a list or an object there, is a bad record
        (an issue; ``on_error`` decides), never a silent missing value.  Of Parquet files and
        datasets the columns of those names (a file or a saved dataset lacking one, or holding
        one of lists, structs or bytes, is refused before anything is read: ``ValueError`` /
        ``TypeError`` naming the column and the file; a null is a bad record).  With
        ``loss_on`` each conversation is a document with its record's values (keys or
        columns); a text file holds none (refused).

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
        An input of unknown format, a folder that is not a saved dataset, a DatasetDict of
        several splits and no ``split`` (or without the split named), a bad argument.
    MissingDependencyError
        (an ``ImportError``) A saved dataset folder and ``datasets`` is not installed, or a
        Parquet file and ``pyarrow``; the message says what to install.
    """
    extensions = _checked_reading(on_error, format, field, text_extensions)
    batch_size = check_positive_int(batch_size, "batch_size")
    batch_chars = check_positive_int(batch_chars, "batch_chars")
    tok = with_template(load_tokenizer(tokenizer), template)
    if loss_on is not None:  # refused here (no template, no generation markers) before reading
        tok = ChatTokenizer(tok, loss_on)
    workers = _worker_count(workers, tok)
    shuffle_docs = check_shuffle_docs(shuffle_docs)
    where = output if isinstance(output, str) and "://" in output else Path(output)
    if isinstance(where, Path):  # the target first: an input is never read from what it holds
        check_target(where, bool(overwrite))
    keys = _field_keys(fields, field, loss_on)
    sources = _resolve_inputs(
        inputs,
        field=field,
        lines=bool(lines),
        fmt=format,
        extensions=extensions,
        split=split,
        output=where if isinstance(where, Path) else None,
        loss_on=loss_on,
        keys=keys,
    )
    for source in sources if keys else ():  # a missing column refused before any reading
        source.check_keys()
    report = IngestReport(
        path=where,
        tokenizer=str(tok.spec),
        workers=workers,
    )
    policy = _IssuePolicy(report, on_error, on_issue, field)
    meter = _InputMeter(sources)
    batches = _batches(sources, report, skip_empty, batch_size, batch_chars, meter)  # lazily
    bar = progress_bar(progress, meter.total, desc="building", unit=meter.unit)
    _build_store(
        output,
        batches,
        [source.where(None) for source in sources],
        tok,
        policy,
        bar,
        backend=backend,
        overwrite=overwrite,
        copy_tokenizer=copy_tokenizer,
        shuffle_docs=shuffle_docs,
        fields=keys,
    )
    policy.warn_unshown()
    return report


def _checked_reading(
    on_error: Any, format: Any, field: Any, text_extensions: Iterable[str]
) -> dict[str, str]:
    """Check the reading options; the extension table they give (built-in, then
    ``text_extensions`` read as text)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if isinstance(format, Mapping):
        _check_format_patterns(format)
    elif format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, got {format!r}")
    extensions = {**_EXTENSIONS, **_text_extensions(text_extensions)}
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must be a non-empty string, got {field!r}")
    return extensions


def _worker_count(workers: Any, tok: Tokenizer) -> int:
    """``workers`` checked; by default one for the byte-level tokenizer (cheaper than pickling
    its batches to a worker), else one per CPU."""
    if workers is None:
        workers = 1 if isinstance(tok, ByteTokenizer) else (os.cpu_count() or 1)
    return check_positive_int(workers, "workers")


def _build_store(
    output: Any,
    batches: Iterator[_Batch],
    where: list[str],
    tok: Tokenizer,
    policy: _IssuePolicy,
    bar: Progress,
    *,
    backend: str,
    overwrite: bool,
    copy_tokenizer: bool,
    shuffle_docs: Any,
    fields: tuple[str, ...] = (),
) -> None:
    """Tokenize ``batches`` (in order, ``report.workers`` processes) into a new store at
    ``output``, published once every input was read and the issue policy let it through, with
    its tokenizer and provenance records (``where``: the inputs as named).  Each batch's issues
    go through ``policy`` (whose warnings count this frame: keep the tokenize loop here) and its
    reading position to the progress ``bar`` (closed here); the report gets the opened store and
    the time taken."""
    report = policy.report
    t0 = time.perf_counter()
    remote = {"progress": bar.enabled} if isinstance(output, str) and "://" in output else {}
    try:
        with store_writer(
            output,
            dtype=tok.token_dtype,
            backend=backend,
            overwrite=overwrite,
            shuffle_docs=shuffle_docs,
            **remote,
        ) as writer:
            rows: list[tuple] = []  # the fields= values of each document written
            if isinstance(
                tok, ChatTokenizer
            ):  # a chat store has a loss mask, even with no document
                writer.add_batch(
                    np.empty(0, tok.token_dtype), np.empty(0, np.int64), np.empty(0, np.uint8)
                )
            with contextlib.closing(_tokenize(batches, tok, report.workers)) as encoded:
                for batch, (flat, lengths, failures, masks) in encoded:
                    _consume(
                        batch, flat, lengths, failures, writer, report, policy.emit, rows, masks
                    )
                    for group in batch.ended:
                        policy.input_done(group)
                    if bar.enabled:
                        bar.advance_to(batch.read_to)
                        rate = report.tokens_written / (time.perf_counter() - t0)
                        bar.note(f"{report.docs_written:,} docs, {rate:,.0f} tokens/s")
            policy.all_read()
            if fields:  # written by the commit, in the stored order
                writer.fields = check_fields(
                    {k: [r[i] for r in rows] for i, k in enumerate(fields)}
                )
            describe_store(
                writer,
                tok,
                report,
                where,
                builder="mmpack.ingest.ingest",
                copy_tokenizer=copy_tokenizer,
                fields=fields,
            )
            bar.close()  # before the upload's own bar, if any
        report.store = writer.store
    finally:
        bar.close()
        report.seconds = time.perf_counter() - t0


def _field_keys(fields: Any, text_field: str, loss_on: str | None = None) -> tuple[str, ...]:
    """``ingest``'s ``fields`` checked: field names, none twice, not the text field (with
    ``loss_on``: not a key the chat records are read from)."""
    if fields is None:
        return ()
    if isinstance(fields, str):
        raise TypeError(f"fields must be a list of key names, got the string {fields!r}")
    keys = tuple(check_field_name(k) for k in fields)
    reserved = _chat_keys(loss_on) if loss_on is not None else (text_field,)
    if len(set(keys)) != len(keys) or set(reserved) & set(keys):
        what = "a key of the chat records" if loss_on is not None else "the text field"
        raise ValueError(f"fields {list(keys)!r} names a key twice, or {what}")
    return keys


def _check_field_columns(inputs: Any, **options: Any) -> None:
    """Refuse ``inputs`` (paths or globs) whose Parquet files or saved datasets lack a column
    ``options["fields"]`` names, or hold one that is no field's, before anything is built
    (what :func:`ingest` checks of its own inputs; a distributed build's driver checks every
    task's inputs with it).  ``options``: :func:`ingest`'s keywords; nothing without
    ``fields``."""
    field, loss_on = options.get("field", "text"), options.get("loss_on")
    keys = _field_keys(options.get("fields"), field, loss_on)
    if not keys:
        return
    fmt = options.get("format")
    if isinstance(fmt, Mapping):
        _check_format_patterns(fmt)
    sources = _resolve_inputs(
        inputs,
        field=field,
        lines=bool(options.get("lines", False)),
        fmt=fmt,
        split=options.get("split"),
        loss_on=loss_on,
        keys=keys,
    )
    for source in sources:
        source.check_keys()
