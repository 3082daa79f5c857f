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
- ``"online"``: best fit in store order over at most ``lookahead`` open bins (the fullest closes
  when the window is full); bins come out in the order they were closed, so data order is kept up
  to the window.  ModernBERT's packer is this idea with a batch-sized window.
- ``"nextfit"``: ``"online"`` with one open bin.

Option names are the :class:`~mmpack.core.options.LongDocs` and
:class:`~mmpack.core.options.PackingAlgorithm` values, checked by
:func:`~mmpack.core.options.parse_option`; a plan records the canonical names.

The plan's file format and the cache of plans in a store's cache folder
(:func:`~mmpack.views.plan_file.cached_plan`) live in :mod:`mmpack.views.plan_file`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack.core.options import DEFAULT_LOOKAHEAD, LongDocs, PackingAlgorithm, parse_option
from mmpack.core.validation import check_index
from mmpack.errors import FormatError
from mmpack.kernels import packing as _k

__all__ = [
    "ALGORITHMS",
    "DEFAULT_LOOKAHEAD",
    "LONG_DOCS",
    "PackingPlan",
    "PackingStats",
    "build_plan",
    "check_add_eot",
    "check_params",
]

ALGORITHMS = tuple(sorted(m.value for m in PackingAlgorithm))
"""Accepted ``algorithm`` names."""

LONG_DOCS = tuple(sorted(m.value for m in LongDocs))
"""Accepted ``long_docs`` policies."""

_LONG_CODES: dict[str, int] = {
    LongDocs.SPLIT: _k.LONG_SPLIT,
    LongDocs.TRUNCATE: _k.LONG_TRUNCATE,
    LongDocs.DROP: _k.LONG_DROP,
}


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
    seqlen, add_eot, long_docs, algorithm, lookahead
        The parameters the plan was built with, by their canonical names (``lookahead`` is None
        unless ``"online"``).
    stats : PackingStats
    """

    bin_ptr: np.ndarray
    piece_doc: np.ndarray
    piece_start: np.ndarray
    piece_len: np.ndarray
    seqlen: int
    add_eot: bool
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
        """bool, shape (n_pieces,): whether an eot follows each piece (``add_eot and len <
        seqlen``)."""
        if not self.add_eot:
            return np.zeros(self.n_pieces, dtype=bool)
        return self.piece_len < self.seqlen

    def check_shapes(self) -> None:
        """Raise :class:`FormatError` unless ``bin_ptr`` and the piece arrays are 1-D and the
        piece arrays of one length: the row kernels check each bin's range in ``bin_ptr``
        against ``piece_doc`` only, then index all three.  O(1)."""
        p = (self.piece_doc, self.piece_start, self.piece_len)
        if any(a.ndim != 1 for a in (*p, self.bin_ptr)) or len({a.shape[0] for a in p}) != 1:
            shapes = ", ".join(str(a.shape) for a in p)
            raise FormatError(f"plan: piece arrays must be 1-D of one length, got shapes {shapes}")

    def validate(self, doc_lens: np.ndarray) -> None:
        """Check the plan against the documents; raise :class:`FormatError` if a piece lies
        outside its document, a piece followed by an eot does not end its document (or, when
        truncating, does not start it), or a bin holds more than ``seqlen`` slots.  O(n_pieces).
        """
        doc_lens = np.asarray(doc_lens, dtype=np.int64)
        self.check_shapes()
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
    add_eot: bool,
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
    add_eot : bool
        Whether an end-of-text token follows every document (it takes a slot; which token is
        the caller's business).  Required.
    long_docs : {"split", "truncate", "drop"}
    algorithm : {"bfd", "online", "nextfit"}
    lookahead : int
        Open bins of ``"online"`` (>= 1); ignored otherwise.

    Returns
    -------
    PackingPlan
        A pure function of the arguments (same input, identical arrays).
    """
    add_eot = check_add_eot(add_eot)
    seqlen, long_docs, algorithm, lookahead = check_params(seqlen, long_docs, algorithm, lookahead)
    lens = _check_doc_lens(doc_lens)
    e = int(add_eot)
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
    out = (bin_ptr, piece_doc, piece_start, piece_len)
    univ = int(counts[_k.ST_UNIVERSE])
    if algorithm == PackingAlgorithm.BFD:
        n_bins = _k.bfd(lens, rem_occ, seqlen, e, mode, *out, univ=univ)
    else:
        window = 1 if algorithm == PackingAlgorithm.NEXTFIT else lookahead
        n_bins = _k.stream(lens, rem_occ, seqlen, e, mode, window, *out, univ=univ)
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
        add_eot=add_eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead if algorithm == PackingAlgorithm.ONLINE else None,
        stats=stats,
    )


def _check_doc_lens(doc_lens: Any) -> np.ndarray:
    """``doc_lens`` as a read-only int64 array, checked (1-D, integers, all >= 0)."""
    lens = np.ascontiguousarray(doc_lens)
    if lens.ndim != 1 or not (lens.dtype.kind in "iu" or lens.size == 0):
        raise TypeError(
            f"doc_lens must be a 1-D integer array, got dtype {lens.dtype} with shape {lens.shape}"
        )
    # One kernel signature whatever the caller passes (a store's read-only int64 offsets
    # diff, a writable list or array): each plan kernel compiles once per process.
    lens = lens.astype(np.int64, copy=False).view()
    lens.flags.writeable = False
    if lens.size and lens.min() < 0:
        raise ValueError(
            f"doc_lens must be >= 0; document {int(np.argmin(lens))} has length {int(lens.min())}"
        )
    return lens


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


def check_add_eot(add_eot: Any) -> bool:
    """``add_eot`` checked: a bool (a slot for an end-of-text token follows every document)."""
    if not isinstance(add_eot, (bool, np.bool_)):
        raise TypeError(
            f"add_eot must be a bool (whether an eot slot follows every document), got "
            f"{type(add_eot).__name__} {add_eot!r}"
        )
    return bool(add_eot)


def check_params(
    seqlen: Any, long_docs: Any, algorithm: Any, lookahead: Any
) -> tuple[int, str, str, int]:
    """The plan parameters checked, options as their canonical names (plain strings)."""
    if isinstance(seqlen, (bool, np.bool_)) or not isinstance(seqlen, (int, np.integer)):
        raise TypeError(f"seqlen must be an integer, got {type(seqlen).__name__} {seqlen!r}")
    if not 1 <= int(seqlen) < 2**31:
        raise ValueError(f"seqlen must be in [1, 2**31), got {seqlen}")
    long_docs = parse_option(LongDocs, long_docs, "long_docs").value
    algorithm = parse_option(PackingAlgorithm, algorithm, "algorithm").value
    if isinstance(lookahead, (bool, np.bool_)) or not isinstance(lookahead, (int, np.integer)):
        raise TypeError(f"lookahead must be an integer, got {type(lookahead).__name__}")
    if lookahead < 1:
        raise ValueError(f"lookahead must be >= 1 (open bins of 'online'), got {lookahead}")
    return int(seqlen), long_docs, algorithm, int(lookahead)
