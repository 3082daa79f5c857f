"""The streaming packer's held pieces and the token chunks they point into.

Each incoming batch of an in-memory source becomes one *chunk*: its sequences' tokens, one after
the other, in one 1-D integer array of their dtype (one ``b"".join``, ``np.concatenate`` or
``np.fromiter`` per incoming batch, in :func:`mmpack._src.streaming.incoming.flat_documents`): a copy
of the tokens read (with documents' loss masks, their masks too: :attr:`PieceBuffer.masks`),
held while any of its pieces is.  Chunks are numbered by
*global token positions*: a chunk added when ``g`` tokens were added before it holds positions
``[g, g + len(chunk))``, so a piece is an int64 column (length, source index, offset in its
source sequence, global position of its first token) and holding it costs no Python object.
A chunk is released once no held piece and no queued sequence lies in it (pieces and queued
sequences are in stream order, hence by increasing position: the live chunks are those from the
one holding the oldest live position on), and, before the next chunk is read, when it lies after
the last held piece (its sequences were all dropped: a long stretch of dropped sequences holds
one chunk, not all of them, :meth:`PieceBuffer.release_unheld`).  A piece deferred by a batch is placed by one of the
next ``buffer_size / rows`` batches (the first ``rows`` pieces scanned always fit), so the live
chunks hold the tokens of about that many batches plus one incoming batch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PieceBuffer"]

_POOL = 4  # released chunk buffers kept for reuse


class PieceBuffer:
    """Held pieces in stream order: those deferred by the last batch, then those read ahead.

    ``data`` is an int64 array of shape (4, capacity) whose first ``n`` columns are the pieces:
    length, source index, offset in the source sequence, and global position (the first three
    as the views ``lens``, ``src`` and ``src_off``).  For an in-memory source (``with_chunks``) piece
    ``k``'s tokens are at global positions ``pos[k] .. pos[k] + lens[k]`` of the chunks
    (:meth:`tokens`); a store-like source has no chunks (its pieces are read by source index
    and offset when emitted, and ``pos`` is 0).  A batch removes its placed pieces by compacting
    ``data`` in place (:func:`mmpack._src.kernels.streaming_batch.layout_batch`) and calling
    :meth:`keep`.
    """

    def __init__(self, with_chunks: bool) -> None:
        self.data = np.empty((4, 0), dtype=np.int64)
        self.n = 0
        self.chunks: list[tuple[int, np.ndarray]] | None = [] if with_chunks else None
        """``(first global position, 1-D integer tokens)`` of each live chunk, in order."""
        self.masks: list[np.ndarray | None] = []
        """The loss mask of each live chunk (uint8, its shape), or None: one per chunk."""
        self._end = 0  # global position after the last chunk
        self._owners: list[np.ndarray | None] = []  # each live chunk's pooled buffer, if any
        self._pool: list[np.ndarray] = []  # released buffers, reused by spare()
        self._lent: np.ndarray | None = None  # the buffer of the last spare()

    @property
    def lens(self) -> np.ndarray:
        return self.data[0, : self.n]

    @property
    def src(self) -> np.ndarray:
        return self.data[1, : self.n]

    @property
    def src_off(self) -> np.ndarray:
        return self.data[2, : self.n]

    def keep(self, n: int) -> None:
        """Hold only the first ``n`` pieces of ``data`` (after a kernel compacted it in place)."""
        assert 0 <= n <= self.n
        self.n = n

    def spare(self, dtype: np.dtype, n: int) -> np.ndarray:
        """An uninitialised 1-D array of ``n`` elements of ``dtype`` for the next chunk, from a
        released chunk's buffer when one is large enough (reusing memory already mapped: a
        fresh buffer per incoming batch costs as much again in page faults)."""
        for k, buf in enumerate(self._pool):
            if buf.dtype == dtype and buf.shape[0] >= n:
                del self._pool[k]
                break
        else:
            buf = np.empty(n + n // 4, dtype=dtype)
        self._lent = buf
        return buf[:n]

    def add_chunk(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Hold the 1-D integer array ``tokens`` (with its loss mask ``mask``, uint8 of its
        shape, if any) as the next chunk; returns its first global position.  The chunk's
        buffer returns to the pool when it is released if it came from :meth:`spare`."""
        assert self.chunks is not None and tokens.ndim == 1 and tokens.dtype.kind in "iu"
        owner = self._lent if tokens.base is not None and tokens.base is self._lent else None
        self._lent = None
        base = self._end
        if tokens.shape[0]:
            self.chunks.append((base, tokens))
            self.masks.append(mask)
            self._owners.append(owner)
            self._end = base + tokens.shape[0]
        elif owner is not None:
            self._pool.append(owner)
        return base

    def release(self, oldest: int | None) -> None:
        """Drop the chunks that end at or before global position ``oldest`` (the oldest
        position still referenced; None: nothing is)."""
        chunks = self.chunks
        if not chunks:
            return
        k = 0
        while k < len(chunks) and (
            oldest is None or chunks[k][0] + chunks[k][1].shape[0] <= oldest
        ):
            k += 1
        if k:
            self._pool.extend(b for b in self._owners[:k] if b is not None)
            del self._pool[:-_POOL]
            del chunks[:k], self._owners[:k], self.masks[:k]

    def release_unheld(self) -> None:
        """With no queued sequence: drop the chunks that no held piece lies in, before the
        first held piece and after the last (a chunk whose sequences were all dropped or empty
        goes at once, instead of staying until the next batch is written)."""
        chunks = self.chunks
        if not chunks:
            return
        if not self.n:
            self.release(None)
            return
        end = int(self.data[3, self.n - 1] + self.data[0, self.n - 1])
        k = len(chunks)
        while k and chunks[k - 1][0] >= end:
            k -= 1
        if k < len(chunks):
            self._pool.extend(b for b in self._owners[k:] if b is not None)
            del self._pool[:-_POOL]
            del chunks[k:], self._owners[k:], self.masks[k:]
        self.release(int(self.data[3, 0]))

    def tokens(self, pos: int, length: int) -> np.ndarray:
        """The tokens at global positions ``pos .. pos + length`` (a view of one chunk)."""
        assert self.chunks is not None
        for base, chunk in self.chunks:
            if base <= pos and pos + length <= base + chunk.shape[0]:
                return chunk[pos - base : pos - base + length]
        raise AssertionError(f"no live chunk holds positions {pos}..{pos + length}")

    def append(
        self, lens: np.ndarray, src: np.ndarray, src_off: np.ndarray, pos: np.ndarray
    ) -> None:
        """Hold more pieces (after those held): lengths, source indices, offsets in their
        source sequences and global positions (int64, same shape)."""
        n, end = self.n, self.n + lens.shape[0]
        if end > self.data.shape[1]:
            grown = np.empty((4, max(end, 2 * self.data.shape[1])), dtype=np.int64)
            grown[:, :n] = self.data[:, :n]
            self.data = grown
        self.data[0, n:end] = lens
        self.data[1, n:end] = src
        self.data[2, n:end] = src_off
        self.data[3, n:end] = pos
        self.n = end
