"""The packing plan's file format and cache: a plan written once per store and parameters,
checked on every load.

:func:`cached_plan` keys a plan by the store fingerprint and every parameter
(:func:`plan_cache_key`; the algorithm by its canonical name) and keeps it in
``<store>/cache/plan-<key>.mmplan``: a JSON header (with its own CRC-32) then the raw arrays
(each with its digest in the header), written to a temporary file and renamed into place
(:func:`save_plan`), and memory-mapped when read back (:func:`load_plan`).  Loading checks every
digest, so a damaged plan is rebuilt (with a warning) instead of silently duplicating or
dropping documents.  The check reads the arrays once (about 23 bytes per C4-like document).
Format 3 digests each array with XXH64 (:func:`mmpack.store.integrity.block_digest`, ~11 GB/s),
format 2 with CRC-32 (~4 GB/s); format-2 files still load (checked with CRC-32) and
:func:`cached_plan` rewrites them as format 3. Reopening a cached plan (L=2048, page cache warm,
2-core VM at load 1.0, ``python -m benchmarks.bench_packing --reopen``, medians of 7 interleaved):
10^6 documents 2.5-3.6 ms against 5.5-11.3 ms for format 2; 10^7 documents (227-360 MB) 19-30 ms
against 52-80 ms (2.2-3.4x); the header alone costs 0.2 ms.

The plan itself (:class:`~mmpack.views.plan.PackingPlan`) and its algorithms live in
:mod:`mmpack.views.plan`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.core.options import DEFAULT_LOOKAHEAD, PackingAlgorithm
from mmpack.errors import FormatError, StateMismatchError
from mmpack.store.integrity import block_digest
from mmpack.views.plan import (
    ALGORITHMS,
    PackingPlan,
    PackingStats,
    build_plan,
    check_add_eot,
    check_params,
)

__all__ = ["PLAN_FORMAT_VERSION", "cached_plan", "load_plan", "plan_cache_key", "save_plan"]


PLAN_FORMAT_VERSION = 3
"""Version of the plan file layout written (2: a CRC-32 per array; 3: an XXH64 per array).
Formats 2 and 3 are read."""

_DIGEST_KINDS = {2: "crc32", 3: "xxh64"}
"""The array digest of each readable file format: its header field and
:func:`~mmpack.store.integrity.block_digest` kind."""

_KEY_VERSION = 3
"""Version of the plan algorithms and key fields, recorded as ``"format"`` in every cache key."""

_MAGIC = b"MMPKPLAN"
_ALIGN = 64
_ARRAYS = (
    ("bin_ptr", np.dtype("<i8")),
    ("piece_doc", np.dtype("<i8")),
    ("piece_start", np.dtype("<i8")),
    ("piece_len", np.dtype("<i4")),
)


def plan_cache_key(
    fingerprint: str,
    seqlen: int,
    *,
    add_eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
) -> dict[str, Any]:
    """Everything a cached plan depends on: canonical option names and ``lookahead`` only for
    ``"online"``.  Validates the parameters with the messages of
    :func:`~mmpack.views.plan.build_plan`."""
    add_eot = check_add_eot(add_eot)
    seqlen, long_docs, algorithm, lookahead = check_params(seqlen, long_docs, algorithm, lookahead)
    return {
        "format": _KEY_VERSION,
        "fingerprint": str(fingerprint),
        "seqlen": seqlen,
        "add_eot": add_eot,
        "long_docs": long_docs,
        "algorithm": algorithm,
        "lookahead": lookahead if algorithm == PackingAlgorithm.ONLINE else None,
    }


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def save_plan(plan: PackingPlan, path: str | os.PathLike[str], key: dict[str, Any]) -> None:
    """Write ``plan`` to ``path`` atomically (temporary file in the same folder, fsync, rename).

    Layout (format 3): ``MMPKPLAN``, a little-endian uint64 header length, a JSON header
    (``"format": 3``, ``key``, the plan parameters (``add_eot`` under the key ``"eot"``),
    the statistics, each array's dtype/shape/offset and ``"xxh64"``: the XXH64 (seed 0) of its
    little-endian bytes), the little-endian uint32 CRC-32 of the header, then the raw arrays,
    each aligned to 64 bytes.  Format 2 is the same with ``"crc32"`` in place of ``"xxh64"``.
    """
    _write_plan(plan, Path(path), key, PLAN_FORMAT_VERSION)


def _write_plan(plan: PackingPlan, path: Path, key: dict[str, Any], version: int) -> None:
    """:func:`save_plan` in file format ``version`` (2 or 3; tests write format 2 with it)."""
    digest = _DIGEST_KINDS[version]
    arrays = {name: np.ascontiguousarray(getattr(plan, name), dtype=dt) for name, dt in _ARRAYS}
    header: dict[str, Any] = {
        "format": version,
        "key": key,
        "plan": {
            "seqlen": plan.seqlen,
            "eot": plan.add_eot,
            "long_docs": plan.long_docs,
            "algorithm": plan.algorithm,
            "lookahead": plan.lookahead,
        },
        "stats": plan.stats.as_dict(),
        "arrays": {},
    }
    # Offsets depend on the header's length, which depends on the offsets: reserve digits.
    for name, arr in arrays.items():
        header["arrays"][name] = {
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "offset": 0,
            digest: block_digest(digest, arr),
        }
    blob = json.dumps(header).encode()
    data_start = _round_up(16 + len(blob) + 4 + 32 * len(arrays), _ALIGN)
    pos = data_start
    for name, arr in arrays.items():
        header["arrays"][name]["offset"] = pos
        pos = _round_up(pos + arr.nbytes, _ALIGN)
    blob = json.dumps(header).encode()
    if 16 + len(blob) + 4 > data_start:  # cannot happen: offsets add at most 20 digits each
        raise AssertionError("plan header overflow")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(blob)) + blob)
            f.write(struct.pack("<I", zlib.crc32(blob)))
            for name, arr in arrays.items():
                f.seek(header["arrays"][name]["offset"])
                f.write(memoryview(arr).cast("B"))  # type: ignore[arg-type]  # numpy stubs: ndarray lacks __buffer__
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_plan(path: str | os.PathLike[str], key: dict[str, Any] | None = None) -> PackingPlan:
    """Memory-map a plan written by :func:`save_plan` (cost: reading the header and checking
    every array's digest: XXH64 for format 3, CRC-32 for format 2).

    Raises
    ------
    FormatError
        Not a plan file, an unknown format version, a failed checksum, or arrays inconsistent
        with the file.
    StateMismatchError
        ``key`` is given and differs from the one recorded (other data or other parameters).
    """
    return _read_plan(Path(path), key)[0]


def _read_plan(path: Path, key: dict[str, Any] | None) -> tuple[PackingPlan, int]:
    """:func:`load_plan`, and the file format it read."""
    size = path.stat().st_size
    header, data_start = _read_header(path, size)
    try:
        version = header["format"]
        stored_key = header["key"]
        params = header["plan"]
        stats = PackingStats(**header["stats"])
        layout = header["arrays"]
    except (KeyError, TypeError) as exc:
        raise FormatError(f"{path}: unreadable plan header ({exc})") from None
    if not isinstance(version, int) or version not in _DIGEST_KINDS:
        raise FormatError(
            f"{path}: plan format {version!r}, this mmpack reads {sorted(_DIGEST_KINDS)}"
        )
    if key is not None and stored_key != key:
        raise StateMismatchError(
            f"{path} was built for {stored_key}, not for {key}: other data or other parameters"
        )
    digest = _DIGEST_KINDS[version]
    arrays = {
        name: _map_array(path, size, data_start, layout, name, dt, digest) for name, dt in _ARRAYS
    }
    n_pieces = arrays["piece_doc"].shape[0]
    bp = arrays["bin_ptr"]
    if (
        bp.shape[0] < 1
        or int(bp[0]) != 0
        or int(bp[-1]) != n_pieces
        or arrays["piece_start"].shape[0] != n_pieces
        or arrays["piece_len"].shape[0] != n_pieces
        or stats.n_bins != bp.shape[0] - 1
    ):
        raise FormatError(f"{path}: plan arrays are inconsistent with each other")
    algorithm = str(params["algorithm"])
    if algorithm not in ALGORITHMS:
        raise FormatError(f"{path}: plan of unknown algorithm {algorithm!r}")
    plan = PackingPlan(
        **arrays,
        seqlen=int(params["seqlen"]),
        add_eot=bool(params["eot"]),
        long_docs=str(params["long_docs"]),
        algorithm=algorithm,
        lookahead=params["lookahead"],
        stats=stats,
    )
    return plan, version


def _read_header(path: Path, size: int) -> tuple[dict[str, Any], int]:
    """The JSON header of a plan file, its checksum checked, and where the arrays may start."""
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) != 16 or head[:8] != _MAGIC:
            raise FormatError(f"{path} is not an mmpack packing plan")
        (hlen,) = struct.unpack("<Q", head[8:])
        if hlen > size - 20:
            raise FormatError(f"{path}: truncated plan header")
        blob = f.read(hlen)
        (stored_crc,) = struct.unpack("<I", f.read(4))
    if zlib.crc32(blob) != stored_crc:
        raise FormatError(f"{path}: the plan header fails its checksum (damaged file)")
    try:
        header = json.loads(blob)
    except ValueError as exc:
        raise FormatError(f"{path}: unreadable plan header ({exc})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: unreadable plan header (not an object)")
    return header, 20 + hlen


def _map_array(
    path: Path, size: int, data_start: int, layout: Any, name: str, dt: np.dtype, digest: str
) -> np.ndarray:
    """Array ``name`` of a plan file, memory-mapped read-only, its place and its ``digest``
    (``"crc32"`` or ``"xxh64"``) checked."""
    try:
        spec = layout[name]
        dtype = np.dtype(spec["dtype"])
        (length,) = spec["shape"]
        offset = int(spec["offset"])
        stored = int(spec[digest])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: bad layout of {name!r} ({exc})") from None
    if dtype != dt or length < 0 or offset < data_start or offset + length * dt.itemsize > size:
        raise FormatError(f"{path}: array {name!r} does not fit the file")
    if length == 0:
        arr = np.empty(0, dtype=dt)
    else:
        arr = np.memmap(path, dtype=dt, mode="r", offset=offset, shape=(length,)).view(np.ndarray)
    if block_digest(digest, arr) != stored:
        raise FormatError(
            f"{path}: plan array {name!r} fails its checksum ({digest}; damaged file: it would "
            "place documents wrongly)"
        )
    return arr


def cached_plan(
    store: Any,
    seqlen: int,
    *,
    add_eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
    cache: bool = True,
) -> PackingPlan:
    """:func:`build_plan` over ``store.doc_lens``, kept in ``<store>/cache/plan-<key>.mmplan``.

    A cached file is used only if its recorded key (store fingerprint, every parameter, format
    version) equals this one; a mismatching or damaged file is rebuilt and replaced, with a
    warning. A format-2 file (CRC-32 digests) is checked, used and rewritten as format 3. If the
    store folder is not writable the plan is computed in memory, silently.
    ``cache=False`` neither reads nor writes the cache.
    """
    key = plan_cache_key(
        store.fingerprint,
        seqlen,
        add_eot=add_eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
    )
    path = Path(store.cache_dir) / f"plan-{_key_digest(key)}.mmplan"
    if cache and path.is_file():
        try:
            plan, version = _read_plan(path, key)
            if version != PLAN_FORMAT_VERSION:
                with contextlib.suppress(OSError):  # the mapped old file stays valid (POSIX)
                    save_plan(plan, path, key)
            return plan
        except (FormatError, StateMismatchError) as exc:
            warnings.warn(f"rebuilding the packing plan: {exc}", stacklevel=2)
        except OSError:
            pass
    plan = build_plan(
        store.doc_lens,
        seqlen,
        add_eot=add_eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
    )
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_plan(plan, path, key)
        except OSError:
            pass
    return plan


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a
