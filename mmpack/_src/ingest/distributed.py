"""Distributed ingestion: the inputs split into tasks, one part store per task, the parts joined.

::

    INPUT files (in order) ──plan_tasks──▶ task 0: files 0..2   task 1: file 3   task 2: ...
                                               │ build_part          │              │
                                               ▼  (any engine)       ▼              ▼
    OUT (staged as .OUT.mmpack-build-*):   parts/part-00000     parts/part-00001   ...
                                               └──────── mmpack.join (manifest + offsets) ───▶ OUT

Algorithm: :func:`plan_tasks` expands the inputs as :func:`mmpack.ingest.ingest` does
and cuts the file list, in order, into tasks of about ``part_bytes`` of input (a file is never
split).  Each task runs :func:`build_part`, a plain function any engine can call, into ONE store
at a name fixed by the task's index (``overwrite=True``: a retried task leaves one identical
part).  The driver joins the parts in task order inside the staging folder (no token copied) and
renames it onto ``OUT``; a failed build publishes nothing, and a killed build's folder is removed
by the next build (its lock, :func:`mmpack._src.store.publish.stage_folder`).  The result is
``ingest``'s over the same inputs, whatever the workers.  With ``shuffle_docs=seed`` part ``k``
is built with ``shuffle_docs=(seed, k)`` and the parts joined in ``doc_order(n_parts, seed)``
(not the permutation of one local build: a document never changes part).

Engines: ``"dask"`` (a ``LocalCluster`` on 127.0.0.1 unless ``scheduler`` names one),
``"serial"``, others in ``docs/distributed.md``; the runners live in
:mod:`~mmpack._src.ingest.engines`, the planner and part builder in ``task_plan`` and ``part_build``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmpack._src.ingest.chat_template import ChatTokenizer
from mmpack._src.ingest.engines import ENGINES, RUNNERS, PartsProgress, collector
from mmpack._src.ingest.inputs import size_of
from mmpack._src.ingest.part_build import MAX_ISSUES, OPTION_NAMES, build_part
from mmpack._src.ingest.pipeline import (
    IngestIssue,
    IngestReport,
    IngestWarning,
    _check_field_columns,
)
from mmpack._src.ingest.provenance import (
    TOKENIZER_FILE,
    provenance_record,
    tokenizer_files,
    tokenizer_record_of,
)
from mmpack._src.ingest.task_plan import DEFAULT_PART_BYTES, plan_tasks
from mmpack._src.ingest.tokenizer import load_tokenizer, with_template
from mmpack._src.joins.join import write_join_into
from mmpack._src.joins.opening import open_join
from mmpack._src.store.doc_order import ORDER_SECTION, check_shuffle_docs, doc_order, order_record
from mmpack._src.store.opening import as_path
from mmpack._src.store.publish import (
    BUILD_TAG,
    LOCK_FILE,
    check_replaceable,
    stage_folder,
    swap_into_place,
)
from mmpack.errors import Param, StoreExistsError, with_params

__all__ = ["ENGINES", "build_distributed", "build_part", "plan_tasks"]

_COUNTS = ("docs_read", "docs_written", "docs_skipped", "empty_skipped", "tokens_written")
"""The document and token counts of a part's result, summed over the parts."""


def build_distributed(
    inputs: Any,
    output: str | os.PathLike[str],
    *,
    engine: str = "dask",
    scheduler: str | None = None,
    n_workers: int | None = None,
    part_bytes: int = DEFAULT_PART_BYTES,
    retries: int = 1,
    overwrite: bool = False,
    progress: bool | None = False,
    on_issue: Callable[[IngestIssue], None] | None = None,
    on_part: Callable[[int, dict[str, Any]], None] | None = None,
    part_function: Callable[[Sequence[str], str, dict[str, Any]], dict[str, Any]] | None = None,
    **options: Any,
) -> IngestReport:
    """Build the store ``output`` from ``inputs`` with one task per part on a cluster engine.

    Parameters
    ----------
    inputs : path, glob, or list of paths/globs
        See :func:`plan_tasks`.
    output : str or os.PathLike
        The store to create: a joined store whose parts live in ``output/parts``.
    engine : {"dask", "serial"}
    scheduler : str, optional
        A Dask scheduler address (``tcp://host:8786``); default: a ``LocalCluster`` of
        ``n_workers`` processes (one thread each) listening on 127.0.0.1 only.
    n_workers : int, optional
        Workers of the local cluster (default: the CPU count).
    part_bytes : int
        Input bytes per task (files are grouped in order up to this size; default 64 MiB).
    retries : int
        Times the engine may rerun a failed task (a retried task rewrites the same part).
    overwrite : bool
        Replace an existing store at ``output`` (atomically).
    progress : bool or None
        A bar on stderr over the input bytes on disk of the parts done (compressed sizes for
        ``.gz``/``.zst``), with parts, documents, tokens and an ETA; none by default; ``None``:
        when stderr is a terminal (what ``mmpack build --engine dask`` does unless told
        ``--progress`` or ``--no-progress``).
    on_issue : callable, optional
        Called with every skipped record, in input order (default: a warning for the first 20).
    on_part : callable, optional
        Called as ``on_part(index, result)`` when a part is done (in completion order).
    part_function : callable, optional
        The per-task function (default :func:`build_part`); one with the same signature and
        result may wrap it (e.g. to log or to test retries).
    **options
        :func:`~mmpack.ingest.ingest` keywords: ``tokenizer``, ``field``, ``lines``,
        ``format``, ``batch_size``, ``batch_chars``, ``on_error``, ``skip_empty``, ``backend``,
        ``split``, ``template``, ``loss_on`` (chat records, :mod:`mmpack._src.ingest.chat`),
        ``fields`` (per-document fields; every Parquet file's and saved dataset's columns are
        checked before any part is built, the parts' fields joined), ``shuffle_docs`` (each
        part shuffled with the key
        ``(shuffle_docs, part index)``, the parts joined in a keyed order: see the module
        docstring; not one document-level permutation across parts).

    Returns
    -------
    IngestReport
        Summed over the parts; ``store`` is the opened :class:`~mmpack._src.joins.parts.JoinedStore`.

    Raises
    ------
    Whatever a task raised (e.g. :class:`~mmpack._src.ingest.pipeline.IngestError` with
    ``on_error="fail"``); nothing is published then.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise TypeError(f"build_distributed() got unexpected keyword arguments {sorted(unknown)}")
    out = as_path(output, "output")
    _check_output(out, overwrite)
    seed = check_shuffle_docs(options.pop("shuffle_docs", None))
    tok = _shared_tokenizer(options)
    tasks = plan_tasks(inputs, part_bytes=part_bytes, output=out)
    _check_field_columns([f for t in tasks for f in t], **options)  # before any part is built
    per_task = [options] * len(tasks)
    if seed is not None:
        parts = seed if isinstance(seed, tuple) else (seed,)
        per_task = [{**options, "shuffle_docs": (*parts, k)} for k in range(len(tasks))]
    engine_run = _EngineRun(
        RUNNERS[engine], part_function or build_part, per_task, scheduler, n_workers, retries
    )
    t0 = time.perf_counter()
    workers, results = _build_staged(
        out, overwrite, tasks, tok, engine_run, progress, on_part, seed, options.get("fields")
    )
    report = _summed_report(out, tok, workers, results)
    report.seconds = time.perf_counter() - t0
    report.store = open_join(out)
    _emit_issues(report, on_issue)
    return report


def _shared_tokenizer(options: dict[str, Any]) -> Any:
    """The tokenizer the parts apply (with its template; for the store's record), and
    ``options["tokenizer"]`` replaced by its picklable spec, from which every worker rebuilds
    the same tokenizer."""
    base = load_tokenizer(options.get("tokenizer"))
    options["tokenizer"] = base.spec
    if options.get("loss_on") is not None:  # a chat build: its template checked before any part
        return ChatTokenizer(with_template(base, options.get("template")), options["loss_on"])
    return with_template(base, options.get("template"))


@dataclass(frozen=True)
class _EngineRun:
    """One engine's call over the tasks: ``runner(function, tasks, part_paths, options,
    scheduler, n_workers, retries, collect)`` (:data:`mmpack._src.ingest.engines.RUNNERS`)."""

    runner: Callable[..., int]
    function: Callable[..., dict[str, Any]]
    options: list[dict[str, Any]]
    scheduler: str | None
    n_workers: int | None
    retries: int

    def __call__(self, tasks: list[list[str]], part_paths: list[str], collect: Any) -> int:
        return self.runner(
            self.function,
            tasks,
            part_paths,
            self.options,
            self.scheduler,
            self.n_workers,
            self.retries,
            collect,
        )


def _build_staged(
    out: Path,
    overwrite: bool,
    tasks: list[list[str]],
    tok: Any,
    engine_run: _EngineRun,
    progress: bool | None,
    on_part: Callable[[int, dict[str, Any]], None] | None,
    seed: Any = None,
    fields: Any = None,
) -> tuple[int, list[dict[str, Any]]]:
    """Build every part in a staging folder beside ``out``, join them there and swap the folder
    onto ``out`` (in the keyed order of ``seed`` when given); a failure removes the staging
    folder and publishes nothing.  A progress bar
    as ``progress`` asks (:class:`~mmpack._src.ingest.engines.PartsProgress`).  Returns the engine's worker count and
    the parts' results, in task order."""
    sizes = [sum(size_of(Path(f)) for f in t) for t in tasks]
    stage, lock_fd = stage_folder(out, tag=BUILD_TAG)  # killed builds' folders removed first
    part_paths = [str(stage / "parts" / f"part-{k:05d}") for k in range(len(tasks))]
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    bar = PartsProgress(progress, sum(sizes), len(tasks))
    try:
        (stage / "parts").mkdir()
        workers = engine_run(tasks, part_paths, collector(results, sizes, bar, on_part))
        _join_parts(stage, part_paths, tasks, results, tok, seed, fields)
        swap_into_place(stage, out, overwrite)
        with contextlib.suppress(OSError):  # a kill before this leaves a harmless empty file
            (out / LOCK_FILE).unlink()
    except BaseException:
        _remove_stage(stage)
        raise
    finally:
        os.close(lock_fd)
        bar.close()
    done = [res for res in results if res is not None]
    assert len(done) == len(tasks)  # the engine returns once every part is done
    return workers, done


def _check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing ``out`` unless ``overwrite`` and it is replaceable (a store, a join or
    an empty folder: :func:`mmpack._src.store.publish.check_replaceable`); need its parent."""
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise with_params(
            StoreExistsError,
            f"{str(out)!r} exists; pass ",
            Param("overwrite", True),
            " to replace it",
        )
    if out.exists() or out.is_symlink():
        try:
            check_replaceable(out)
        except FileExistsError as exc:
            parts = getattr(exc, "message_parts", (str(exc),))
            raise with_params(
                StoreExistsError,
                f"{str(out)!r} exists and is not a store; not replacing it: ",
                *parts,
            ) from None
    if not out.parent.is_dir():
        raise FileNotFoundError(f"parent folder {str(out.parent)!r} of the store does not exist")


def _join_parts(stage: Path, part_paths: list[str], tasks, results, tok, seed, fields) -> None:
    """Write the join record (tokenizer record, provenance, tokenizer files) into ``stage``;
    the parts in task order, or in the keyed order of ``seed`` (recorded as ``"order"``)."""
    data = tokenizer_files(tok)
    store_extra = {
        "tokenizer": tokenizer_record_of(tok, copied=data is not None),
        "provenance": _provenance(tasks, results, tok, fields),
    }
    joined = part_paths
    if seed is not None:
        joined = [part_paths[k] for k in doc_order(len(part_paths), seed, 0, len(part_paths))]
        store_extra[ORDER_SECTION] = order_record(seed, parts=len(part_paths))
    write_join_into(
        stage,
        joined,
        extra=store_extra,
        attach={TOKENIZER_FILE: data} if data is not None else None,
    )


def _summed_report(out: Path, tok, workers: int, results) -> IngestReport:
    """The parts' counts summed, their issues concatenated (at most MAX_ISSUES)."""
    report = IngestReport(path=out, tokenizer=str(tok.spec), workers=workers)
    for res in results:
        for key in (*_COUNTS, "issues_total"):
            setattr(report, key, getattr(report, key) + res[key])
        report.issues.extend(res["issues"][: MAX_ISSUES - len(report.issues)])
    return report


def _provenance(tasks, results, tok, fields) -> dict[str, Any]:
    totals = _Totals(results)
    rec = provenance_record(
        [f for t in tasks for f in t],
        totals,
        tok,
        builder="mmpack.ingest.build_distributed",
        fields=fields or (),
    )
    rec["parts"] = len(tasks)
    return rec


class _Totals:
    def __init__(self, results) -> None:
        for key in _COUNTS:
            setattr(self, key, sum(r[key] for r in results))


def _remove_stage(stage: Path) -> None:
    """Remove the staging folder of a failed build.  Tasks of other parts may still be running
    on the engine's workers (a cancelled Dask task runs to its end) and write into it while it
    is removed; once it is gone they cannot recreate it (a part's parent must exist), so remove
    until it stays gone."""
    for _ in range(300):
        shutil.rmtree(stage, ignore_errors=True)
        if not stage.exists():
            return
        time.sleep(0.1)
    warnings.warn(
        f"could not remove the staging folder {stage} of the failed build",
        IngestWarning,
        stacklevel=4,  # _remove_stage < _build_staged < build_distributed < its caller
    )


def _emit_issues(report: IngestReport, on_issue) -> None:
    for k, issue in enumerate(report.issues):
        if on_issue is not None:
            on_issue(issue)
        elif k < 20:
            warnings.warn(
                f"{issue}; skipped" if issue.skipped else str(issue), IngestWarning, stacklevel=3
            )
    if on_issue is None and report.issues_total > 20:
        warnings.warn(
            f"{report.issues_total - 20} more input issues were not shown "
            "(see IngestReport.issues)",
            IngestWarning,
            stacklevel=3,
        )
