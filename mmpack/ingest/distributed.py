"""Distributed ingestion: the inputs split into tasks, one part store per task, the parts joined.

::

    INPUT files (in order) ──plan_tasks──▶ task 0: files 0..2   task 1: file 3   task 2: ...
                                               │ build_part          │              │
                                               ▼  (any engine)       ▼              ▼
    OUT (staged as .OUT.mmpack-build-*):   parts/part-00000     parts/part-00001   ...
                                               └──────── mmpack.join (manifest + offsets) ───▶ OUT

Algorithm.  :func:`plan_tasks` expands the inputs exactly as :func:`mmpack.ingest.pipeline.ingest`
does (paths in the order given, each glob's matches sorted) and cuts the file list, in order, into
tasks of about ``part_bytes`` of input (small files are grouped; a file is never split).  Each task
runs :func:`build_part`, a plain function of ``(inputs, part path, options)`` that any engine can
call: it tokenizes its files with :func:`~mmpack.ingest.pipeline.ingest` (one process) into ONE
store at a name fixed by the task's index, written atomically with ``overwrite=True``, so a task
that the engine retries or runs twice leaves exactly one, identical, part.  The driver joins the
parts in task order (:mod:`mmpack.store.join`; no token is copied) inside the staging folder and
renames it onto ``OUT``: a failed build publishes nothing and removes its staging folder.  The
result's documents and tokens are those of ``ingest`` over the same inputs, whatever the number of
workers or the order in which tasks finish (tested).

Engines: ``"dask"`` (``dask.distributed``: a ``LocalCluster`` on 127.0.0.1 unless ``scheduler``
names one; its workers must see the same file system and have mmpack installed) and ``"serial"``
(the tasks one after another in this process).  A Ray recipe is in the README.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmpack.errors import MissingDependencyError, StoreExistsError
from mmpack.ingest.pipeline import (
    IngestError,
    IngestIssue,
    IngestReport,
    IngestWarning,
    ingest,
)
from mmpack.ingest.provenance import (
    TOKENIZER_FILE,
    provenance_record,
    tokenizer_files,
    tokenizer_record_of,
)
from mmpack.ingest.templates import with_template
from mmpack.ingest.tokenizer import load_tokenizer
from mmpack.store.join import write_join_into
from mmpack.store.parts import open_join
from mmpack.store.reader import _as_path

__all__ = ["ENGINES", "build_distributed", "build_part", "plan_tasks"]

ENGINES = ("dask", "serial")
_STAGE_TAG = ".mmpack-build-"
_DEFAULT_PART_BYTES = 64 << 20
_OPTION_NAMES = {
    "tokenizer",
    "field",
    "lines",
    "format",
    "batch_size",
    "batch_chars",
    "on_error",
    "skip_empty",
    "backend",
    "split",
    "template",
}
_MAX_ISSUES = 1000
_STORE_MARKERS = ("mmpack.json", "zarr.json", "mmpack-join.json")


def plan_tasks(inputs: Any, *, part_bytes: int = _DEFAULT_PART_BYTES) -> list[list[str]]:
    """Cut the input files, in order, into tasks of about ``part_bytes`` bytes each.

    Parameters
    ----------
    inputs : path, glob, or list of paths/globs
        As for :func:`~mmpack.ingest.pipeline.ingest` (in-memory iterables cannot be sent to
        workers: build those with ``ingest``).

    Returns
    -------
    list of list of str
        The files (or saved-dataset folders) of each task, in input order.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TypeError(
            "a distributed build takes a path, a glob or a non-empty list of them, got "
            f"{type(inputs).__name__}; build in-memory inputs with mmpack.ingest.pipeline.ingest"
        )
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"part_bytes must be a positive integer, got {part_bytes!r}")
    files: list[str] = []
    for item in inputs:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"inputs must be paths or globs, got {type(item).__name__}")
        item = os.fspath(item)
        if glob.has_magic(item):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise FileNotFoundError(f"no file matches {item!r}")
            files.extend(m for m in matches if Path(m).is_file() or _is_dataset_dir(Path(m)))
        elif not Path(item).exists():
            raise FileNotFoundError(f"input {item!r} does not exist")
        else:
            files.append(item)
    tasks: list[list[str]] = []
    size = 0
    for f in files:
        if not tasks or size >= part_bytes:
            tasks.append([])
            size = 0
        tasks[-1].append(os.path.abspath(f))
        size += _size_of(Path(f))
    return tasks


def build_part(inputs: Sequence[str], part_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """Tokenize ``inputs`` into one store at ``part_path``; the per-task function of every engine.

    Atomic and idempotent: the store is written in a temporary folder and renamed onto
    ``part_path`` (replacing an earlier attempt's, which holds the same content).  ``options``
    are :func:`~mmpack.ingest.pipeline.ingest` keywords (``tokenizer`` as a path, ``"byte"`` or a
    :class:`~mmpack.ingest.tokenizer.TokenizerSpec``).

    Returns
    -------
    dict
        ``docs_read``, ``docs_written``, ``docs_skipped``, ``empty_skipped``, ``tokens_written``,
        ``issues`` (the first 1000 :class:`IngestIssue`), ``issues_total``, ``fingerprint``,
        ``seconds``.
    """
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TypeError(f"unexpected build options {sorted(unknown)}")
    issues: list[IngestIssue] = []

    def keep(issue: IngestIssue) -> None:
        if len(issues) < _MAX_ISSUES:
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


def build_distributed(
    inputs: Any,
    output: str | os.PathLike[str],
    *,
    engine: str = "dask",
    scheduler: str | None = None,
    n_workers: int | None = None,
    part_bytes: int = _DEFAULT_PART_BYTES,
    retries: int = 1,
    overwrite: bool = False,
    progress: bool | None = None,
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
    progress : bool, optional
        A progress bar on stderr (input bytes, parts, documents, tokens, ETA); default: when
        stderr is a terminal.
    on_issue : callable, optional
        Called with every skipped record, in input order (default: a warning for the first 20).
    on_part : callable, optional
        Called as ``on_part(index, result)`` when a part is done (in completion order).
    part_function : callable, optional
        The per-task function (default :func:`build_part`); one with the same signature and
        result may wrap it (e.g. to log or to test retries).
    **options
        :func:`~mmpack.ingest.pipeline.ingest` keywords: ``tokenizer``, ``field``, ``lines``,
        ``format``, ``batch_size``, ``batch_chars``, ``on_error``, ``skip_empty``, ``backend``,
        ``split``, ``template``.

    Returns
    -------
    IngestReport
        Summed over the parts; ``store`` is the opened :class:`~mmpack.store.parts.JoinedStore`.

    Raises
    ------
    Whatever a task raised (e.g. :class:`~mmpack.ingest.pipeline.IngestError` with
    ``on_error="fail"``); nothing is published then.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TypeError(f"build_distributed() got unexpected keyword arguments {sorted(unknown)}")
    out = _as_path(output, "output")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise StoreExistsError(f"{str(out)!r} exists; pass overwrite=True to replace it")
    if out.exists() and not any((out / m).is_file() for m in _STORE_MARKERS):
        raise StoreExistsError(
            f"{str(out)!r} exists and is not a store; not replacing it "
            "(overwrite=True replaces stores only)"
        )
    if not out.parent.is_dir():
        raise FileNotFoundError(f"parent folder {str(out.parent)!r} of the store does not exist")
    base = load_tokenizer(options.get("tokenizer"))
    options["tokenizer"] = base.spec  # picklable; every worker rebuilds the same tokenizer
    tok = with_template(base, options.get("template"))  # what the parts apply (for the record)
    tasks = plan_tasks(inputs, part_bytes=part_bytes)
    sizes = [sum(_size_of(Path(f)) for f in t) for t in tasks]
    if progress is None:
        progress = _stderr_is_tty()
    stage = out.parent / f".{out.name}{_STAGE_TAG}{os.getpid()}-{secrets.token_hex(4)}"
    (stage / "parts").mkdir(parents=True)
    part_paths = [str(stage / "parts" / f"part-{k:05d}") for k in range(len(tasks))]
    t0 = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    bar = _Progress(sum(sizes), len(tasks)) if progress else None
    try:
        runner = _run_dask if engine == "dask" else _run_serial
        workers = runner(
            part_function or build_part,
            tasks,
            part_paths,
            options,
            scheduler,
            n_workers,
            retries,
            _collector(results, sizes, bar, on_part),
        )
        data = tokenizer_files(tok)
        store_extra = {
            "tokenizer": tokenizer_record_of(tok, copied=data is not None),
            "provenance": _provenance(tasks, results, tok),
        }
        write_join_into(
            stage,
            part_paths,
            extra=store_extra,
            attach={TOKENIZER_FILE: data} if data is not None else None,
        )
        _publish(stage, out, overwrite)
    except BaseException:
        _remove_stage(stage)
        raise
    finally:
        if bar is not None:
            bar.close()
    report = IngestReport(path=out, tokenizer=str(tok.spec), workers=workers)
    for res in results:
        assert res is not None
        for key in (
            "docs_read",
            "docs_written",
            "docs_skipped",
            "empty_skipped",
            "tokens_written",
            "issues_total",
        ):
            setattr(report, key, getattr(report, key) + res[key])
        report.issues.extend(res["issues"][: _MAX_ISSUES - len(report.issues)])
    report.seconds = time.perf_counter() - t0
    report.store = open_join(out)
    _emit_issues(report, on_issue)
    return report


# --------------------------------------------------------------------------------- engines
def _run_serial(fn, tasks, part_paths, options, scheduler, n_workers, retries, done) -> int:
    if scheduler is not None:
        raise ValueError("scheduler= is for engine='dask'")
    for k, (inputs, path) in enumerate(zip(tasks, part_paths)):
        for attempt in range(retries + 1):
            try:
                result = fn(inputs, path, options)
                break
            except IngestError:  # a bad record fails the same way every time
                raise
            except Exception:
                if attempt == retries:
                    raise
        done(k, result)
    return 1


def _run_dask(fn, tasks, part_paths, options, scheduler, n_workers, retries, done) -> int:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise MissingDependencyError(
            "engine='dask' needs dask.distributed, which is not installed",
            "distributed",
            "distributed",
        ) from None
    with _client(Client, LocalCluster, scheduler, n_workers) as client:
        token = secrets.token_hex(4)
        futures = {
            client.submit(
                fn,
                inputs,
                path,
                options,
                key=f"mmpack-part-{token}-{k:05d}",
                pure=False,
                retries=retries,
            ): k
            for k, (inputs, path) in enumerate(zip(tasks, part_paths))
        }
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            client.cancel(list(futures))
            raise
        return len(client.scheduler_info(n_workers=-1).get("workers", {})) or 1


class _client:
    """A Dask client on ``scheduler``, or on a loopback-only LocalCluster closed afterwards."""

    def __init__(self, Client, LocalCluster, scheduler, n_workers) -> None:
        self._args = (Client, LocalCluster, scheduler, n_workers)
        self._cluster = None
        self._client = None

    def __enter__(self):
        Client, LocalCluster, scheduler, n_workers = self._args
        if scheduler is not None:
            self._client = Client(scheduler)
        else:
            self._cluster = LocalCluster(
                n_workers=n_workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
            )
            self._client = Client(self._cluster)
        return self._client

    def __exit__(self, *exc) -> None:
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()


# --------------------------------------------------------------------------------- helpers
def _collector(results, sizes, bar, on_part):
    def done(k: int, res: dict[str, Any]) -> None:
        results[k] = res
        if bar is not None:
            bar.update(sizes[k], res)
        if on_part is not None:
            on_part(k, res)

    return done


def _provenance(tasks, results, tok) -> dict[str, Any]:
    totals = _Totals(results)
    rec = provenance_record(
        [f for t in tasks for f in t],
        totals,
        tok,
        builder="mmpack.ingest.distributed.build_distributed",
    )
    rec["parts"] = len(tasks)
    return rec


class _Totals:
    def __init__(self, results) -> None:
        for key in ("docs_read", "docs_written", "docs_skipped", "empty_skipped", "tokens_written"):
            setattr(self, key, sum(r[key] for r in results))


def _publish(stage: Path, out: Path, overwrite: bool) -> None:
    from mmpack.store.writer import _swap_into_place

    _swap_into_place(stage, out, overwrite)


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
        stacklevel=3,
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


def _size_of(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _is_dataset_dir(path: Path) -> bool:
    return path.is_dir() and any(
        (path / m).is_file() for m in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Progress:
    """A tqdm bar over input bytes with parts, documents and tokens done (tqdm gives the ETA)."""

    def __init__(self, total_bytes: int, parts: int) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="building parts",
            file=sys.stderr,
            smoothing=0.1,
        )
        self._parts, self._done, self._docs, self._tokens = parts, 0, 0, 0

    def update(self, nbytes: int, res: dict[str, Any]) -> None:
        self._done += 1
        self._docs += res["docs_written"]
        self._tokens += res["tokens_written"]
        self._bar.set_postfix_str(
            f"parts {self._done}/{self._parts}, {self._docs:,} docs, {self._tokens:,} tokens",
            refresh=False,
        )
        self._bar.update(nbytes)

    def close(self) -> None:
        self._bar.close()
