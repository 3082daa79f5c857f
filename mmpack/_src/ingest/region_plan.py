"""A store's packing plan per region built in parallel: the region tasks of
:mod:`mmpack._src.packing.plan_regions` run on the build engines (:mod:`mmpack._src.ingest.engines`).

``build_region_plan(store, seqlen, engine="dask")`` cuts the store's region slots into tasks of
about :data:`~mmpack._src.packing.plan_regions.TASK_TOKENS` tokens, runs one task per part on a Dask
cluster (a ``LocalCluster`` on 127.0.0.1 of ``n_workers`` single-threaded processes unless
``scheduler`` names one) or serially, and joins the parts into the store's cached plan file, the
one :class:`~mmpack.PackedDataset` with the same parameters then opens.  Each worker
reads its slots' offsets only (the store is pickled by its location, so every worker must see
the store folder, whose cache folder holds the parts); no process holds every length.  Cost: the
plan's packing spread over the workers, plus the join's one streamed copy of the plan arrays.
"""

from __future__ import annotations

from typing import Any

from mmpack._src.core.options import DEFAULT_LOOKAHEAD
from mmpack._src.ingest.engines import ENGINES, RUNNERS
from mmpack._src.packing.options import PlanSpec
from mmpack._src.packing.plan import PackingPlan
from mmpack._src.packing.plan_regions import build_plan_in_parts
from mmpack._src.store.reader import TokenStore

__all__ = ["build_region_plan"]


def build_region_plan(
    store: TokenStore,
    seqlen: int,
    *,
    add_eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
    region_tokens: int | str = "auto",
    regions_per_task: int | None = None,
    engine: str = "dask",
    scheduler: str | None = None,
    n_workers: int | None = None,
    retries: int = 1,
) -> PackingPlan:
    """Build (or find) the cached plan per region of ``store`` with one task per group of
    regions on ``engine``.

    Parameters
    ----------
    store : TokenStore
        A local store (its folder seen by every worker).
    seqlen, add_eot, long_docs, algorithm, lookahead, region_tokens
        As :class:`~mmpack.PackedDataset` (``add_eot``: whether the view has an
        eot, e.g. ``ds.eot is not None``).
    regions_per_task : int, optional
        Region slots per task (default: about ``TASK_TOKENS`` tokens a task).
    engine : {"dask", "serial"}
    scheduler : str, optional
        A Dask scheduler address; default: a loopback-only ``LocalCluster``.
    n_workers : int, optional
        Workers of the local cluster (default: the CPU count).
    retries : int
        Times the engine may rerun a failed task (a retried task rewrites the same part).

    Returns
    -------
    PackingPlan
        The cached plan, memory-mapped: the same file a serial build writes.
    """
    spec = PlanSpec(
        seqlen,
        add_eot=add_eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
        region_tokens=region_tokens,
    )
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a TokenStore, got {type(store).__name__}")
    runner = RUNNERS[engine]

    def run(
        fn: Any, tasks: list[Any], paths: list[str], options: dict[str, Any], done: Any
    ) -> None:
        runner(fn, tasks, paths, [options] * len(tasks), scheduler, n_workers, retries, done)

    return build_plan_in_parts(store, spec, regions_per_task=regions_per_task, run=run)
