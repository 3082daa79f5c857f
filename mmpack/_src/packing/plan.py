"""The packing plan: whole documents placed once, over the whole store or region by region, into
``seqlen``-token bins.

A plan is an index, not a copy of the tokens: CSR arrays ``bin_ptr`` (n_bins + 1) and, per piece,
its document, its token offset inside the document and its length, stored in 8 bytes a piece
(:mod:`mmpack._src.packing.plan_pieces`).  Its regions are CSR too: region ``r`` is documents
``region_doc[r]:region_doc[r+1]`` packed into bins ``region_bin[r]:region_bin[r+1]``.  With an
end-of-text token a piece carries it iff it is shorter than ``seqlen`` (only the full pieces of a
split document fill a bin), so the flag is derived, not stored (:meth:`PackingPlan.piece_has_eot`).
What a document becomes (its slots, and by ``long_docs`` split, truncated or dropped) is the rule
of :mod:`mmpack._src.kernels.plan_items`.

Algorithms (:data:`ALGORITHMS`; drivers in :mod:`mmpack._src.kernels.packing`): ``"bfd"`` (default),
best-fit decreasing, O(n log_64 seqlen + seqlen), bins in the order they were opened (longest
documents first); ``"online"``, best fit in store order over at most ``lookahead`` open bins, bins
in the order they were closed (data order kept up to the window); ``"nextfit"``, ``"online"``
with one open bin.  Regions: ``region_tokens=R`` cuts the documents, in order, at document
boundaries into regions of about ``R`` tokens (:mod:`mmpack._src.packing.region_cuts`) and packs each
on its own, bins numbered region by region, one region's lengths held at a time (None: one region,
the whole store); the time and bins against the whole-store plan: ``python -m benchmarks regions``.

The parameters are one :class:`~mmpack.packing.PlanSpec`; the plan's file and its cache
live in :mod:`mmpack._src.packing.plan_file` and :mod:`mmpack._src.packing.plan_regions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from mmpack._src.core.options import DEFAULT_LOOKAHEAD, LongDocs, PackingAlgorithm
from mmpack._src.core.validation import check_index
from mmpack._src.kernels import packing as _k
from mmpack._src.kernels import plan_items as _items
from mmpack._src.packing.options import PlanSpec
from mmpack._src.packing.plan_pieces import (
    check_region_size,
    decode_pieces,
    encode_region,
)
from mmpack._src.packing.plan_stats import COUNTED, PackingStats, stats_of
from mmpack._src.packing.region_cuts import region_edges, whole_store_edges
from mmpack.errors import FormatError

if TYPE_CHECKING:
    from mmpack._src.packing.plan_pages import PlanPages

__all__ = [
    "ALGORITHMS",
    "DEFAULT_LOOKAHEAD",
    "LONG_DOCS",
    "PackingPlan",
    "build_plan",
    "pack_regions",
    "plan_of_offsets",
]

ALGORITHMS = tuple(sorted(m.value for m in PackingAlgorithm))
"""Accepted ``algorithm`` names."""

LONG_DOCS = tuple(sorted(m.value for m in LongDocs))
"""Accepted ``long_docs`` policies."""

_LONG_CODES: dict[str, int] = {
    LongDocs.SPLIT: _items.LONG_SPLIT,
    LongDocs.TRUNCATE: _items.LONG_TRUNCATE,
    LongDocs.DROP: _items.LONG_DROP,
}


# --------------------------------------------------------------------------------- types
@dataclass(frozen=True, eq=False)
class PackingPlan:
    """Bins of document pieces, CSR-style.

    Attributes
    ----------
    bin_ptr : numpy.ndarray, int64, shape (n_bins + 1,)
        Bin ``i`` holds pieces ``bin_ptr[i]:bin_ptr[i+1]``, in placement order.
    piece_ref : numpy.ndarray, uint32, shape (n_pieces,)
        Each piece's document relative to its region, or its split entry
        (:mod:`mmpack._src.packing.plan_pieces`); :attr:`piece_doc` and :attr:`piece_start` decode them.
    piece_len : numpy.ndarray, int32, shape (n_pieces,)
        Tokens taken from the document (the eot, if any, is extra).
    split : numpy.ndarray, int64, shape (2 * n_split,)
        ``(document - region_doc[r], start)`` of each piece that starts inside its document.
    region_bin : numpy.ndarray, int64, shape (n_regions + 1,)
        Region ``r``'s bins are ``region_bin[r]:region_bin[r+1]``.
    region_doc : numpy.ndarray, int64, shape (n_regions + 1,)
        Region ``r``'s documents are ``region_doc[r]:region_doc[r+1]`` (strictly increasing):
        every piece of its bins comes from them.
    region_split : numpy.ndarray, int64, shape (n_regions + 1,)
        Region ``r``'s split entries are ``region_split[r]:region_split[r+1]``.
    seqlen, add_eot, long_docs, algorithm, lookahead, region_tokens
        The parameters the plan was built with, by their canonical names (``lookahead`` is None
        unless ``"online"``; ``region_tokens`` None for one region over the whole store).
    stats : PackingStats
    pages : PlanPages or None
        A plan read back from its file (:func:`~mmpack.packing.load_plan`) lazily
        checks its chunks on first use (:class:`~mmpack._src.packing.plan_pages.PlanPages`): a consumer
        calls :meth:`check_bins` for the bins it reads, or :meth:`check_all` before reading the
        arrays whole.  None: every array is trusted (a plan built in memory).
    most_pieces : int or None
        The most pieces in a bin, as the file records it; None: derived on demand
        (:meth:`max_bin_pieces`).
    """

    bin_ptr: np.ndarray
    piece_ref: np.ndarray
    piece_len: np.ndarray
    split: np.ndarray
    region_bin: np.ndarray
    region_doc: np.ndarray
    region_split: np.ndarray
    seqlen: int
    add_eot: bool
    long_docs: str
    algorithm: str
    lookahead: int | None
    region_tokens: int | None
    stats: PackingStats
    pages: PlanPages | None = None
    most_pieces: int | None = None

    def check_bins(self, idx: np.ndarray) -> None:
        """Check (once) the chunks the bins ``idx`` (int64, shape (k,), in ``[0, n_bins)``) read;
        O(k) once they are checked, nothing for a plan without :attr:`pages`."""
        if self.pages is not None:
            self.pages.check_bins(idx)

    def check_all(self) -> None:
        """Check every chunk not checked yet (a read of the whole arrays)."""
        if self.pages is not None:
            self.pages.check_all()

    def max_bin_pieces(self) -> int:
        """The most pieces in a bin (0 for no bins): recorded by the file, else one pass over
        ``bin_ptr``."""
        if self.most_pieces is not None:
            return self.most_pieces
        self.check_all()
        return int(np.diff(self.bin_ptr).max(initial=0)) if self.n_bins else 0

    @property
    def n_bins(self) -> int:
        return self.bin_ptr.shape[0] - 1

    @property
    def n_pieces(self) -> int:
        return self.piece_ref.shape[0]

    @cached_property
    def regions(self) -> np.ndarray:
        """``region_bin``, ``region_doc`` and ``region_split`` stacked (int64, read-only,
        (3, n_regions + 1)): the row kernels' region table."""
        table = np.stack([self.region_bin, self.region_doc, self.region_split]).astype(np.int64)
        table.flags.writeable = False
        return table

    @cached_property
    def _decoded(self) -> tuple[np.ndarray, np.ndarray]:
        self.check_all()
        docs, starts = decode_pieces(self.bin_ptr, self.piece_ref, self.split, *self.regions)
        docs.flags.writeable = starts.flags.writeable = False
        return docs, starts

    @property
    def piece_doc(self) -> np.ndarray:
        """int64, shape (n_pieces,): each piece's document (decoded once, O(n_pieces))."""
        return self._decoded[0]

    @property
    def piece_start(self) -> np.ndarray:
        """int64, shape (n_pieces,): each piece's first token inside its document (decoded
        once, O(n_pieces))."""
        return self._decoded[1]

    @property
    def n_regions(self) -> int:
        return self.region_bin.shape[0] - 1

    def __len__(self) -> int:
        return self.n_bins

    def pieces(self, i: int) -> list[tuple[int, int, int]]:
        """``(doc, start, length)`` of every piece of bin ``i`` (negative counts from the end):
        the bin decoded as a plan of one region, its own."""
        i = check_index(i, self.n_bins, "bin")
        self.check_bins(np.array([i], dtype=np.int64))
        lo, hi = int(self.bin_ptr[i]), int(self.bin_ptr[i + 1])
        r = int(np.searchsorted(self.region_bin, i, side="right")) - 1
        one = np.array([0, hi - lo]), self.piece_ref[lo:hi], self.split, np.array([0, 1])
        docs, starts = decode_pieces(*one, *self.regions[1:, r : r + 2])
        return list(zip(docs.tolist(), starts.tolist(), self.piece_len[lo:hi].tolist()))

    def piece_has_eot(self) -> np.ndarray:
        """bool, shape (n_pieces,): whether an eot follows each piece (``add_eot and len <
        seqlen``)."""
        if not self.add_eot:
            return np.zeros(self.n_pieces, dtype=bool)
        self.check_all()
        return self.piece_len < self.seqlen

    def check_shapes(self) -> None:
        """Raise :class:`FormatError` unless ``bin_ptr`` and the piece arrays are 1-D and the
        piece arrays of one length, ``split`` 1-D of even length and the region arrays 1-D of
        one length: the row kernels check each bin's range in ``bin_ptr`` against
        ``piece_ref`` only, then index ``piece_len``.  O(1)."""
        p = (self.piece_ref, self.piece_len)
        if any(a.ndim != 1 for a in (*p, self.bin_ptr)) or len({a.shape[0] for a in p}) != 1:
            shapes = ", ".join(str(a.shape) for a in p)
            raise FormatError(f"plan: piece arrays must be 1-D of one length, got shapes {shapes}")
        r = (self.region_bin, self.region_doc, self.region_split)
        if any(a.ndim != 1 for a in r) or len({a.shape[0] for a in r}) != 1 or r[0].shape[0] < 1:
            raise FormatError("plan: region arrays must be 1-D of one length")
        if self.split.ndim != 1 or self.split.shape[0] % 2:
            raise FormatError(f"plan: split must be 1-D of even length, got {self.split.shape}")

    def validate(self, doc_lens: np.ndarray) -> None:
        """Check the plan against the documents; raise :class:`FormatError` if a piece lies
        outside its document, a piece followed by an eot does not end its document (or, when
        truncating, does not start it), a bin holds more than ``seqlen`` slots, or the regions
        do not cut the bins and the documents in order with every piece inside its region's
        documents.  O(n_pieces).
        """
        doc_lens = np.asarray(doc_lens, dtype=np.int64)
        self.check_shapes()
        self.check_all()
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
        self._validate_regions(doc_lens.shape[0])

    def _validate_regions(self, n_docs: int) -> None:
        rb, rd, rs = self.region_bin, self.region_doc, self.region_split
        if rs[0] != 0 or np.any(np.diff(rs) < 0) or 2 * rs[-1] != self.split.shape[0]:
            raise FormatError("plan: region_split must cut the split entries in order")
        if rb.ndim != 1 or rd.shape != rb.shape or rb[0] != 0 or rb[-1] != self.n_bins:
            raise FormatError("plan: region_bin must start at 0 and end at n_bins")
        if np.any(np.diff(rb) < 0) or rd[0] != 0 or rd[-1] != n_docs or np.any(np.diff(rd) <= 0):
            raise FormatError("plan: regions must cut the bins and the documents in order")
        bin_region = np.repeat(np.arange(self.n_regions), np.diff(rb))
        piece_region = np.repeat(bin_region, np.diff(self.bin_ptr))
        lo, hi = rd[piece_region], rd[piece_region + 1]
        outside = (self.piece_doc < lo) | (self.piece_doc >= hi)
        if np.any(outside):
            raise FormatError(f"plan: piece {int(np.argmax(outside))} lies outside its region")


# --------------------------------------------------------------------------------- building
def build_plan(
    doc_lens: np.ndarray,
    seqlen: int,
    *,
    add_eot: bool,
    long_docs: str = "split",
    algorithm: str = "bfd",
    lookahead: int = DEFAULT_LOOKAHEAD,
    region_tokens: int | str | None = None,
) -> PackingPlan:
    """Pack documents of the given lengths into bins of ``seqlen`` slots.

    ``doc_lens`` (array-like of int, shape (n_docs,)) are token counts, all >= 0; the other
    arguments are those of :class:`~mmpack.packing.PlanSpec`, checked by it (``add_eot``:
    whether an end-of-text token, which takes a slot, follows every document; ``lookahead``
    is ignored unless ``"online"``; ``region_tokens``: see the module docstring).

    Returns
    -------
    PackingPlan
        A pure function of the arguments (same input, identical arrays).
    """
    offsets = _offsets_of(doc_lens)
    spec = PlanSpec(
        seqlen,
        add_eot=add_eot,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
        region_tokens=region_tokens,
    )
    return plan_of_offsets(offsets, spec)


def plan_of_offsets(offsets: np.ndarray, spec: PlanSpec) -> PackingPlan:
    """The plan of ``spec`` (:func:`build_plan`) of the documents of a store's ``offsets``
    (int64, shape (n_docs + 1,), ``offsets[0] == 0``, non-decreasing; e.g. memory-mapped).
    Region by region, the lengths of one region at a time: besides the plan it returns, the
    memory held is one region's lengths and packing state (the whole store's with
    ``region_tokens=None``)."""
    n_docs = int(offsets.shape[0]) - 1
    if spec.region_tokens is None:
        edges = whole_store_edges(n_docs)
    else:
        edges = region_edges(offsets, spec.region_tokens, spec.seqlen, int(spec.add_eot))
    return _pack(offsets, 0, edges, spec)


def pack_regions(doc_lens: np.ndarray, edges: np.ndarray, spec: PlanSpec) -> PackingPlan:
    """The plan of some consecutive regions of a store, given their edges: the part of a plan
    that :func:`build_plan` would give for them (:mod:`mmpack._src.packing.plan_regions` joins such
    parts into one plan).

    ``doc_lens`` (int, shape (edges[-1] - edges[0],)) are the lengths of documents
    ``edges[0]:edges[-1]``; ``edges`` (int, shape (m + 1,), strictly increasing) the regions'
    first documents and the end, in the store's numbering, which ``piece_doc`` and
    ``region_doc`` keep (a part's ``region_doc`` starts at ``edges[0]``).
    ``spec.region_tokens`` is only recorded.
    """
    offsets = _offsets_of(doc_lens)
    n_docs = offsets.shape[0] - 1
    edges = np.ascontiguousarray(edges, dtype=np.int64)
    if (
        edges.ndim != 1
        or edges.shape[0] < 1
        or edges[-1] - edges[0] != n_docs
        or np.any(np.diff(edges) <= 0)
        or edges[0] < 0
    ):
        raise ValueError(
            f"edges must be strictly increasing document indices >= 0 spanning the "
            f"{n_docs} lengths given, got {edges!r}"
        )
    return _pack(offsets, int(edges[0]), edges, spec)


def _region_lens(offsets: np.ndarray, a: int, b: int) -> np.ndarray:
    """Lengths of documents ``[a, b)`` of ``offsets`` (read-only int64: one kernel signature)."""
    lens = np.diff(np.asarray(offsets[a : b + 1], dtype=np.int64))
    lens.flags.writeable = False
    return lens


def _pack(offsets: np.ndarray, base: int, edges: np.ndarray, spec: PlanSpec) -> PackingPlan:
    """Pack the regions ``edges`` (store numbering) of the documents of ``offsets`` (entry ``j``
    is document ``base + j``'s start) as ``spec`` says, two passes over the regions: the
    first counts each region's items (``item_sizes``, each region its own universe of sizes) to
    size the plan arrays, the second recomputes them and writes each region's placement into
    its slice of the plan, its bins and documents shifted to the plan's numbering.  One
    region's lengths and sizes are held at a time."""
    seqlen, algorithm = spec.seqlen, spec.algorithm
    e, mode = int(spec.add_eot), _LONG_CODES[spec.long_docs]
    n_reg = edges.shape[0] - 1
    local = edges - base
    widest = int(np.diff(local).max(initial=0))
    rem_occ = np.empty(widest, dtype=np.int32)
    counts = np.zeros((max(n_reg, 1), _items.N_STATS), dtype=np.int64)  # row 0 of no region: zeros
    for r in range(n_reg):
        a, b = int(local[r]), int(local[r + 1])
        _items.item_sizes(_region_lens(offsets, a, b), seqlen, e, mode, rem_occ[: b - a], counts[r])
    items = counts[:, _items.ST_FULL_PIECES] + counts[:, _items.ST_PLACED_DOCS]
    for r in range(n_reg):
        check_region_size(int(local[r + 1] - local[r]), int(items[r]), r)
    n_items = int(items.sum())
    bin_ptr = np.zeros(n_items + 1, dtype=np.int64)
    piece_ref = np.empty(n_items, dtype=np.uint32)
    piece_len = np.empty(n_items, dtype=np.int32)
    most = int(items.max(initial=0))  # one region's documents and starts at a time
    docs, starts = np.empty(most, dtype=np.int64), np.empty(most, dtype=np.int64)
    splits: list[np.ndarray] = []
    region_bin = np.zeros(n_reg + 1, dtype=np.int64)
    region_split = np.zeros(n_reg + 1, dtype=np.int64)
    online, nextfit = PackingAlgorithm.ONLINE, PackingAlgorithm.NEXTFIT
    window = spec.lookahead if algorithm == online else int(algorithm == nextfit)  # bfd: 0
    scratch = np.zeros(_items.N_STATS, dtype=np.int64)
    nb = p = 0
    for r in range(n_reg):
        a, b, m = int(local[r]), int(local[r + 1]), int(items[r])
        lens, occ = _region_lens(offsets, a, b), rem_occ[: b - a]
        if n_reg > 1:  # the first pass's sizes are those of the last region only
            _items.item_sizes(lens, seqlen, e, mode, occ, scratch)
        out = (bin_ptr[nb : nb + m + 1], docs[:m], starts[:m], piece_len[p : p + m])
        univ = int(counts[r, _items.ST_UNIVERSE])
        k = _k.place(lens, occ, seqlen, e, mode, window, out, univ)
        bin_ptr[nb : nb + k + 1] += p
        splits.append(encode_region(docs[:m], starts[:m], piece_ref[p : p + m]))
        nb, p = nb + k, p + m
        region_bin[r + 1] = nb
        region_split[r + 1] = region_split[r] + splits[-1].shape[0] // 2
    bin_ptr = bin_ptr[: nb + 1].copy() if nb + 1 < bin_ptr.shape[0] else bin_ptr
    split = np.concatenate(splits) if splits else np.zeros(0, dtype=np.int64)
    arrays = (bin_ptr, piece_ref, piece_len, split, region_bin, edges.copy(), region_split)
    for arr in arrays:
        arr.flags.writeable = False
    sums = {name: int(counts[:, slot].sum()) for name, slot in COUNTED.items()}
    sums |= {"n_docs": int(local[-1] - local[0]), "n_bins": nb, "n_pieces": n_items}
    sums["n_regions"] = n_reg
    return PackingPlan(*arrays, **spec.params(), stats=stats_of(sums, seqlen))


def _offsets_of(doc_lens: Any) -> np.ndarray:
    """The offsets (int64, shape (n_docs + 1,)) of documents of lengths ``doc_lens``, checked
    (1-D, integers, all >= 0)."""
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
    offsets = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets
