"""The engines that run a distributed build's tasks, and the driver's progress bar.

Owns the runners (``run(fn, tasks, part_paths, options, scheduler, n_workers, retries, done)``,
``options`` one dict per task, returning the number of workers used), :data:`ENGINES`, and :class:`PartsProgress`.

- ``"serial"``: the tasks one after another in this process; a task that raises anything but an
  :class:`~mmpack._src.ingest.pipeline.IngestError` (a bad record fails the same way every time) is
  rerun up to ``retries`` times.
- ``"dask"``: one ``dask.distributed`` task per part (keyed ``mmpack-part-<token>-<k>``, impure,
  with the engine's own ``retries``) on the cluster at ``scheduler``, or on a ``LocalCluster`` of
  ``n_workers`` single-threaded processes listening on 127.0.0.1 only, closed afterwards.
  Results are handed to ``done`` in completion order; on any failure the other tasks are
  cancelled (a running one still runs to its end).

Cost: the tasks' own; the driver holds one small result dict per part.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any

from mmpack._src.core.progress import progress_bar
from mmpack.errors import IngestError, MissingDependencyError, Param, with_params

__all__ = ["ENGINES", "PartsProgress", "RUNNERS", "collector"]


def _run_serial(fn, tasks, part_paths, options, scheduler, n_workers, retries, done) -> int:
    """Run the tasks in order in this process; returns 1 (the workers used)."""
    if scheduler is not None:
        raise with_params(ValueError, Param("scheduler"), " is for ", Param("engine", "dask"))
    for k, (inputs, path, opts) in enumerate(zip(tasks, part_paths, options)):
        for attempt in range(retries + 1):
            try:
                result = fn(inputs, path, opts)
                break
            except IngestError:  # a bad record fails the same way every time
                raise
            except Exception:
                if attempt == retries:
                    raise
        done(k, result)
    return 1


def _run_dask(fn, tasks, part_paths, options, scheduler, n_workers, retries, done) -> int:
    """Run the tasks on a Dask cluster; returns the number of its workers."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise MissingDependencyError(
            "the Dask engine needs dask.distributed, which is not installed",
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
                opts,
                key=f"mmpack-part-{token}-{k:05d}",
                pure=False,
                retries=retries,
            ): k
            for k, (inputs, path, opts) in enumerate(zip(tasks, part_paths, options))
        }
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            client.cancel(list(futures))
            raise
        return len(client.scheduler_info(n_workers=-1).get("workers", {})) or 1


RUNNERS: dict[str, Callable[..., int]] = {"dask": _run_dask, "serial": _run_serial}
"""The runner of each engine name."""
ENGINES = tuple(RUNNERS)
"""The engine names ``build_distributed`` accepts: ``("dask", "serial")``."""


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


def collector(results, sizes, bar, on_part):
    """The ``done(k, result)`` callback of a runner: store the result, advance ``bar``, tell
    ``on_part``."""

    def done(k: int, res: dict[str, Any]) -> None:
        results[k] = res
        if bar is not None:
            bar.update(sizes[k], res)
        if on_part is not None:
            on_part(k, res)

    return done


class PartsProgress:
    """The driver's bar over the input bytes of the parts done, with parts, documents and tokens
    (:func:`mmpack._src.core.progress.progress_bar`: ``progress`` True, False or None)."""

    def __init__(self, progress: bool | None, total_bytes: int, parts: int) -> None:
        self._bar = progress_bar(progress, total_bytes, desc="building parts")
        self._parts, self._done, self._docs, self._tokens = parts, 0, 0, 0

    def update(self, nbytes: int, res: dict[str, Any]) -> None:
        self._done += 1
        self._docs += res["docs_written"]
        self._tokens += res["tokens_written"]
        self._bar.note(
            f"parts {self._done}/{self._parts}, {self._docs:,} docs, {self._tokens:,} tokens"
        )
        self._bar.update(nbytes)

    def close(self) -> None:
        self._bar.close()
