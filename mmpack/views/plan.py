"""The packing plan: whole documents placed once, over the whole store, into ``seqlen``-token bins.

A plan is an index, not a copy of the tokens: CSR arrays ``bin_ptr`` (n_bins + 1) and, per piece,
``piece_doc``, ``piece_start`` (token offset inside the document) and ``piece_len`` (tokens taken).
With an end-of-text token, a piece carries it iff the piece is shorter than ``seqlen``: the full
pieces a split document is cut into hold exactly ``seqlen`` tokens and no eot, and every other
piece is the last (or only, or truncated) piece of its document and has room for its eot.  So the
flag is derived, not stored (:meth:`PackingPlan.piece_has_eot`).

Sizes.  A document of ``n`` tokens takes ``n + 1`` slots with an eot, ``n`` without.  An empty
document therefore takes one slot (a segment holding only its eot) with an eot, and is not placed
without one (counted in ``n_empty`` either way).  A document longer than a bin is, by ``long_docs``:

- ``"split"`` (default): cut into ``k = (n + e - 1) // seqlen`` full pieces of ``seqlen`` tokens,
  each filling a bin, then a remainder piece packed like any document (every token kept; when the
  document's length is a multiple of ``seqlen`` the remainder holds only the eot);
- ``"truncate"``: its first ``seqlen - e`` tokens plus the eot; the rest is lost;
- ``"drop"``: not placed.

Algorithms (:data:`ALGORITHMS`; kernels in :mod:`mmpack.kernels.packing`):

- ``"bfd"`` (default): best-fit decreasing over the whole store, O(n log_64 seqlen + seqlen),
  about 10^7-10^8 documents/s; bins come out in the order they were opened, i.e. longest
  documents first, so shuffling is the sampler's job.
- ``"stream"``: best fit in store order over at most ``lookahead`` open bins (the fullest closes
  when the window is full); bins come out in the order they were closed, so data order is kept up
  to the window.  The seed's ModernBERT packer is this idea with a batch-sized window.
- ``"nextfit"``: ``"stream"`` with one open bin.

:func:`cached_plan` keys a plan by the store fingerprint and every parameter, and keeps it in
``<store>/cache/plan-<key>.mmplan``: a JSON header (with its own CRC-32) then the raw arrays
(each with its CRC-32 in the header), written to a temporary file and renamed into place, and
memory-mapped when read back.  Loading checks every checksum, so a damaged plan is rebuilt (with
a warning) instead of silently duplicating or dropping documents.  The check reads the arrays
once (about 32 bytes per document): a 10M-document plan (322 MB) loads in 87-307 ms with the
page cache warm (``python -m benchmarks.trust_costs plan``; the range is a quiet and a loaded
2-core VM), against 0.2 ms for the header alone before; a 300k-document plan reopens in a few
milliseconds (``tests/test_plan.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import struct
import tempfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.core.validation import check_index
from mmpack.errors import FormatError, StateMismatchError
from mmpack.kernels import packing as _k

__all__ = [
    "ALGORITHMS",
    "DEFAULT_LOOKAHEAD",
    "LONG_DOCS",
    "PLAN_FORMAT_VERSION",
    "PackingPlan",
    "PackingStats",
    "build_plan",
    "cached_plan",
    "load_plan",
    "plan_cache_key",
    "save_plan",
]

ALGORITHMS = ("bfd", "nextfit", "stream")
"""Accepted ``algorithm`` names."""

LONG_DOCS = ("drop", "split", "truncate")
"""Accepted ``long_docs`` policies."""

DEFAULT_LOOKAHEAD = 1024
"""Open-bin window of ``algorithm="stream"``."""

PLAN_FORMAT_VERSION = 2
"""Version of the plan algorithms and file layout; part of every cache key (2: checksums)."""

_LONG_CODES = {"split": _k.LONG_SPLIT, "truncate": _k.LONG_TRUNCATE, "drop": _k.LONG_DROP}
_MAGIC = b"MMPKPLAN"
_ALIGN = 64
_ARRAYS = (
    ("bin_ptr", np.dtype("<i8")),
    ("piece_doc", np.dtype("<i8")),
    ("piece_start", np.dtype("<i8")),
    ("piece_len", np.dtype("<i4")),
)


# --------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class PackingStats:
    """What a plan achieved.  Tokens count the eot tokens placed; ``lower_bound_bins`` is
    ``ceil(n_tokens / seqlen)``, the fewest bins any packing of the placed tokens could use."""

    seqlen: int
    n_docs: int
    n_bins: int
    n_pieces: int
    n_tokens: int
    padding_tokens: int
    efficiency: float
    lower_bound_bins: int
    excess_bins: float
    n_empty: int
    n_long: int
    n_split: int
    n_truncated: int
    n_dropped: int
    lost_tokens: int
    frac_long: float
    frac_split: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, eq=False)
class PackingPlan:
    """Bins of document pieces, CSR-style.

    Attributes
    ----------
    bin_ptr : numpy.ndarray, int64, shape (n_bins + 1,)
        Bin ``i`` holds pieces ``bin_ptr[i]:bin_ptr[i+1]``, in placement order.
    piece_doc : numpy.ndarray, int64, shape (n_pieces,)
    piece_start : numpy.ndarray, int64, shape (n_pieces,)
        First token of the piece inside its document.
    piece_len : numpy.ndarray, int32, shape (n_pieces,)
        Tokens taken from the document (the eot, if any, is extra).
    seqlen, eot, long_docs, algorithm, lookahead
        The parameters the plan was built with (``lookahead`` is None unless ``"stream"``).
    stats : PackingStats
    """

    bin_ptr: np.ndarray
    piece_doc: np.ndarray
    piece_start: np.ndarray
    piece_len: np.ndarray
    seqlen: int
    eot: bool
    long_docs: str
    algorithm: str
    lookahead: int | None
    stats: PackingStats

    @property
    def n_bins(self) -> int:
        return self.bin_ptr.shape[0] - 1

    @property
    def n_pieces(self) -> int:
        return self.piece_doc.shape[0]

    def __len__(self) -> int:
        return self.n_bins

    def pieces(self, i: int) -> list[tuple[int, int, int]]:
        """``(doc, start, length)`` of every piece of bin ``i`` (negative counts from the end)."""
        i = check_index(i, self.n_bins, "bin")
        lo, hi = int(self.bin_ptr[i]), int(self.bin_ptr[i + 1])
        return [
            (int(self.piece_doc[p]), int(self.piece_start[p]), int(self.piece_len[p]))
            for p in range(lo, hi)
        ]

    def piece_has_eot(self) -> np.ndarray:
        """bool, shape (n_pieces,): whether an eot follows each piece (``eot and len < seqlen``)."""
        if not self.eot:
            return np.zeros(self.n_pieces, dtype=bool)
        return self.piece_len < self.seqlen

    def validate(self, doc_lens: np.ndarray) -> None:
        """Check the plan against the documents; raise :class:`FormatError` if a piece lies
        outside its document, a piece followed by an eot does not end its document (or, when
        truncating, does not start it), or a bin holds more than ``seqlen`` slots.  O(n_pieces).
        """
        doc_lens = np.asarray(doc_lens, dtype=np.int64)
        bp = self.bin_ptr
        n = self.n_pieces
        if bp.shape[0] < 1 or bp[0] != 0 or bp[-1] != n or np.any(np.diff(bp) < 0):
            raise FormatError("plan: bin_ptr must start at 0, never decrease, end at n_pieces")
        if n and (self.piece_doc.min() < 0 or self.piece_doc.max() >= doc_lens.shape[0]):
            raise FormatError(f"plan: a piece names a document outside [0, {doc_lens.shape[0]})")
        lens = doc_lens[self.piece_doc]
        ends = self.piece_start + self.piece_len
        if np.any(self.piece_start < 0) or np.any(self.piece_len < 0) or np.any(ends > lens):
            raise FormatError("plan: a piece lies outside its document")
        has_eot = self.piece_has_eot()
        if self.long_docs == "truncate":
            bad = has_eot & (self.piece_start != 0)
        else:
            bad = has_eot & (ends != lens)
        if np.any(bad):
            raise FormatError(f"plan: piece {int(np.argmax(bad))} has an eot it should not have")
        slots = self.piece_len.astype(np.int64) + has_eot
        fill = np.zeros(self.n_bins, dtype=np.int64)
        np.add.at(fill, np.repeat(np.arange(self.n_bins), np.diff(bp)), slots)
        if np.any(fill > self.seqlen):
            raise FormatError(f"plan: bin {int(np.argmax(fill > self.seqlen))} exceeds seqlen")


# --------------------------------------------------------------------------------- building
def build_plan(
    doc_lens: np.ndarray,
    seqlen: int,
    *,
    eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
) -> PackingPlan:
    """Pack documents of the given lengths into bins of ``seqlen`` slots.

    Parameters
    ----------
    doc_lens : array-like of int, shape (n_docs,)
        Token counts, all >= 0.
    seqlen : int
        Slots per bin, >= 1.
    eot : bool
        Whether an end-of-text token follows every document (it takes a slot).
    long_docs : {"split", "truncate", "drop"}
    algorithm : {"bfd", "stream", "nextfit"}
    lookahead : int
        Open bins of ``"stream"`` (>= 1); ignored otherwise.

    Returns
    -------
    PackingPlan
        A pure function of the arguments (same input, identical arrays).
    """
    seqlen, long_docs, algorithm, lookahead = _check_params(seqlen, long_docs, algorithm, lookahead)
    lens = np.ascontiguousarray(doc_lens)
    if lens.ndim != 1 or not (lens.dtype.kind in "iu" or lens.size == 0):
        raise TypeError(
            f"doc_lens must be a 1-D integer array, got dtype {lens.dtype} with shape {lens.shape}"
        )
    lens = lens.astype(np.int64, copy=False)
    if lens.size and lens.min() < 0:
        raise ValueError(
            f"doc_lens must be >= 0; document {int(np.argmin(lens))} has length {int(lens.min())}"
        )
    e = int(bool(eot))
    n = lens.shape[0]
    mode = _LONG_CODES[long_docs]
    rem_occ = np.empty(n, dtype=np.int32)
    counts = np.zeros(_k.N_STATS, dtype=np.int64)
    _k.item_sizes(lens, seqlen, e, mode, rem_occ, counts)
    n_items = int(counts[_k.ST_FULL_PIECES] + counts[_k.ST_PLACED_DOCS])
    bin_ptr = np.empty(n_items + 1, dtype=np.int64)
    piece_doc = np.empty(n_items, dtype=np.int64)
    piece_start = np.empty(n_items, dtype=np.int64)
    piece_len = np.empty(n_items, dtype=np.int32)
    if algorithm == "bfd":
        n_bins = _k.bfd(lens, rem_occ, seqlen, e, mode, bin_ptr, piece_doc, piece_start, piece_len)
    else:
        window = 1 if algorithm == "nextfit" else lookahead
        n_bins = _k.stream(
            lens, rem_occ, seqlen, e, mode, window, bin_ptr, piece_doc, piece_start, piece_len
        )
    bin_ptr = bin_ptr[: n_bins + 1].copy() if n_bins + 1 < bin_ptr.shape[0] else bin_ptr
    arrays: tuple[np.ndarray, ...] = (bin_ptr, piece_doc, piece_start, piece_len)
    for a in arrays:
        a.flags.writeable = False
    stats = _make_stats(counts, n, n_bins, n_items, seqlen)
    return PackingPlan(
        bin_ptr,
        piece_doc,
        piece_start,
        piece_len,
        seqlen=seqlen,
        eot=bool(eot),
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead if algorithm == "stream" else None,
        stats=stats,
    )


def _make_stats(counts: np.ndarray, n_docs: int, n_bins: int, n_pieces: int, seqlen: int):
    tokens = int(counts[_k.ST_TOKENS])
    lower = -(-tokens // seqlen)
    n_long = int(counts[_k.ST_LONG])
    n_split = int(counts[_k.ST_SPLIT])
    return PackingStats(
        seqlen=seqlen,
        n_docs=n_docs,
        n_bins=n_bins,
        n_pieces=n_pieces,
        n_tokens=tokens,
        padding_tokens=n_bins * seqlen - tokens,
        efficiency=tokens / (n_bins * seqlen) if n_bins else 1.0,
        lower_bound_bins=lower,
        excess_bins=n_bins / lower - 1.0 if lower else 0.0,
        n_empty=int(counts[_k.ST_EMPTY]),
        n_long=n_long,
        n_split=n_split,
        n_truncated=int(counts[_k.ST_TRUNCATED]),
        n_dropped=int(counts[_k.ST_DROPPED]),
        lost_tokens=int(counts[_k.ST_LOST_TOKENS]),
        frac_long=n_long / n_docs if n_docs else 0.0,
        frac_split=n_split / n_docs if n_docs else 0.0,
    )


def _check_params(seqlen: Any, long_docs: Any, algorithm: Any, lookahead: Any):
    if isinstance(seqlen, (bool, np.bool_)) or not isinstance(seqlen, (int, np.integer)):
        raise TypeError(f"seqlen must be an integer, got {type(seqlen).__name__} {seqlen!r}")
    if not 1 <= int(seqlen) < 2**31:
        raise ValueError(f"seqlen must be in [1, 2**31), got {seqlen}")
    if long_docs not in LONG_DOCS:
        raise ValueError(f"long_docs must be one of {LONG_DOCS}, got {long_docs!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if isinstance(lookahead, (bool, np.bool_)) or not isinstance(lookahead, (int, np.integer)):
        raise TypeError(f"lookahead must be an integer, got {type(lookahead).__name__}")
    if lookahead < 1:
        raise ValueError(f"lookahead must be >= 1 (open bins of 'stream'), got {lookahead}")
    return int(seqlen), long_docs, algorithm, int(lookahead)


# --------------------------------------------------------------------------------- files
def plan_cache_key(
    fingerprint: str,
    seqlen: int,
    *,
    eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
) -> dict[str, Any]:
    """Everything a cached plan depends on (``lookahead`` only for ``"stream"``)."""
    seqlen, long_docs, algorithm, lookahead = _check_params(seqlen, long_docs, algorithm, lookahead)
    return {
        "format": PLAN_FORMAT_VERSION,
        "fingerprint": str(fingerprint),
        "seqlen": seqlen,
        "eot": bool(eot),
        "long_docs": long_docs,
        "algorithm": algorithm,
        "lookahead": lookahead if algorithm == "stream" else None,
    }


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def save_plan(plan: PackingPlan, path: str | os.PathLike[str], key: dict[str, Any]) -> None:
    """Write ``plan`` to ``path`` atomically (temporary file in the same folder, fsync, rename).

    Layout: ``MMPKPLAN``, a little-endian uint64 header length, a JSON header (``key``, the plan
    parameters, the statistics, each array's dtype/shape/offset/CRC-32), the little-endian
    uint32 CRC-32 of the header, then the raw arrays, each aligned to 64 bytes.
    """
    path = Path(path)
    arrays = {name: np.ascontiguousarray(getattr(plan, name), dtype=dt) for name, dt in _ARRAYS}
    header: dict[str, Any] = {
        "format": PLAN_FORMAT_VERSION,
        "key": key,
        "plan": {
            "seqlen": plan.seqlen,
            "eot": plan.eot,
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
            "crc32": zlib.crc32(arr.data),
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
    """Memory-map a plan written by :func:`save_plan` (cost: reading the header).

    Raises
    ------
    FormatError
        Not a plan file, an unknown format version, or arrays inconsistent with the file.
    StateMismatchError
        ``key`` is given and differs from the one recorded (other data or other parameters).
    """
    path = Path(path)
    size = path.stat().st_size
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
            version = header["format"]
            stored_key = header["key"]
            params = header["plan"]
            stats = PackingStats(**header["stats"])
            layout = header["arrays"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"{path}: unreadable plan header ({exc})") from None
    if version != PLAN_FORMAT_VERSION:
        raise FormatError(
            f"{path}: plan format {version!r}, this mmpack reads {PLAN_FORMAT_VERSION}"
        )
    if key is not None and stored_key != key:
        raise StateMismatchError(
            f"{path} was built for {stored_key}, not for {key}: other data or other parameters"
        )
    arrays = {}
    for name, dt in _ARRAYS:
        try:
            spec = layout[name]
            dtype = np.dtype(spec["dtype"])
            (length,) = spec["shape"]
            offset = int(spec["offset"])
            crc = int(spec["crc32"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{path}: bad layout of {name!r} ({exc})") from None
        if dtype != dt or length < 0 or offset < 20 + hlen or offset + length * dt.itemsize > size:
            raise FormatError(f"{path}: array {name!r} does not fit the file")
        if length == 0:
            arr = np.empty(0, dtype=dt)
        else:
            arr = np.memmap(path, dtype=dt, mode="r", offset=offset, shape=(length,))
            arr = arr.view(np.ndarray)
        if zlib.crc32(arr.data) != crc:
            raise FormatError(
                f"{path}: plan array {name!r} fails its checksum (damaged file; it would place "
                "documents wrongly)"
            )
        arrays[name] = arr
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
    return PackingPlan(
        **arrays,
        seqlen=int(params["seqlen"]),
        eot=bool(params["eot"]),
        long_docs=str(params["long_docs"]),
        algorithm=str(params["algorithm"]),
        lookahead=params["lookahead"],
        stats=stats,
    )


def cached_plan(
    store: Any,
    seqlen: int,
    *,
    eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
    cache: bool = True,
) -> PackingPlan:
    """:func:`build_plan` over ``store.doc_lens``, kept in ``<store>/cache/plan-<key>.mmplan``.

    A cached file is used only if its recorded key (store fingerprint, every parameter, format
    version) equals this one; a mismatching or damaged file is rebuilt and replaced, with a
    warning.  If the store folder is not writable the plan is computed in memory, silently.
    ``cache=False`` neither reads nor writes the cache.
    """
    key = plan_cache_key(
        store.fingerprint,
        seqlen,
        eot=eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
    )
    path = Path(store.cache_dir) / f"plan-{_key_digest(key)}.mmplan"
    if cache and path.is_file():
        try:
            return load_plan(path, key)
        except (FormatError, StateMismatchError) as exc:
            warnings.warn(f"rebuilding the packing plan: {exc}", stacklevel=2)
        except OSError:
            pass
    plan = build_plan(
        store.doc_lens,
        seqlen,
        eot=eot,
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
