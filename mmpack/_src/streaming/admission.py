"""Admission: the streaming packer's reading of its source, and the pieces it holds.

:class:`Admission` owns everything between the source and the best-fit scan (step 1 of
:mod:`mmpack._src.streaming.packer`): the source of the epoch (read by index, through
``read_ranges`` for a TokenStore, or iterated), the queue of sequences read but not yet admitted
(lengths, source indices and, for in-memory sources, their positions in the token chunks of
:mod:`mmpack._src.streaming.pieces`, with loss masks when every document carries one:
:attr:`Admission.masked`), the :class:`~mmpack._src.streaming.pieces.PieceBuffer` of held pieces,
and the counts of what the ``long_docs`` policy did.  It admits exactly as many *pieces* as a
batch needs (:func:`mmpack._src.streaming.sources.piece_counts`), so held pieces stay within
``buffer_size + readahead`` whatever a document's length, and commits each step only once it has
succeeded (:meth:`Admission.read_ahead`).

Cost per admitted piece: O(1) numpy work amortised over the batch (a min and a max when every
queued document is one whole piece, the common case; else one ``cumsum`` and one
``searchsorted`` per admission call); a piece is an int64 column, no Python object.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.core.options import SourceFormat
from mmpack._src.store.lossmask import mix_error
from mmpack._src.streaming.incoming import flat_documents, tokens_of
from mmpack._src.streaming.pieces import PieceBuffer
from mmpack._src.streaming.sources import PEEK, batch_items, detect_format, piece_counts, pieces_of
from mmpack._src.streaming.stats import AdmissionCounts
from mmpack.errors import StateMismatchError

__all__ = ["Admission", "Position"]


@dataclass(frozen=True, eq=False)
class Position:
    """Where admission stands in a random-access source: the first sequence (and the token in
    it) not yet admitted, whether the source is exhausted, and the held pieces (source index,
    offset in that sequence, length; int64 arrays of one length)."""

    next_index: int
    next_offset: int
    exhausted: bool
    pending_src: np.ndarray
    pending_off: np.ndarray
    pending_len: np.ndarray


class Admission:
    """Reads a source into held pieces of at most ``seqlen`` tokens, by the ``long_docs``
    policy.  :meth:`start` begins an epoch over a source; the rest is driven by the placement
    scan (:meth:`read_ahead`)."""

    def __init__(self, seqlen: int, long_docs: str) -> None:
        self._seqlen = seqlen
        self._long_docs = long_docs
        self._source: Any = None
        self._indexed = True
        self._store_like = False
        self._iterator: Iterator[Any] | None = None
        self._iter_format = SourceFormat.SEQUENCES.value
        self._carry: list[Any] = []  # sequences of an incoming batch read but not yet queued
        self._pieces = PieceBuffer(with_chunks=True)
        self._counts = AdmissionCounts()
        self._masked: bool | None = None  # whether the documents carry loss masks (None: unknown)
        self._reset_queue()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_iterator"], state["_carry"] = None, []  # a live iteration is not carried over
        return state

    # ------------------------------------------------------------------------- what others read
    @property
    def pieces(self) -> PieceBuffer:
        """The held pieces, in stream order (the placement scan compacts them once placed)."""
        return self._pieces

    @property
    def counts(self) -> AdmissionCounts:
        """A copy of this epoch's counts."""
        return dataclasses.replace(self._counts)

    def oldest_position(self) -> int | None:
        """The oldest global token position still referenced (by a held piece, else by the
        queue), None when nothing is: the token chunks before it can go."""
        if self._pieces.n:
            return int(self._pieces.data[3, 0])
        return int(self._q_pos[0]) if self._q_pos.shape[0] else None

    @property
    def masked(self) -> bool:
        """Whether the source's documents carry loss masks (a masked TokenStore, or documents
        ``{"input_ids", "loss_mask"}``): the held pieces' masks are then read with
        :meth:`read_ranges` or from :attr:`PieceBuffer.masks`."""
        return bool(self._masked)

    def read_ranges(
        self, src: np.ndarray, off: np.ndarray, lens: np.ndarray, mask: bool = False
    ) -> tuple[Any, Any]:
        """A TokenStore source's tokens of pieces (source index, offset, length; int64), or
        with ``mask`` their loss masks (its ``loss_mask`` store, same offsets): ``read_ranges``
        over the flat token ranges, ``(tokens, start of each range in them)``."""
        flat_starts = self._source.offsets[src].astype(np.int64)
        flat_starts += off
        store = self._source.loss_mask if mask else self._source
        return store.read_ranges(flat_starts, lens)

    # ------------------------------------------------------------------------- an epoch
    def start(self, source: Any, *, indexed: bool, store_like: bool, source_format: str) -> None:
        """Begin an epoch over ``source``: nothing held, nothing queued, counts at zero; an
        iterated source is iterated anew (its format told from its first elements when
        ``source_format`` is ``"auto"``)."""
        self._source, self._indexed, self._store_like = source, indexed, store_like
        self._pieces = PieceBuffer(with_chunks=not store_like)
        self._counts = AdmissionCounts()
        self._masked = getattr(source, "loss_mask", None) is not None if store_like else None
        self._carry = []
        self._reset_queue()
        self._iterator = None
        if not indexed:
            iterator = iter(source)
            fmt = source_format
            if fmt == SourceFormat.AUTO:
                peeked = list(itertools.islice(iterator, PEEK))
                fmt = detect_format(peeked)
                iterator = itertools.chain(peeked, iterator)
            self._iter_format = fmt
            self._iterator = iterator

    def _reset_queue(self) -> None:
        """Empty the queue of documents read from the source but not yet admitted as pieces."""
        self._read_index = 0  # source sequences read so far (the next one to read, if indexed)
        self._head_off = 0  # tokens of the queue's first document already admitted as pieces
        self._q_lens = np.empty(0, dtype=np.int64)
        self._q_src = np.empty(0, dtype=np.int64)
        self._q_pos = np.empty(0, dtype=np.int64)  # global position of each queued sequence
        self._exhausted = False  # the source has no more sequences to read

    def read_ahead(self, want: int) -> None:
        """Admit exactly ``want`` more pieces, unless the source runs out first.

        Documents are read into a queue and admitted piece by piece, so a long document split
        into many pieces is admitted lazily (the held pieces stay within
        ``buffer_size + readahead``, whatever the document's length).  Each step commits only
        once it has succeeded: a source that raises leaves the position where it was, and a
        state taken then resumes with nothing lost."""
        target = self._pieces.n + want
        while self._pieces.n < target:
            if self._q_lens.shape[0] == 0:
                if self._exhausted:
                    return
                self._fill_queue(target - self._pieces.n)
            else:
                self._admit_from_queue(target - self._pieces.n)

    def _fill_queue(self, n_docs: int) -> None:
        """Read up to ``n_docs`` sequences into the (empty) queue; mark the source exhausted when
        none is left."""
        if self._pieces.chunks:  # the queue is empty: only the held pieces refer to chunks
            self._pieces.release_unheld()
        j0 = self._read_index
        source: Any = self._source
        if self._indexed:
            j1 = min(len(source), j0 + n_docs)
            if j0 >= j1:
                self._exhausted = True
                return
            if self._store_like:
                lens = np.asarray(
                    source.offsets[j0 + 1 : j1 + 1] - source.offsets[j0:j1], dtype=np.int64
                )
                self._queue(lens, np.zeros_like(lens), j0, j1)
                return
            if isinstance(source, (list, tuple)):
                docs = list(source[j0:j1])
            else:
                docs = [source[j] for j in range(j0, j1)]
        else:
            docs = self._read_iterated(n_docs)
            if not docs:
                self._exhausted = True
                return
            j1 = j0 + len(docs)
        flat, lens, mask = flat_documents(docs, j0, self._pieces.spare)
        self._check_masked(mask is not None, j0)
        # Commit (flat_documents raised, if at all, before anything changed).
        base = self._pieces.add_chunk(flat, mask)
        self._queue(lens, base + np.cumsum(lens) - lens, j0, j1)

    def _check_masked(self, masked: bool, j: int) -> None:
        """Documents from ``j`` on carry loss masks (``masked``) or not: as every document
        before them (the first decides), else a ``ValueError`` naming document ``j``."""
        if self._masked is None:
            self._masked = masked
        elif masked != self._masked:
            raise mix_error(j, masked, j)

    def _queue(self, lens: np.ndarray, pos: np.ndarray, j0: int, j1: int) -> None:
        """Queue source sequences ``j0 .. j1`` of lengths ``lens`` at global positions ``pos``."""
        self._q_lens = lens
        self._q_src = np.arange(j0, j1, dtype=np.int64)
        self._q_pos = pos
        self._read_index = j1

    def _read_iterated(self, n_docs: int) -> list[Any]:
        assert self._iterator is not None
        if self._iter_format == SourceFormat.SEQUENCES:
            return list(itertools.islice(self._iterator, n_docs))
        items = self._carry[:n_docs]
        del self._carry[:n_docs]
        while len(items) < n_docs:
            try:
                batch = next(self._iterator)
            except StopIteration:
                break
            except BaseException:
                self._carry[:0] = items  # keep what was read for the next attempt
                raise
            more = batch_items(batch)
            take = n_docs - len(items)
            items.extend(more[:take])
            self._carry = more[take:]
        return items

    def _admit_from_queue(self, need: int) -> None:
        """Admit the next ``need`` pieces of the queued documents (fewer if the queue holds
        fewer), applying the empty/long-sequence policies; a document cut by ``need`` stays at
        the head of the queue with its admitted tokens counted in ``_head_off``."""
        P = self._seqlen
        lens, head = self._q_lens, self._head_off
        if not head and need >= lens.shape[0] and lens.min() > 0 and lens.max() <= P:
            # The common case: every queued document is one whole piece.
            self._counts.n_docs += lens.shape[0]
            zeros = np.zeros(lens.shape[0], dtype=np.int64)
            self._pieces.append(lens, self._q_src, zeros, self._q_pos)
            self._q_lens, self._q_src, self._q_pos = lens[:0], self._q_src[:0], self._q_pos[:0]
            return
        n_pieces = piece_counts(lens, head, P, self._long_docs)
        ends = np.cumsum(n_pieces)
        cut = int(np.searchsorted(ends, need))  # the first document that reaches `need` pieces
        if cut >= lens.shape[0]:
            n_docs, partial = lens.shape[0], 0
        else:
            take = need - (int(ends[cut - 1]) if cut else 0)
            full = take == n_pieces[cut]
            n_docs, partial = cut + int(full), (0 if full else take)
        used = n_pieces[: n_docs + int(partial > 0)].copy()
        if partial:
            used[n_docs] = partial
        m = used.shape[0]
        doc, off, plen = pieces_of(lens[:m], head, used, P)
        pos = self._q_pos[:m][doc] + off  # 0 + offset for a store-like source (unused)
        # Commit: count the documents whose admission starts here, hold their pieces.
        self._count(lens[int(head > 0) : m])
        self._pieces.append(plen, self._q_src[doc], off, pos)
        self._head_off = int(off[-1] + plen[-1]) if partial else 0
        self._q_lens, self._q_src = lens[n_docs:], self._q_src[n_docs:]
        self._q_pos = self._q_pos[n_docs:]

    def _count(self, fresh: np.ndarray) -> None:
        """Count the documents of lengths ``fresh`` whose admission starts now."""
        P, counts = self._seqlen, self._counts
        counts.n_docs += fresh.shape[0]
        counts.n_empty += int(np.count_nonzero(fresh == 0))
        long = fresh[fresh > P]
        if long.size:
            excess = int((long - P).sum())
            if self._long_docs == "split":
                counts.n_split += long.shape[0]
            elif self._long_docs == "truncate":
                counts.n_truncated += long.shape[0]
                counts.lost_tokens += excess
            else:
                counts.n_dropped += long.shape[0]
                counts.lost_tokens += excess + P * long.shape[0]

    # ------------------------------------------------------------------------- position
    def position(self) -> Position:
        """Where admission stands (a random-access source only): restoring it with
        :meth:`restore` makes the same pieces held and the same sequences read next."""
        assert self._indexed
        pieces = self._pieces
        queued = self._q_lens.shape[0] > 0
        return Position(
            next_index=int(self._q_src[0]) if queued else self._read_index,
            next_offset=self._head_off,
            exhausted=self._exhausted and not queued,
            pending_src=pieces.src.copy(),
            pending_off=pieces.src_off.copy(),
            pending_len=pieces.lens.copy(),
        )

    def restore(self, position: Position, counts: AdmissionCounts) -> None:
        """After :meth:`start`: hold the pieces of ``position`` (read again from the source) and
        continue from its next sequence, with ``counts``.  :class:`StateMismatchError` when the
        pieces or the next offset lie outside this source."""
        assert self._indexed
        self._read_pieces(position.pending_src, position.pending_off, position.pending_len)
        if position.next_offset and position.next_offset >= self._doc_len(position.next_index):
            raise StateMismatchError(
                f"the state's next_offset={position.next_offset} lies past the end of source "
                f"sequence {position.next_index}"
            )
        self._read_index = position.next_index
        self._head_off = position.next_offset
        self._exhausted = position.exhausted
        self._counts = dataclasses.replace(counts)

    def _read_pieces(self, src: np.ndarray, off: np.ndarray, plen: np.ndarray) -> None:
        if self._store_like:
            doc_lens = np.diff(self._source.offsets)[src]
            if np.any(off + plen > doc_lens):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            self._pieces.append(plen, src, off, np.zeros_like(plen))
            return
        tokens: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        docs: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        for j, o, n in zip(src.tolist(), off.tolist(), plen.tolist()):
            doc = docs.get(j)
            if doc is None:
                flat_doc, _, doc_mask = flat_documents([self._source[j]], j)
                self._check_masked(doc_mask is not None, j)
                doc = docs[j] = flat_doc, doc_mask
            if o + n > len(doc[0]):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            tokens.append(doc[0][o : o + n])
            if doc[1] is not None:
                masks.append(doc[1][o : o + n])
        flat, _, _ = flat_documents(tokens)
        mask = None
        if self._masked:
            mask = np.concatenate(masks) if masks else np.empty(0, dtype=np.uint8)
        base = self._pieces.add_chunk(flat, mask)
        self._pieces.append(plen, src, off, base + np.cumsum(plen) - plen)

    def _doc_len(self, j: int) -> int:
        source: Any = self._source
        if self._store_like:
            return int(source.offsets[j + 1] - source.offsets[j])
        return len(tokens_of(source[j]))
