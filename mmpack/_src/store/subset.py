"""Subsets of a store without rewriting: ``store.select(doc_ids)``, ``store.where(...)``,
``store.split(...)``.

A subset is a plain :class:`~mmpack.TokenStore` (the reader makes it; this module does not
import the reader) over a :class:`SubsetBackend`: the parent store, the parent id of each
document (``parent_doc_ids``, int64, sorted, unique) and the subset's own offsets; no token is
copied, and every view, plan, sampler and mixture takes it as a store.  A read maps each range
to the parent's tokens with one kernel call (:func:`~mmpack._src.kernels.subset.parent_starts`);
ranges inside one document go to the parent's ``read_ranges`` as they are (zero copy for a
memmap parent), others are cut at document boundaries and read in one parent call.  The packed
view reads the parent directly at ``parent_doc_starts`` (:func:`token_source`).  A subset of a
subset is a subset of the first parent; the loss mask and fields are the parent's restricted to
it.  Its fingerprint hashes the parent's and the id array (computed on first use).

``split(fractions, seed)``: document ``d`` goes to the part whose cumulative fraction interval
holds ``h(d) / 2**64``, ``h`` a keyed 64-bit hash (two keyed rounds of SplitMix64's finaliser,
:func:`~mmpack._src.kernels.subset.split_parts`) keyed by ``(SPLIT_STREAM + depth, seed)``, ``depth``
(``split_depth``) counting the splits that made the subset, so a part split
again is cut by independent keys (the same keys would leave a 95/5 split of a 90% part an empty
5%).  A document's part depends only on its parent id, the seed, the depth and the fractions:
appending documents keeps every earlier one in its part.

Cost: building a subset is O(documents selected) (a gather and a cumulative sum); a split is one
kernel pass over the ids, then one subset per part (``python -m benchmarks.bench_subset``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import numpy as np

from mmpack._src.core.constants import SPLIT_STREAM
from mmpack._src.core.permutation_keys import epoch_keys, seed_words
from mmpack._src.kernels.subset import parent_starts, split_parts
from mmpack._src.store.backends import Backend

__all__ = [
    "ParentChecks",
    "SubsetBackend",
    "check_doc_ids",
    "split_keys",
    "split_positions",
    "token_source",
    "where_positions",
]


class _SubsetMeta:
    """What :class:`TokenStore` reads of a subset's metadata; the fingerprint is computed on
    first use (a hash of the id array)."""

    backend = "subset"
    fields = ()

    def __init__(self, parent: Any, ids: np.ndarray, num_tokens: int) -> None:
        self.dtype = parent.dtype
        self.num_docs = int(ids.shape[0])
        self.num_tokens = num_tokens
        self.loss_mask = getattr(parent._meta, "loss_mask", None)  # has_loss_mask reads it
        self.files = parent.attached_files  # read through the parent (SubsetBackend.read_file)
        self._parent_fp = parent.fingerprint
        self._ids = ids
        self._fp: str | None = None

    @property
    def fingerprint(self) -> str:
        if self._fp is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"mmpack-subset:{self._parent_fp}:".encode())
            h.update(np.ascontiguousarray(self._ids, dtype="<i8").data)
            self._fp = h.hexdigest()[:16]
        return self._fp


class ParentChecks:
    """The read checker of a subset: the parent checks the stripes its reads touch."""

    def verify_span(self, start: int, stop: int) -> None:
        return None

    def verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        return None

    def all_checked(self) -> bool:
        return True


class SubsetBackend(Backend):
    """Reads subset token ranges from the parent (see the module docstring): the backend of a
    :class:`~mmpack.TokenStore` over documents ``ids`` (int64, shape (k,), sorted, unique) of
    ``parent`` (a ``TokenStore`` that is not itself a subset), made by ``split_depth`` splits."""

    name = "subset"

    def __init__(self, parent: Any, ids: np.ndarray, split_depth: int = 0) -> None:
        ids.flags.writeable = False
        offsets = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(parent.doc_lens[ids], out=offsets[1:])
        offsets.flags.writeable = False
        super().__init__(parent.path, _SubsetMeta(parent, ids, int(offsets[-1])))  # type: ignore[arg-type]
        self.parent = parent
        self.parent_doc_ids = ids
        self.split_depth = split_depth
        self._offsets = offsets
        # shape (docs,): where each document starts in the parent's tokens (read-only)
        starts = parent.offsets[ids]
        starts.flags.writeable = False
        self.parent_doc_starts: np.ndarray = starts
        # the subset's metadata record: the parent's optional sections (its ``extra``)
        self.record = {"format": "mmpack-subset", **parent.extra}

    @functools.cached_property
    def shift(self) -> np.ndarray:
        """int64, shape (docs,): the parent position of subset position p in document d is
        ``p + shift[d]`` (made on the first read by subset positions)."""
        return self.parent_doc_starts - self._offsets[:-1]

    @staticmethod
    def read_meta(path: Any) -> Any:
        return None

    @staticmethod
    def commit(tmpdir: Any, meta: Any) -> None:
        raise TypeError("a subset is made by store.select / where / split, not written")

    @property
    def remote(self) -> bool:  # type: ignore[override]
        """The parent's (a subset reads its tokens)."""
        return self.parent.remote

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def _doc_of(self, positions: np.ndarray) -> np.ndarray:
        """The document holding the token at each position in ``[0, num_tokens]`` (the last
        document for ``num_tokens``): int64, shape positions.shape."""
        d = np.searchsorted(self._offsets, positions, side="right")
        d -= 1
        return np.minimum(d, self._offsets.shape[0] - 2, out=d)

    def pieces(
        self, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(one_doc, range, at, parent_start, length)`` of every piece of the ranges
        ``[starts, starts + lengths)`` (int64, shape (k,)) cut at document boundaries (piece q
        is ``length[q]`` tokens at offset ``at[q]`` of range ``range[q]``, in order):
        ``one_doc`` when every range lies in one document (the pieces are then the ranges)."""
        out = np.empty(starts.shape[0], dtype=np.int64)
        if parent_starts(self._offsets, self.shift, starts, lengths, out) < 0:
            return True, starts, starts, out, lengths  # the usual case: one kernel call
        ends = starts + lengths
        first = self._doc_of(starts)
        last = np.where(lengths > 0, self._doc_of(np.maximum(ends - 1, 0)), first)
        n_pieces = np.where(lengths > 0, last - first + 1, 0)
        rng = np.repeat(np.arange(starts.shape[0], dtype=np.int64), n_pieces)
        base = np.cumsum(n_pieces) - n_pieces
        doc = first[rng] + (np.arange(rng.shape[0], dtype=np.int64) - base[rng])
        lo = np.maximum(starts[rng], self._offsets[doc])
        hi = np.minimum(ends[rng], self._offsets[doc + 1])
        keep = hi > lo
        rng, doc, lo, hi = rng[keep], doc[keep], lo[keep], hi[keep]
        return False, rng, lo - starts[rng], lo + self.shift[doc], hi - lo

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        k = starts.shape[0]
        if k == 0 or self._offsets.shape[0] == 1:
            return np.empty(0, dtype=self.meta.dtype), np.zeros(k, dtype=np.int64)
        one_doc, rng, off, lo, n = self.pieces(starts, lengths)
        if one_doc:
            return self.parent.read_ranges(lo, n)
        src, at = self.parent.read_ranges(lo, n)
        at = np.asarray(at, dtype=np.int64)
        out_starts = np.cumsum(lengths) - lengths
        buf = np.empty(int(lengths.sum()), dtype=self.meta.dtype)
        dst = out_starts[rng] + off
        within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        buf[np.repeat(dst, n) + within] = src[np.repeat(at, n) + within]
        return buf, out_starts

    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        if self._offsets.shape[0] == 1:
            return 0
        _, _, _, lo, n = self.pieces(np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
        return self.parent.prefetch(lo, n) if lo.size else 0

    def resident(self, positions: np.ndarray) -> bool:
        if self._offsets.shape[0] == 1 or positions.size == 0:
            return True
        pos = np.minimum(positions, self._offsets[-1])
        return self.parent.resident(pos + self.shift[self._doc_of(pos)])

    def advise(self, pattern: str) -> str:
        return self.parent.advise(pattern)

    def read_file(self, name: str) -> bytes:
        return self.parent.read_attached(name)


def token_source(store: Any) -> tuple[Any, np.ndarray]:
    """``(source, doc_starts)``: the store whose flat tokens hold ``store``'s documents and
    where each document starts there (int64, shape (>= num_docs,), read-only), so that
    document ``j``'s tokens are ``source``'s ``[doc_starts[j], doc_starts[j] + doc_lens[j])``.
    A store is its own source (``doc_starts`` is its :attr:`~TokenStore.mapped_offsets`, whose
    pages the reader checks as it reads them: :meth:`~TokenStore.doc_bounds`); a subset's is
    its parent (:attr:`~mmpack.TokenStore.parent_doc_starts`): a reader computing ranges from
    ``doc_starts`` reads the parent directly, with no remapping per read.  O(1)."""
    if store.parent is not None:
        return store.parent, store.parent_doc_starts
    return store, store.mapped_offsets


# --------------------------------------------------------------------------------- making them
def check_doc_ids(doc_ids: Any, n: int) -> np.ndarray:
    """Document ids given to ``select``: a 1-D sequence of ints in ``[0, n)``, strictly
    increasing.  Returns them as int64 (a new array).

    Raises
    ------
    TypeError
        Not a 1-D sequence of integers (bools and floats included).
    IndexError
        An id outside ``[0, n)`` (named).
    ValueError
        Ids not strictly increasing (the first repeated or out-of-order id is named).
    """
    if isinstance(doc_ids, (str, bytes)):
        raise TypeError(f"doc_ids must be a 1-D sequence of document ids, got {doc_ids!r}")
    arr = np.array(doc_ids)
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(
            f"doc_ids must be a 1-D sequence of integer document ids, got dtype {arr.dtype} "
            f"shape {arr.shape} (a boolean mask over documents goes to where())"
        )
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
        bad = arr[(arr < 0) | (arr >= n)][0]
        raise IndexError(f"document id {int(bad)} is out of range for a store of {n} documents")
    arr = arr.astype(np.int64)
    if arr.size > 1:
        step = np.diff(arr)
        if (step <= 0).any():
            p = int(np.argmax(step <= 0)) + 1
            what = "repeated" if step[p - 1] == 0 else "out of order"
            raise ValueError(
                f"doc_ids must be sorted and unique: id {int(arr[p])} at position {p} is {what} "
                "(sort them with numpy.unique)"
            )
    return arr


def where_positions(store: Any, mask: Any, equal: dict[str, Any]) -> np.ndarray:
    """The positions (int64, sorted) of ``store``'s documents where ``mask`` is true and every
    field named in ``equal`` equals its value (see :meth:`TokenStore.where
    <mmpack.TokenStore.where>`)."""
    n = len(store)
    keep = np.ones(n, dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_ or m.shape != (n,):
            raise ValueError(
                f"where() takes a boolean mask of shape ({n},), one per document; got dtype "
                f"{m.dtype} shape {m.shape}"
            )
        keep &= m
    fields = store.fields
    for name, value in equal.items():
        if name not in fields:
            raise ValueError(f"where(): the store has no field {name!r} (it has {sorted(fields)})")
        keep &= fields[name] == _field_value(name, value, fields.categories(name))
    return np.flatnonzero(keep).astype(np.int64)


def _field_value(name: str, value: Any, categories: tuple[str, ...] | None) -> Any:
    if isinstance(value, str):
        if categories is None:
            raise TypeError(f"where(): field {name!r} holds numbers, got the string {value!r}")
        k = int(np.searchsorted(np.array(categories, dtype=object), value))
        if k == len(categories) or categories[k] != value:
            raise ValueError(
                f"where(): field {name!r} has no category {value!r} (it has "
                f"{list(categories)[:10]})"
            )
        return k
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"where(): field {name!r} compares with a number or a string, got {value!r}"
        )
    return value


def _split_fractions(fractions: Any) -> tuple[list[str], np.ndarray]:
    """``fractions`` checked: a non-empty dict of names to fractions in ``[0, 1]`` summing to 1
    (within 1e-9).  Returns the names and the upper thresholds of their 64-bit hash intervals
    (uint64, the last one ``2**64 - 1``)."""
    if not isinstance(fractions, dict) or not fractions:
        raise TypeError(
            f"split() takes a dict of part names to fractions, e.g. {{'train': 0.99, "
            f"'validation': 0.01}}; got {fractions!r}"
        )
    names = list(fractions)
    values = []
    for name, f in fractions.items():
        if not isinstance(name, str):
            raise TypeError(f"split(): part names are strings, got {name!r}")
        if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, float, np.number)):
            raise TypeError(f"split(): fraction of {name!r} is {f!r}, not a number")
        if not math.isfinite(float(f)) or not 0 <= float(f) <= 1:
            raise ValueError(f"split(): fraction of {name!r} is {f!r}; fractions lie in [0, 1]")
        values.append(float(f))
    total = math.fsum(values)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"split(): the fractions {fractions!r} sum to {total!r}, not 1")
    cum = np.cumsum(np.array(values, dtype=np.float64)) / total
    bounds = np.minimum(np.floor(cum * 2.0**64), 2.0**64 - 1).astype(np.float64)
    thresholds = np.array([int(b) if b < 2.0**64 else 2**64 - 1 for b in bounds], dtype=np.uint64)
    thresholds[-1] = np.uint64(2**64 - 1)
    return names, thresholds


def split_keys(seed: Any, depth: int = 0) -> np.ndarray:
    """The hash keys of ``split(..., seed)`` of a store or subset of :attr:`split_depth
    <mmpack.TokenStore.split_depth>` ``depth`` (uint64, shape (ROUNDS,)): drawn from
    ``(SPLIT_STREAM + depth, seed)``, never a sampler's keys of a plain seed, nor those of
    another depth."""
    words = (SPLIT_STREAM + depth, *seed_words(seed))
    return epoch_keys(words, np.zeros(1, dtype=np.uint64))[0]


def split_positions(
    ids: np.ndarray, fractions: Any, seed: Any = 0, depth: int = 0
) -> dict[str, np.ndarray]:
    """The positions in ``ids`` (the parent ids of a store's documents, int64, shape (n,)) of
    each part of ``split(fractions, seed)`` of a store of :attr:`split_depth
    <mmpack.TokenStore.split_depth>` ``depth``, by the keyed hash of each id (see the module
    docstring and :meth:`TokenStore.split <mmpack.TokenStore.split>`): int64, sorted, disjoint,
    covering ``[0, n)``."""
    names, thresholds = _split_fractions(fractions)
    part = np.empty(ids.shape[0], dtype=np.int64)
    split_parts(ids, split_keys(seed, depth), thresholds, part)
    return {name: np.flatnonzero(part == k) for k, name in enumerate(names)}
