"""Skips and replays: the edits of a sampler's stream of global positions.

*Global position* ``p = e * n + j`` names position ``j`` (``0 <= j < n``) of epoch ``e``'s epoch
order, the order before it is dealt to ranks: it holds sample ``order_e[j]``.  Padding (the
repeats that fill the last round, see :mod:`mmpack._src.torch.elastic`) is not a global position, so
global positions do not depend on the world size.

Epoch ``e`` serves a *stream*: its global positions ``e n .. e n + n - 1`` in order, with the
replayed ranges inserted where they were asked for, and every skipped position removed (from
replayed ranges too: a skipped position is never served).  The stream is what ranks are dealt,
exactly as the epoch order was before (rank ``r`` of ``W`` takes stream indices
``offset + r, offset + r + W, ...``, the last round padded by wrapping around to the stream's
start or dropped with ``drop_last``); so ranks stay in step and an elastic resume at another world
size shares the rest of the stream.  A stream is built from the edit log:

* ``skips``: the union of the skipped ranges ``[start, stop)``, sorted and merged;
* ``replays``: ``[epoch, at, start, stop]`` per call: the range is inserted in epoch ``epoch``'s
  *raw* stream (the stream with nothing removed) before raw index ``at``.

Cost: a stream is ``O(edits)`` pieces ``(epoch, lo, hi)`` of consecutive epoch positions, built
once per epoch and edit in ``O(edits log edits)``; a stream index is found by a binary search over
the pieces' cumulative lengths.  Nothing of size ``n`` is materialised.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.core.validation import check_int
from mmpack.errors import FormatError

__all__ = ["EditLog", "Stream", "merge_skip", "pieces"]

_MAX_EPOCHS_SPANNED = 10**6


@dataclass(frozen=True)
class Stream:
    """The served stream of one epoch.

    ``epochs[k], lo[k], hi[k]``: piece ``k`` serves epoch positions ``lo[k] .. hi[k] - 1`` of epoch
    ``epochs[k]``; it starts at stream index ``cum[k]`` and raw index ``raw[k]``; ``original[k]``
    says it belongs to the epoch's own order, else to a replay.  ``length = cum[-1]``.
    """

    epoch: int
    epochs: tuple[int, ...]
    lo: np.ndarray
    hi: np.ndarray
    cum: np.ndarray
    raw: np.ndarray
    original: tuple[bool, ...]
    raw_length: int

    @property
    def length(self) -> int:
        return int(self.cum[-1])

    @property
    def simple(self) -> bool:
        """The unedited epoch: stream index ``i`` is epoch position ``i`` of ``epoch``."""
        return len(self.epochs) == 1 and self.original[0] and int(self.lo[0]) == 0

    def frontier(self, index: int) -> int:
        """The epoch position after the last position of the epoch's own order served before
        stream index ``index`` (0 if none); padding past the end serves nothing new."""
        front = 0
        for k, orig in enumerate(self.original):
            if orig and int(self.cum[k]) < index:
                front = int(self.lo[k]) + min(
                    index - int(self.cum[k]), int(self.hi[k] - self.lo[k])
                )
        return front

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(piece, epoch position)`` of stream indices ``index`` (int64, in ``[0, length)``)."""
        piece = np.searchsorted(self.cum, index, side="right") - 1
        return piece, self.lo[piece] + (index - self.cum[piece])


def merge_skip(skips: list[list[int]], start: int, stop: int) -> list[list[int]]:
    """``skips`` (sorted, disjoint, non-touching ranges) with ``[start, stop)`` added, merged."""
    out: list[list[int]] = []
    for a, b in skips:
        if b < start or a > stop:
            out.append([a, b])
        else:
            start, stop = min(a, start), max(b, stop)
    out.append([start, stop])
    out.sort()
    return out


def pieces(n: int, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Global positions ``[start, stop)`` as ``(epoch, lo, hi)`` pieces of single epochs."""
    first, last = start // n, (stop - 1) // n
    if last - first > _MAX_EPOCHS_SPANNED:
        raise ValueError(
            f"the range [{start}, {stop}) spans {last - first + 1} epochs of n={n}; at most "
            f"{_MAX_EPOCHS_SPANNED} may be replayed at once"
        )
    return [(e, max(start - e * n, 0), min(stop - e * n, n)) for e in range(first, last + 1)]


class EditLog:
    """The skips and replays of one sampler over ``range(n)``, and the streams they make."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.skips: list[list[int]] = []
        self.replays: list[list[int]] = []
        self._streams: dict[int, Stream] = {}
        self._starts: list[int] = []
        self._special: list[int] = []

    @classmethod
    def from_state(cls, n: int, skips: list[list[int]], replays: list[list[int]]) -> EditLog:
        """The log of a checked sampler state's ``skips`` and ``replays`` over ``range(n)``.

        Raises
        ------
        mmpack.errors.FormatError
            Edits of a sampler of no samples, or a replay that does not fit its epoch's stream.
        """
        edits = cls(n)
        edits.set(skips, replays)
        if n == 0 and not edits.empty:
            raise FormatError(f"sampler state of n=0 has edits {skips + replays}")
        try:
            for replay in edits.replays:
                edits.stream(replay[0])
        except ValueError as e:
            raise FormatError(f"sampler state field replays={replays!r}: {e}") from None
        return edits

    @property
    def empty(self) -> bool:
        return not self.skips and not self.replays

    def set(self, skips: list[list[int]], replays: list[list[int]]) -> None:
        self.skips, self.replays = [list(s) for s in skips], [list(r) for r in replays]
        self._streams.clear()
        n = self.n
        self._starts = [a for a, _ in self.skips]
        ends = {e for a, b in self.skips for e in (a // n, (b - 1) // n)} if n else set()
        self._special = sorted(ends | {int(r[0]) for r in self.replays})

    def length(self, epoch: int) -> int:
        """Length of epoch ``epoch``'s stream (``n`` without edits)."""
        return self.n if self.empty else self.stream(epoch).length

    def run(self, epoch: int) -> tuple[int, int | None]:
        """``(L, end)``: every epoch of ``[epoch, end)`` has a stream of length ``L`` (``end``
        None: every later epoch too).  Only the epochs holding a replay or an end of a skip
        have a stream of their own (``O(edits)`` of them); between two of them every epoch is
        whole (``L = n``) or inside a skip (``L = 0``).  O(log edits)."""
        k = bisect.bisect_left(self._special, epoch)
        if k < len(self._special) and self._special[k] == epoch:
            return self.stream(epoch).length, epoch + 1
        end = self._special[k] if k < len(self._special) else None
        j = bisect.bisect_right(self._starts, epoch * self.n) - 1
        inside = j >= 0 and self.skips[j][1] > epoch * self.n  # then it covers the whole epoch
        return (0 if inside else self.n), end

    def stream(self, epoch: int) -> Stream:
        got = self._streams.get(epoch)
        if got is None:
            got = self._build(epoch)
            if len(self._streams) >= 4:
                self._streams.clear()
            self._streams[epoch] = got
        return got

    def _skipped(self, epoch: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """The served parts of epoch positions ``[lo, hi)`` of ``epoch`` (skips removed)."""
        base = epoch * self.n
        k = bisect.bisect_right(self.skips, [base + lo, 2**200]) - 1
        out, at = [], lo
        for a, b in self.skips[max(k, 0) :]:
            a, b = a - base, b - base
            if a >= hi:
                break
            if b <= at:
                continue
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return out

    def _build(self, epoch: int) -> Stream:
        # raw pieces (epoch, lo, hi, belongs to the epoch's own order)
        raw: list[_Raw] = [(epoch, 0, self.n, True)] if self.n else []
        for e, at, start, stop in self.replays:
            if e == epoch:
                raw = _insert(raw, at, [(*p, False) for p in pieces(self.n, start, stop)])
        epochs, lo, hi, cum, raws, own = [], [], [], [0], [], []
        r = 0
        for e, a, b, orig in raw:
            for sa, sb in self._skipped(e, a, b):
                epochs.append(e)
                lo.append(sa)
                hi.append(sb)
                raws.append(r + sa - a)
                own.append(orig)
                cum.append(cum[-1] + sb - sa)
            r += b - a
        return Stream(
            epoch,
            tuple(epochs),
            np.array(lo, dtype=np.int64),
            np.array(hi, dtype=np.int64),
            np.array(cum, dtype=np.int64),
            np.array(raws, dtype=np.int64),
            tuple(own),
            r,
        )

    def samples(
        self, index: np.ndarray, epoch: int, sample_of: Callable[[np.ndarray, int], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
        """``(samples, epoch id of each or None, epochs)`` at stream indices ``index`` of
        ``epoch`` (int64, in ``[0, length)``); ``sample_of(positions, e)`` maps epoch positions of
        epoch ``e`` to samples.  Sample ``k`` was drawn for epoch ``epochs[ids[k]]`` (``epochs[0]``
        for every sample when ``ids`` is None)."""
        stream = None if self.empty else self.stream(epoch)
        if stream is None or stream.simple:
            return sample_of(index, epoch), None, [epoch]
        piece, positions = stream.locate(index)
        epochs = sorted(set(stream.epochs))
        if len(epochs) == 1:
            return sample_of(positions, epochs[0]), None, epochs
        ids = np.array([epochs.index(e) for e in stream.epochs], dtype=np.int64)[piece]
        out = np.empty_like(positions)
        for k, e in enumerate(epochs):
            mask = ids == k
            if mask.any():
                out[mask] = sample_of(np.ascontiguousarray(positions[mask]), e)
        return out, ids, epochs

    # -- where edits go ---------------------------------------------------------------------------

    def _check_range(self, start: Any, stop: Any, what: str) -> tuple[int, int]:
        start, stop = check_int(start, "start"), check_int(stop, "stop")
        if self.n == 0:
            raise ValueError(f"{what}({start}, {stop}): the sampler has no samples (n=0)")
        if not 0 <= start < stop <= 2**64 * self.n:
            raise ValueError(
                f"{what} needs 0 <= start < stop <= 2**64 * n, got start={start}, stop={stop}"
            )
        return start, stop

    def add_skip(self, start: Any, stop: Any, epoch: int, index: int) -> None:
        """Skip ``[start, stop)``, the ranks standing at stream index ``index`` of ``epoch``."""
        start, stop = self._check_range(start, stop, "skip")
        front = self.frontier(epoch, index)
        if start < front:
            raise ValueError(
                f"cannot skip [{start}, {stop}): global positions below {front} are already "
                f"consumed (epoch {epoch}, stream index {index})"
            )
        self.set(merge_skip(self.skips, start, stop), self.replays)

    def add_replay(self, start: Any, stop: Any, epoch: int, index: int, more: bool) -> None:
        """Replay ``[start, stop)`` at stream index ``index`` of ``epoch`` (``more``: this world
        size draws more of that epoch; else at the start of the next epoch)."""
        start, stop = self._check_range(start, stop, "replay")
        front = self.frontier(epoch, index)
        if stop > front:
            raise ValueError(
                f"cannot replay [{start}, {stop}): only consumed positions can be replayed, and "
                f"global positions from {front} on are not (epoch {epoch}, stream index {index})"
            )
        if stop - start > 2**62:
            raise ValueError(f"cannot replay [{start}, {stop}): more than 2**62 positions")
        pieces(self.n, start, stop)  # refuses a range over too many epochs
        if not more:
            epoch, index = epoch + 1, 0
        at = self.replay_at(epoch, index)
        self.set(self.skips, [*self.replays, [epoch, at, start, stop]])

    def frontier(self, epoch: int, index: int) -> int:
        """The global position after the last original position served before stream index
        ``index`` of ``epoch`` (``epoch * n`` if none): every position below it is consumed."""
        return epoch * self.n + self.stream(epoch).frontier(index)

    def replay_at(self, epoch: int, index: int) -> int:
        """Raw index of ``epoch``'s stream where a replay asked at stream index ``index`` goes:
        after every replay not fully served yet (replays queue in the order they were asked),
        before the rest of the epoch's own order."""
        stream = self.stream(epoch)
        if index >= stream.length:
            return stream.raw_length
        k = int(np.searchsorted(stream.cum, index, side="right")) - 1
        if stream.original[k]:
            return int(stream.raw[k]) + index - int(stream.cum[k])
        end = len(stream.original)
        while k < end and not stream.original[k]:  # the queue of replays still to serve
            k += 1
        return int(stream.raw[k]) if k < end else stream.raw_length


_Raw = tuple[int, int, int, bool]


def _insert(raw: list[_Raw], at: int, new: list[_Raw]) -> list[_Raw]:
    """``raw`` pieces with ``new`` inserted before raw index ``at``."""
    out, r = [], 0
    placed = False
    for e, a, b, orig in raw:
        if not placed and r + (b - a) > at:
            cut = a + (at - r)
            if cut > a:
                out.append((e, a, cut, orig))
            out += new
            placed = True
            if b > cut:
                out.append((e, cut, b, orig))
        else:
            out.append((e, a, b, orig))
        r += b - a
    if not placed:
        if at > r:
            raise ValueError(f"a replay at raw index {at} lies past the stream's end {r}")
        out += new
    return out
