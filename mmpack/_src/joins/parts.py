"""Joined stores: one store made of parts, each a complete store, without copying a token.

A join is a folder holding a small manifest and one index::

    OUT/mmpack-join.json       format "mmpack-join", the parts in order (location, fingerprint,
                               dtype, counts; for another tool's files their format and options),
                               the counts, the fingerprint of the join
    OUT/offsets-<id>.bin       int64 (num_docs + 1,): the global document offsets; the CRC-32 of
                               each 16 MiB stripe in the manifest

A joined store is a :class:`~mmpack.TokenStore` with ``tokens=None`` whose backend
serves ``read_ranges``: the global ranges are split at the parts' token starts (one
``searchsorted``, ``np.repeat`` for the pieces) and copied into one buffer, straight from the
parts' mappings when every part is a memmap store, else with ONE ``read_ranges`` per touched
part; ranges all in one part of the store's dtype get that part's answer as it is.  Opening
(:mod:`mmpack._src.joins.opening`) maps the offsets and opens every part's metadata (no file
descriptor held per part), refusing a missing part, another fingerprint or a join that contains
itself.  ``verify()`` verifies every part, the offsets' checksums and their agreement with the
parts'; ``verify_reads=True`` checks the offsets' checksums at open.  Appending or re-joining
writes a new offsets file, replaces the manifest atomically, then removes the old file.

Cost: ``join`` writes ``8 * (num_docs + 1)`` bytes plus the manifest (``8 / (itemsize * mean
document length)`` of the tokens); a batch of windows against a single store: ``python -m
benchmarks.bench_join`` (docs/benchmarks.md).  The manifest is :mod:`mmpack._src.joins.manifest`.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.joins.manifest import JOIN_FILE, MANIFEST_KEYS, read_manifest
from mmpack._src.store.backends import Backend
from mmpack._src.store.fields import Fields, check_same_fields, concat_fields
from mmpack._src.store.reader import TokenStore, reopen_pickled
from mmpack.errors import FormatError

__all__ = [
    "JOIN_FILE",
    "JoinMeta",
    "JoinedStore",
    "PARTS_CHECK_THEIR_OWN",
    "PartsBackend",
    "check_global_offsets",
    "joined_mask_fingerprint",
]


@dataclass(frozen=True)
class JoinMeta:
    """What :class:`TokenStore` reads of a joined store's metadata."""

    dtype: np.dtype
    num_docs: int
    num_tokens: int
    fingerprint: str
    backend: str = "parts"
    loss_mask: str | None = None
    """The fingerprint of the join's loss mask (every part has one), or None (none has)."""


def joined_mask_fingerprint(
    parts: Sequence[TokenStore], fingerprint: str, where: Any
) -> str | None:
    """The fingerprint of the loss mask of the join ``fingerprint`` of ``parts``: derived from
    the join's (which covers every part's, their masks included) when every part has a loss
    mask, None when none has; ``ValueError`` naming the first part that differs from part 0
    otherwise (a store has a mask for every document or for none), or whose fields
    (:func:`~mmpack._src.store.fields.check_same_fields`) differ from part 0's."""
    flags = [p.has_loss_mask for p in parts]
    if any(flags) and not all(flags):
        k = flags.index(not flags[0])
        has = ("has a loss mask", "has none") if flags[k] else ("has no loss mask", "has one")
        raise ValueError(
            f"{where}: part {k} ({parts[k].location}) {has[0]} but part 0 "
            f"({parts[0].location}) {has[1]}; join stores that all have loss masks, or none"
        )
    check_same_fields([p.fields for p in parts], where)  # and the same fields
    if not flags or not flags[0]:
        return None
    return hashlib.sha256(f"mmpack-join-loss-mask:{fingerprint}".encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------- the backend
class PartsBackend(Backend):
    """Reads global token ranges from the parts (see the module docstring)."""

    name = "parts"

    def __init__(
        self, path: Path, meta: JoinMeta, parts: Sequence[TokenStore], offsets: np.ndarray
    ) -> None:
        super().__init__(path, meta)  # type: ignore[arg-type]
        self.parts = tuple(parts)
        self._offsets = offsets
        self.token_starts = np.zeros(len(self.parts) + 1, dtype=np.int64)
        np.cumsum([p.num_tokens for p in self.parts], out=self.token_starts[1:])
        maps = [p.mapping() for p in self.parts]
        self._maps = maps if all(m is not None for m in maps) else None
        # parts opened with verify_reads whose blocks are not all checked yet: a range is read
        # from a part's mapping only after that part checked it (check_reads)
        self._unchecked = {k for k, p in enumerate(self.parts) if p.verify_reads}

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        return read_manifest(path) if (path / JOIN_FILE).is_file() else None

    @staticmethod
    def commit(tmpdir: Path, meta: Any) -> None:
        raise TypeError("a joined store is written by mmpack.join, not by StoreWriter")

    @property
    def remote(self) -> bool:  # type: ignore[override]
        """Whether every part is remote (a join of local and remote parts reads like a local
        store for its local parts)."""
        return bool(self.parts) and all(p.remote for p in self.parts)

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        k = starts.shape[0]
        dtype = self.meta.dtype
        total = int(lengths.sum())
        if total == 0:
            return np.empty(0, dtype=dtype), np.zeros(k, dtype=np.int64)
        ts = self.token_starts
        ends = starts + lengths
        first = np.searchsorted(ts, starts, side="right") - 1  # part holding each range's start
        last = np.searchsorted(ts, ends, side="left") - 1  # part holding its last token
        n_pieces = np.where(lengths > 0, last - first + 1, 0)
        # shape: (pieces,) -- piece q is range rng[q] inside part part[q]
        rng = np.repeat(np.arange(k, dtype=np.int64), n_pieces)
        piece_base = np.cumsum(n_pieces) - n_pieces
        part = first[rng] + (np.arange(rng.shape[0], dtype=np.int64) - piece_base[rng])
        lo = np.maximum(starts[rng], ts[part])
        hi = np.minimum(ends[rng], ts[part + 1])
        keep = hi > lo  # empty parts between a range's ends give empty pieces
        rng, part, lo, hi = rng[keep], part[keep], lo[keep], hi[keep]
        touched = np.unique(part)
        if touched.shape[0] == 1 and rng.shape[0] == np.count_nonzero(lengths):
            p = int(touched[0])
            store = self.parts[p]
            if store.dtype == dtype:  # one part, one piece per range: its answer as it is
                src, src_starts = store.read_ranges(lo - ts[p], hi - lo)
                out_starts = np.zeros(k, dtype=np.int64)
                out_starts[rng] = np.asarray(src_starts, dtype=np.int64)
                return src, out_starts
        out_starts = np.cumsum(lengths) - lengths
        buf = np.empty(total, dtype=dtype)
        dst = out_starts[rng] + (lo - starts[rng])
        maps = self._maps
        if maps is not None:  # every part a memmap: one slice copy per piece, no call per part
            if self._unchecked:
                self._check_parts(part, lo - ts[part], hi - lo)
            for p, a, d, n in zip(
                part.tolist(), (lo - ts[part]).tolist(), dst.tolist(), (hi - lo).tolist()
            ):
                buf[d : d + n] = maps[p][a : a + n]
            return buf, out_starts
        order = np.argsort(part, kind="stable")  # pieces grouped by part, in request order
        cuts = np.flatnonzero(np.diff(part[order])) + 1
        for group in np.split(order, cuts):
            p = int(part[group[0]])
            store = self.parts[p]
            local = lo[group] - ts[p]
            n = hi[group] - lo[group]
            mapped = store.tokens  # a memmap part: slices of its mapping, no call per range
            if mapped is not None:
                _copy_pieces(mapped, local, buf, dst[group], n)
            else:
                src, src_starts = store.read_ranges(local, n)
                _copy_pieces(src, np.asarray(src_starts, dtype=np.int64), buf, dst[group], n)
        return buf, out_starts

    def _check_parts(self, part: np.ndarray, local: np.ndarray, n: np.ndarray) -> None:
        """Let every touched part that has unchecked blocks check its pieces (``part``,
        ``local`` starts and lengths ``n``: int64, shape (pieces,)); a part whose blocks are
        all checked is never asked again."""
        for p in np.unique(part).tolist():
            if p in self._unchecked:
                mine = part == p
                if self.parts[p].check_reads(local[mine], n[mine]):
                    self._unchecked.discard(p)


def _copy_pieces(
    src: np.ndarray, src_at: np.ndarray, dst: np.ndarray, dst_at: np.ndarray, lengths: np.ndarray
) -> None:
    """``dst[dst_at[q]:+lengths[q]] = src[src_at[q]:+lengths[q]]`` for every piece q: slices for
    long pieces (one memcpy each), one fancy-indexed gather for many short ones."""
    count = lengths.shape[0]
    total = int(lengths.sum())
    if count <= 8 or total >= 256 * count:
        for a, b, n in zip(src_at.tolist(), dst_at.tolist(), lengths.tolist()):
            dst[b : b + n] = src[a : a + n]
        return
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    dst[np.repeat(dst_at, lengths) + within] = src[np.repeat(src_at, lengths) + within]


def check_global_offsets(path: Path, raw: dict[str, Any], offsets: np.ndarray) -> int:
    """Check the CRC-32 of every block of the global offsets (int64, shape (num_docs + 1,))
    against the manifest ``raw``; :class:`FormatError` naming the first bad block.  Returns the
    number of blocks checked."""
    rec = raw["offsets"]
    data = np.ascontiguousarray(offsets).view(np.uint8)
    block = int(rec["block_bytes"])
    for b, stored in enumerate(rec["crc32"]):
        got = zlib.crc32(memoryview(data[b * block : (b + 1) * block]))  # type: ignore[arg-type]
        if got != stored:
            raise FormatError(
                f"{path}: global offsets stripe {b} fails its checksum (stored "
                f"{stored:#010x}, computed {got:#010x}); run mmpack join again"
            )
    return len(rec["crc32"])


class _PartsCheckTheirOwn:
    """The read checker of a join opened with ``verify_reads``: nothing to do here, since every
    part was opened with ``verify_reads`` and checks the blocks its reads touch."""

    def verify_span(self, start: int, stop: int) -> None:
        return None

    def verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        return None

    def all_checked(self) -> bool:
        return True


PARTS_CHECK_THEIR_OWN = _PartsCheckTheirOwn()


# --------------------------------------------------------------------------------- the store
class JoinedStore(TokenStore):
    """A :class:`TokenStore` made of parts (open with ``mmpack.open(OUT)``; write with
    :func:`join`).  ``tokens`` is None: views read through ``read_ranges``."""

    _backend: PartsBackend

    @property
    def parts(self) -> tuple[TokenStore, ...]:
        """The part stores, in order."""
        return self._backend.parts

    @property
    def part_locations(self) -> list[str]:
        """Each part's location as the manifest records it (relative to the join folder when
        local)."""
        return [p["location"] for p in self._raw_meta["parts"]]

    @property
    def token_starts(self) -> np.ndarray:
        """int64, shape (parts + 1,): the global token index where each part begins."""
        return self._backend.token_starts

    @property
    def extra(self) -> dict[str, Any]:
        """The manifest's optional sections (``"tokenizer"``, ``"provenance"``, a ``join``'s
        ``extra``)."""
        return {k: v for k, v in self._raw_meta.items() if k not in MANIFEST_KEYS}

    @property
    def attached_files(self) -> tuple[str, ...]:
        """The copy of the shared tokenizer's ``tokenizer.json`` in a local join's folder, when
        the manifest's tokenizer record names one that is there."""
        rec = self._raw_meta.get("tokenizer")
        name = rec.get("file") if isinstance(rec, dict) else None
        if not isinstance(name, str) or "://" in self.location or not (self.path / name).is_file():
            return ()
        return (name,)

    def verify(self, *, progress: Any = False) -> dict[str, int]:
        """Verify every part's checksums, the global offsets' checksums, and that the global
        offsets are the parts' offsets shifted; raise :class:`FormatError` naming the first
        defect.  Returns ``{"parts", "blocks", "bytes"}``.  ``progress``: one bar over the
        bytes of every part and of the global offsets (as :meth:`TokenStore.verify`)."""
        blocks = nbytes = 0
        total = sum(p.nbytes for p in self.parts) + self.offsets.nbytes
        with progress_bar(progress, total, desc="verifying") as bar:
            for k, part in enumerate(self.parts):
                try:
                    res = part.verify(progress=bar)
                except FormatError as exc:
                    raise FormatError(
                        f"{self.path}: part {k} ({self.part_locations[k]}): {exc}"
                    ) from exc
                blocks += res["blocks"]
                nbytes += res["bytes"]
            blocks += check_global_offsets(self.path, self._raw_meta, self.offsets)
            nbytes += self.offsets.nbytes
            bar.update(self.offsets.nbytes)
        doc = 0
        for k, part in enumerate(self.parts):
            n = len(part)
            if not np.array_equal(
                self.offsets[doc : doc + n + 1] - self.token_starts[k], part.offsets
            ):
                raise FormatError(
                    f"{self.path}: the global offsets disagree with part {k} "
                    f"({self.part_locations[k]}); run mmpack join again"
                )
            doc += n
        return {"parts": len(self.parts), "blocks": blocks, "bytes": nbytes}

    def _open_fields(self) -> Fields:
        """The parts' fields concatenated (:func:`~mmpack._src.store.fields.concat_fields`)."""
        return Fields.of(concat_fields([p.fields for p in self.parts], self.location))

    def _open_loss_mask(self) -> TokenStore:
        """The join of the parts' loss masks, with the join's offsets (nothing is written)."""
        meta = JoinMeta(
            dtype=np.dtype("<u1"),
            num_docs=len(self),
            num_tokens=self.num_tokens,
            fingerprint=self._meta.loss_mask,  # type: ignore[arg-type]
        )
        masks = [p.loss_mask for p in self.parts]  # every part has one (checked at open)
        backend = PartsBackend(self._path, meta, masks, self.offsets)  # type: ignore[arg-type]
        mask = JoinedMask(
            self._path,
            meta,  # type: ignore[arg-type]
            self._raw_meta,
            backend,
            location=self._location,
            cache_dir=self.cache_dir,
            open_options=self._open_options,
            verify_reads=self.verify_reads,
            read_checker=PARTS_CHECK_THEIR_OWN,
        )
        mask._joined = self
        return mask

    def __getstate__(self) -> dict[str, Any]:
        options = dict(self._open_options)  # the caller's, for the remote parts (in memory only)
        if self.verify_reads:
            options["verify_reads"] = True
        return {"location": self._location, "fingerprint": self.fingerprint, "options": options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        current = reopen_pickled(
            state["location"],
            state["fingerprint"],
            "the joined store",
            "changed",
            **state.get("options", {}),
        )
        self.__dict__.update(current.__dict__)

    def __repr__(self) -> str:
        return (
            f"JoinedStore({str(self._path)!r}, parts={len(self.parts)}, docs={len(self)}, "
            f"tokens={self.num_tokens}, dtype={self.dtype.name})"
        )


class JoinedMask(JoinedStore):
    """The loss mask of a :class:`JoinedStore` (its ``loss_mask``): the parts' masks read
    through the join's offsets.  Pickles as the join it belongs to."""

    _joined: JoinedStore

    def __getstate__(self) -> dict[str, Any]:
        return {"join": self._joined}

    def __setstate__(self, state: dict[str, Any]) -> None:
        mask = state["join"].loss_mask
        self.__dict__.update(mask.__dict__)

    def __repr__(self) -> str:
        return f"JoinedMask({str(self._path)!r}, parts={len(self.parts)}, docs={len(self)})"
