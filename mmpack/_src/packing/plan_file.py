"""The packing plan's file format: a plan written once per store and parameters, checked on
every load.

A plan is keyed by the store fingerprint and its :class:`~mmpack.packing.PlanSpec`
(:func:`plan_cache_key`) and kept in ``<store>/cache/plan-<key>.mmplan`` (:func:`plan_path`; the
cache: :func:`mmpack.packing.cached_plan`): a checked header then the raw arrays, each with the
XXH64 of every :data:`CHUNK_BYTES` chunk (:func:`mmpack._src.store.integrity.stripe_digests`,
~11 GB/s; the layout: :func:`save_plan`), written to a temporary file and renamed into place,
and memory-mapped when read back, each chunk checked once, by the load or on first use
(:func:`load_plan`): a damaged chunk is refused before a sample is served from it, instead of
silently duplicating or dropping documents.

The header's room is reserved from what is known before the arrays are (the key, the parameters,
the statistics, the array shapes; offsets and digests at their widest), so a file is the same
bytes whether its arrays were in memory (:func:`save_plan`) or streamed in from parts
(:func:`write_plan_file`, which :mod:`mmpack._src.packing.plan_regions` joins region plans with).  A
plan is a cache: a file of another format version is refused and rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mmpack._src.packing.options import PlanSpec
from mmpack._src.packing.plan import ALGORITHMS, PackingPlan
from mmpack._src.packing.plan_pages import PlanPages
from mmpack._src.packing.plan_stats import PackingStats
from mmpack._src.store.checked_file import (
    HEADER_PREFIX,
    aligned,
    map_array,
    read_header,
    write_checked_file,
)
from mmpack._src.store.integrity import stripe_digests
from mmpack.errors import FormatError, StateMismatchError

__all__ = [
    "ARRAYS",
    "CHUNK_BYTES",
    "PLAN_FORMAT_VERSION",
    "load_plan",
    "plan_cache_key",
    "plan_params",
    "plan_path",
    "save_plan",
    "write_plan_file",
]


PLAN_FORMAT_VERSION = 6
"""Version of the plan file layout (6: 8 bytes a piece, documents relative to their region and a
sparse table of split pieces, :mod:`mmpack._src.packing.plan_pieces`; 5: 20 bytes a piece, an XXH64 per
:data:`CHUNK_BYTES` of each array and the most pieces in a bin; 4: one XXH64 per array).  Only
this version is read: a cached plan of another is rebuilt."""

CHUNK_BYTES = 1 << 24
"""Bytes of an array per recorded digest (16 MiB, the store's block): the unit a reopened plan
checks on first use."""

_KEY_VERSION = 6
"""Version of the plan algorithms and key fields, recorded as ``"format"`` in every cache key
(6: regions left the free slots best fit needs in a few regions packed alone,
:func:`~mmpack._src.packing.region_cuts.region_slack`; 5: region edges moved to where regions fill
their bins)."""

_MAGIC = b"MMPKPLAN"
_WIDEST = 2**64 - 1
"""The widest value an offset or a digest takes in the header (20 digits)."""
ARRAYS = (
    ("bin_ptr", np.dtype("<i8")),
    ("piece_ref", np.dtype("<u4")),
    ("piece_len", np.dtype("<i4")),
    ("split", np.dtype("<i8")),
    ("region_bin", np.dtype("<i8")),
    ("region_doc", np.dtype("<i8")),
    ("region_split", np.dtype("<i8")),
)
"""The arrays of a plan file, in file order, and their on-disk dtypes."""


def plan_cache_key(fingerprint: str, spec: PlanSpec) -> dict[str, Any]:
    """Everything a cached plan depends on: the store's fingerprint and the plan's parameters
    (:meth:`~mmpack.packing.PlanSpec.params`: canonical option names, ``lookahead``
    only for ``"online"``, ``region_tokens`` resolved, so ``"auto"`` and the number it stands
    for share a plan)."""
    return {"format": _KEY_VERSION, "fingerprint": str(fingerprint), **spec.params()}


def plan_path(cache_dir: str | os.PathLike[str], key: dict[str, Any]) -> Path:
    """Where the plan of ``key`` is cached: ``cache_dir/plan-<16 hex digits of its SHA-256>.mmplan``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"plan-{digest}.mmplan"


def plan_params(plan: PackingPlan) -> dict[str, Any]:
    """The parameters a plan file records, in :class:`~mmpack.packing.PlanSpec`'s order
    (``add_eot`` under ``"eot"``)."""
    names = (f.name for f in dataclasses.fields(PlanSpec))
    return {("eot" if name == "add_eot" else name): getattr(plan, name) for name in names}


def save_plan(plan: PackingPlan, path: str | os.PathLike[str], key: dict[str, Any]) -> None:
    """Write ``plan`` to ``path`` atomically (:func:`~mmpack._src.store.checked_file.write_checked_file`).

    Layout (format 6): ``MMPKPLAN``, a little-endian uint64 header length, a JSON header
    (``"format": 6``, ``key``, the plan parameters (``add_eot`` under the key ``"eot"``), the
    statistics, ``"chunk_bytes"``, ``"max_bin_pieces"``, each array's dtype/shape/offset and
    ``"xxh64"``: the XXH64 (seed 0) of each ``chunk_bytes`` of its little-endian bytes, the last
    chunk short), the little-endian uint32 CRC-32 of the header, then the raw arrays
    (:data:`ARRAYS`), each aligned to 64 bytes.
    """
    arrays = {name: np.ascontiguousarray(getattr(plan, name), dtype=dt) for name, dt in ARRAYS}

    def fill(name: str, f: BinaryIO) -> None:
        f.write(memoryview(arrays[name]).cast("B"))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__

    shapes = {name: arr.shape[0] for name, arr in arrays.items()}
    write_plan_file(path, key, plan_params(plan), plan.stats, shapes, fill)


def write_plan_file(
    path: str | os.PathLike[str],
    key: dict[str, Any],
    params: dict[str, Any],
    stats: PackingStats,
    shapes: dict[str, int],
    fill: Callable[[str, BinaryIO], None],
) -> None:
    """Write a plan file atomically from its parts: ``fill(name, f)`` writes array ``name``
    (``shapes[name]`` entries of its :data:`ARRAYS` dtype, little-endian) at ``f``'s position,
    in as many writes as it likes; the chunk digests and the most pieces in a bin are then
    computed over the bytes written (read back through a mapping), so no array need ever be in
    memory whole."""
    header, data_start, end = _layout(key, params, stats, shapes)

    def write_arrays(f: BinaryIO) -> dict[str, Any]:
        for name, dt in ARRAYS:
            spec = header["arrays"][name]
            f.seek(spec["offset"])
            fill(name, f)
            if f.tell() != spec["offset"] + shapes[name] * dt.itemsize:
                raise AssertionError(f"plan array {name!r} was written with the wrong size")
        f.truncate(end)
        f.flush()
        for name, dt in ARRAYS:
            spec = header["arrays"][name]
            mapped = _mapped(f, spec["offset"], dt, shapes[name])
            spec["xxh64"] = stripe_digests(mapped, CHUNK_BYTES).tolist()
            if name == "bin_ptr":  # max(diff(bin_ptr)), a chunk at a time (0 for no bins)
                step = CHUNK_BYTES // 8
                chunks = range(0, mapped.shape[0] - 1, step)
                most = (int(np.diff(mapped[lo : lo + step + 1]).max()) for lo in chunks)
                header["max_bin_pieces"] = max(most, default=0)
        return header

    write_checked_file(path, _MAGIC, data_start, end, write_arrays)


def _layout(
    key: dict[str, Any], params: dict[str, Any], stats: PackingStats, shapes: dict[str, int]
) -> tuple[dict[str, Any], int, int]:
    """The header (digests still missing), where the arrays start and where the file ends: the
    room for the header is that of the header with every offset and digest at its widest."""
    header: dict[str, Any] = {
        "format": PLAN_FORMAT_VERSION,
        "key": key,
        "plan": params,
        "stats": stats.as_dict(),
        "chunk_bytes": CHUNK_BYTES,
        "max_bin_pieces": _WIDEST,
        "arrays": {
            name: {
                "dtype": dt.str,
                "shape": [int(shapes[name])],
                "offset": _WIDEST,
                "xxh64": [_WIDEST] * -(-int(shapes[name]) * dt.itemsize // CHUNK_BYTES),
            }
            for name, dt in ARRAYS
        },
    }
    data_start = aligned(HEADER_PREFIX + len(json.dumps(header).encode()))
    pos = data_start
    for name, dt in ARRAYS:
        spec = header["arrays"][name]
        spec["offset"] = pos
        del spec["xxh64"]
        pos = aligned(pos + int(shapes[name]) * dt.itemsize)
    return header, data_start, pos


def _mapped(f: BinaryIO, offset: int, dt: np.dtype, length: int) -> np.ndarray:
    """``length`` entries of ``dt`` at ``offset`` of the open file ``f``, read-only (mapped
    when not empty)."""
    if length == 0:
        return np.empty(0, dtype=dt)
    return np.memmap(f, dtype=dt, mode="r", offset=offset, shape=(length,)).view(np.ndarray)


def load_plan(
    path: str | os.PathLike[str],
    key: dict[str, Any] | None = None,
    *,
    part: bool = False,
    lazy: bool = False,
) -> PackingPlan:
    """Memory-map a plan written by :func:`save_plan`.  ``part=True`` reads the plan of some
    regions of a store (:func:`~mmpack._src.packing.plan.pack_regions`), whose regions need not start
    at document 0.

    Cost: the header, the region arrays and the first and last chunk of each other array; with
    ``lazy=False`` (default) every other chunk too (one pass over the file); with ``lazy=True``
    each other chunk is checked the first time a bin is read from it (the plan's
    :attr:`~mmpack._src.packing.plan.PackingPlan.pages`), so opening costs the same whatever the plan's
    size, and a reader of the arrays whole calls ``plan.check_all()`` first.

    Raises
    ------
    FormatError
        Not a plan file, another format version, a failed checksum, or arrays inconsistent with
        the file or with each other.
    StateMismatchError
        ``key`` is given and differs from the one recorded (other data or other parameters).
    """
    path = Path(path)
    header, data_start, size = read_header(path, _MAGIC, "packing plan")
    try:
        version = header["format"]
        stored_key = header["key"]
        params = header["plan"]
        stats = PackingStats(**header["stats"])
        layout = header["arrays"]
    except (KeyError, TypeError) as exc:
        raise FormatError(f"{path}: unreadable plan header ({exc})") from None
    if version != PLAN_FORMAT_VERSION:
        raise FormatError(
            f"{path}: plan format {version!r}, this mmpack reads {PLAN_FORMAT_VERSION}"
        )
    if key is not None and stored_key != key:
        raise StateMismatchError(
            f"{path} was built for {stored_key}, not for {key}: other data or other parameters"
        )
    if not isinstance(layout, dict) or any(name not in layout for name, _ in ARRAYS):
        raise FormatError(f"{path}: unreadable plan header (arrays)")
    arrays = {
        name: map_array(path, size, data_start, name, layout[name], "plan", dt, check=False)
        for name, dt in ARRAYS
    }
    try:
        digests = {name: [int(d) for d in layout[name]["xxh64"]] for name, _ in ARRAYS}
        chunk, most = int(header["chunk_bytes"]), int(header["max_bin_pieces"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: unreadable plan header (digests: {exc})") from None
    pages = PlanPages(path, arrays, digests, chunk)
    if not lazy:
        pages.check_all()
    _check_consistent(path, arrays, stats, part)
    try:
        algorithm = str(params["algorithm"])
        region_tokens = params["region_tokens"]
        plan = PackingPlan(
            **arrays,
            seqlen=int(params["seqlen"]),
            add_eot=bool(params["eot"]),
            long_docs=str(params["long_docs"]),
            algorithm=algorithm,
            lookahead=params["lookahead"],
            region_tokens=None if region_tokens is None else int(region_tokens),
            stats=stats,
            pages=None if pages.all_checked() else pages,
            most_pieces=most,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: unreadable plan parameters ({exc})") from None
    if algorithm not in ALGORITHMS:
        raise FormatError(f"{path}: plan of unknown algorithm {algorithm!r}")
    return plan


def _check_consistent(
    path: Path, arrays: dict[str, np.ndarray], stats: PackingStats, part: bool
) -> None:
    """The O(n_regions) checks that the row kernels and the region readers rely on."""
    n_pieces = arrays["piece_ref"].shape[0]
    bp, rb, rd = arrays["bin_ptr"], arrays["region_bin"], arrays["region_doc"]
    rs, split = arrays["region_split"], arrays["split"]
    if (
        bp.shape[0] < 1
        or int(bp[0]) != 0
        or int(bp[-1]) != n_pieces
        or arrays["piece_len"].shape[0] != n_pieces
        or stats.n_bins != bp.shape[0] - 1
        or rb.shape != rd.shape
        or rs.shape != rd.shape
        or rd.shape[0] < 1
        or int(rs[0]) != 0
        or np.any(np.diff(rs) < 0)
        or 2 * int(rs[-1]) != split.shape[0]
        or rb.shape[0] != stats.n_regions + 1
        or int(rb[0]) != 0
        or int(rb[-1]) != stats.n_bins
        or np.any(np.diff(rb) < 0)
        or np.any(np.diff(rd) <= 0)
        or int(rd[-1]) - int(rd[0]) != stats.n_docs
        or (not part and int(rd[0]) != 0)
    ):
        raise FormatError(f"{path}: plan arrays are inconsistent with each other")
