"""A plan packed per region, built in parts: each part packs some regions from the offsets alone,
the parts are joined into the cached plan file without any process holding every length; the
cache of plans (:func:`cached_plan`) builds every plan per region this way, serially.

::

    offsets ──region slots [0, K) cut into tasks──▶ task 0: slots [0, s)   task 1: [s, 2s)  ...
                                                      │ build_part (any engine)  │
                                                      ▼                          ▼
    <cache>/.plan-parts-*/                          part-00000.mmplan      part-00001.mmplan
                                                      └──── _join_parts (streamed, offsets fixed) ──▶
    <cache>/plan-<key>.mmplan  (the file cached_plan finds: the same bytes as a serial build)

Algorithm.  A region's plan depends on its documents' lengths only, so the region slots
(:mod:`mmpack._src.packing.region_cuts`) are cut into tasks of consecutive slots, each an independent
:func:`build_part`: it finds its slots' documents by binary search over the store's offsets, packs
them (:func:`~mmpack._src.packing.plan.pack_regions`) and writes a part file atomically.
:func:`_join_parts` streams the parts into one file in task order, shifting each part's CSR arrays
by the parts before it: byte for byte the file :func:`~mmpack.packing.save_plan` writes
for the plan in memory, where :func:`cached_plan` looks.

Cost.  A task: O(its documents + slots * log n) reads of the offsets and its regions' packing.
The driver packs the probes of :func:`~mmpack._src.packing.region_cuts.region_slack` once; the join
copies the plan arrays once (:data:`JOIN_CHUNK` at a time) and reads them again for the digests.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mmpack._src.core.validation import check_int_range
from mmpack._src.packing.options import PlanSpec
from mmpack._src.packing.plan import PackingPlan, pack_regions, plan_of_offsets
from mmpack._src.packing.plan_file import (
    ARRAYS,
    load_plan,
    plan_cache_key,
    plan_params,
    plan_path,
    save_plan,
    write_plan_file,
)
from mmpack._src.packing.plan_stats import merge_stats
from mmpack._src.packing.region_cuts import n_region_slots, region_edges, region_slack
from mmpack.errors import FormatError, StateMismatchError

__all__ = [
    "JOIN_CHUNK",
    "TASK_TOKENS",
    "build_part",
    "build_plan_in_parts",
    "cached_plan",
]

JOIN_CHUNK = 1 << 20
"""Entries of one array copied at a time by :func:`_join_parts` (8 MiB of int64)."""

TASK_TOKENS = 1 << 25
"""Tokens of the regions one task packs by default (at most 2^25 documents of one token or more,
under 2 GiB of lengths, packing state and plan; about 10^5 C4-like documents), unless a region
is larger: what bounds a build's memory whatever the store's size."""

_Runner = Callable[
    [Callable[..., dict[str, Any]], list[Any], list[str], dict[str, Any], Callable[..., None]],
    Any,
]
"""``run(fn, tasks, part_paths, options, done)``: call ``fn(task, path, options)`` for every task
(in any order, anywhere that sees ``path``'s folder) and ``done(k, result)`` with each result."""


def build_part(slots: Sequence[int], path: str, options: dict[str, Any]) -> dict[str, Any]:
    """Pack region slots ``[lo, hi)`` of ``options["store"]`` and write them to the plan file
    ``path`` (atomically); an engine-neutral task (:data:`_Runner`).

    ``options`` holds the store (a :class:`~mmpack.TokenStore`, pickled to the
    worker by its location), ``"spec"``, the plan's :class:`~mmpack.packing.PlanSpec`
    (``region_tokens`` an int), ``"slack"``, the whole plan's
    :func:`~mmpack._src.packing.region_cuts.region_slack`, and ``"key"``, the whole plan's key (the
    part's is :func:`_part_key`).  Reads the store's offsets at O(hi - lo) binary searches and over the
    part's documents only, and checks only the pages of the index those lie on (a store is
    opened in O(1); the parts together check every page).  Returns the part's
    ``n_docs``, ``n_bins`` and ``n_regions``.
    """
    lo, hi = (int(v) for v in slots)
    store, spec = options["store"], options["spec"]
    # binary searches that check only the pages they probe, then the part's pages of the index
    edges = region_edges(
        store.paged_offsets,
        spec.region_tokens,
        spec.seqlen,
        int(spec.add_eot),
        lo,
        hi,
        options["slack"],
    )
    first, last = int(edges[0]), int(edges[-1])
    lens = np.diff(np.asarray(store.doc_bounds(first, last), dtype=np.int64))
    plan = pack_regions(lens, edges, spec)
    save_plan(plan, path, _part_key(options["key"], (lo, hi)))
    s = plan.stats
    return {"n_docs": s.n_docs, "n_bins": s.n_bins, "n_regions": s.n_regions}


def _join_parts(
    part_paths: Sequence[str | Path], part_keys: Sequence[dict[str, Any]], path: Path, key: dict
) -> None:
    """Join the part plans (in order: consecutive regions from document 0 to the end) into the
    plan file ``path`` with ``key``, streamed (:data:`JOIN_CHUNK` entries at a time).

    Raises
    ------
    FormatError
        A part is damaged, or the parts do not follow each other (a part's first document is
        not where the previous one ended, or the first is not document 0).
    StateMismatchError
        A part was built for another key.
    """
    parts = [load_plan(p, k, part=True) for p, k in zip(part_paths, part_keys)]
    doc = 0
    for p, part in zip(part_paths, parts):
        if int(part.region_doc[0]) != doc:
            raise FormatError(f"{p}: the part starts at document {part.region_doc[0]}, not {doc}")
        doc = int(part.region_doc[-1])
    first = parts[0]
    stats = merge_stats([p.stats for p in parts], first.seqlen)
    shapes = {name: sum(getattr(p, name).shape[0] for p in parts) for name, _ in ARRAYS}
    csrs = ("bin_ptr", "region_bin", "region_doc", "region_split")
    for name in csrs:  # CSR: one end entry for all
        shapes[name] -= len(parts) - 1
    # what each CSR array counts, and that count's entries per counted item
    bases = {
        "bin_ptr": ("piece_ref", 1),
        "region_bin": ("bin_ptr", 1),
        "region_split": ("split", 2),
    }
    dtypes: dict[str, np.dtype] = dict(ARRAYS)

    def fill(name: str, f: BinaryIO) -> None:
        base = 0
        for k, part in enumerate(parts):
            arr = getattr(part, name)
            csr = name in csrs
            stop = arr.shape[0] - (1 if csr and k < len(parts) - 1 else 0)
            for lo in range(0, stop, JOIN_CHUNK):
                chunk = arr[lo : min(lo + JOIN_CHUNK, stop)]
                if name in bases:
                    chunk = chunk + base
                f.write(memoryview(np.ascontiguousarray(chunk, dtype=dtypes[name])).cast("B"))  # type: ignore[arg-type]
            if name in bases:
                counted, per = bases[name]
                base += getattr(part, counted).shape[0] // per - (name == "region_bin")

    write_plan_file(path, key, plan_params(first), stats, shapes, fill)


def _part_key(key: dict[str, Any], slots: Sequence[int]) -> dict[str, Any]:
    """The key of the part plan of slots ``[lo, hi)`` of the plan of ``key``."""
    return {"part_of": key, "slots": [int(v) for v in slots]}


def build_plan_in_parts(
    store: Any,
    spec: PlanSpec,
    *,
    regions_per_task: int | None = None,
    run: _Runner | None = None,
    fresh: bool = False,
) -> PackingPlan:
    """The plan :func:`cached_plan` gives for ``spec`` (with regions), built in parts by ``run``
    (default: one after another in this process) and cached in the store's cache folder; an
    existing sound cached plan is returned as it is (unless ``fresh``: the caller found none).

    Parameters
    ----------
    store : TokenStore
        Its ``offsets``, ``fingerprint`` and ``cache_dir`` are used; ``run`` may pickle it.
    spec : PlanSpec
        The plan's parameters; ``region_tokens`` must not be None.
    regions_per_task : int, optional
        Region slots per task (default: about :data:`TASK_TOKENS` tokens a task).
    run : _Runner, optional
        Runs the tasks; the part files go to a temporary folder inside the cache folder, which
        every worker must see, removed afterwards.

    Returns
    -------
    PackingPlan
        The cached plan, memory-mapped.

    Raises
    ------
    ValueError
        ``spec.region_tokens`` is None (one region is not built in parts), or a bad
        ``regions_per_task``.
    """
    r = spec.region_tokens
    if r is None:
        raise ValueError("region_tokens must be an integer >= 1 or 'auto' to build in parts")
    per_task = max(1, TASK_TOKENS // r) if regions_per_task is None else regions_per_task
    per_task = check_int_range(per_task, "regions_per_task", 1)
    key = plan_cache_key(store.fingerprint, spec)
    path = plan_path(store.cache_dir, key)
    if not fresh:
        with contextlib.suppress(FormatError, StateMismatchError, OSError):
            return load_plan(path, key)
    k = n_region_slots(int(store.num_tokens), r)  # tasks: [lo, hi) ranges of slots
    tasks = [[lo, min(lo + per_task, k)] for lo in range(0, k, per_task)]
    # the probes' pages of the index are checked before they are read
    slack = region_slack(store.paged_offsets, r, spec.seqlen, int(spec.add_eot), store.doc_bounds)
    options = {"store": store, "key": key, "spec": spec, "slack": slack}
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=".plan-parts-"))
    try:
        paths = [str(folder / f"part-{k:05d}.mmplan") for k in range(len(tasks))]
        done: dict[int, dict[str, Any]] = {}
        if run is None:
            for k, (task, part) in enumerate(zip(tasks, paths)):
                done[k] = build_part(task, part, options)
        else:
            run(build_part, tasks, paths, options, done.__setitem__)
        if len(done) != len(tasks):
            raise RuntimeError(
                f"{len(tasks) - len(done)} of {len(tasks)} plan parts were not built"
            )
        _join_parts(paths, [_part_key(key, t) for t in tasks], path, key)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return load_plan(path, key)


def cached_plan(store: Any, spec: PlanSpec, *, cache: bool = True) -> PackingPlan:
    """The plan of ``spec`` of ``store``'s documents, from its cache folder or built.

    A cached file is used only if its recorded key (store fingerprint, every parameter, format
    version) equals this one; a mismatching or damaged file is rebuilt and replaced, with a
    warning.  A cached file is reopened in O(1) (``load_plan(lazy=True)``: its header, regions
    and end chunks): every other chunk is checked on first use by the plan's consumers
    (:meth:`~mmpack._src.packing.plan.PackingPlan.check_bins`), and a damaged one raises
    :class:`~mmpack.errors.FormatError` then; read the arrays whole only after
    :meth:`~mmpack._src.packing.plan.PackingPlan.check_all`.  A plan per region is built by
    :func:`build_plan_in_parts` (serially, one task of about :data:`TASK_TOKENS` tokens in
    memory at a time, each written out as it is made), the file a parallel build
    (:func:`mmpack.ingest.build_region_plan`) writes too; a whole-store plan
    (``region_tokens=None``) in memory.  If the store folder is not writable the plan is
    computed in memory, silently.  ``cache=False`` neither reads nor writes the cache.
    """
    key = plan_cache_key(store.fingerprint, spec)
    path = plan_path(store.cache_dir, key)
    if cache and path.is_file():
        try:
            return load_plan(path, key, lazy=True)
        except (FormatError, StateMismatchError) as exc:
            warnings.warn(f"rebuilding the packing plan: {exc}", stacklevel=2)
        except OSError:
            pass
    if cache and spec.region_tokens is not None:
        with contextlib.suppress(OSError):  # a folder that cannot be written: in memory
            return build_plan_in_parts(store, spec, fresh=True)
    plan = plan_of_offsets(store.offsets, spec)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_plan(plan, path, key)
        except OSError:
            pass
    return plan
