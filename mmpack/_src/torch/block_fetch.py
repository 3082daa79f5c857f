"""One fetch per block: a block-window order drives whole-block fetches of a remote store.

With ``ResumableSampler(shuffle="blocks", block_bounds=view.block_bounds(B))`` the sampler
knows, for every epoch, which blocks each window reads and in which order it first needs them.
:class:`WindowFetcher` turns that into transport: when the loop stands in window ``w``, the blocks
of ``w`` and of the window after it are fetched as whole token spans, in the order the window
first needs them, into the node cache by :class:`~mmpack._src.remote.spans.SpanFetcher` (parts of a
few MiB fetched concurrently and checked).  The two windows are pinned; a window the loop left is
dropped by the last process of the node to leave it, so the node cache holds about two windows
and every block is fetched once per node per epoch (other processes and workers read it there).

Who drives it: a :class:`~mmpack.ResumableSampler` made over a view of a remote
store with a node cache (as :func:`~mmpack.torch.loader` and
:class:`~mmpack.Stages` make theirs) makes one (:meth:`WindowFetcher.auto`) and
runs every iterator it hands out through :meth:`WindowFetcher.drive`, in the process that
iterates the sampler, so any loop over it (a plain DataLoader, HF Trainer, Lightning) fetches
whole blocks.  The sampler draws ahead of the loop (``prefetch_factor * num_workers`` batches),
so it leaves window ``w`` only half-way through ``w + 1``; a read landing in a dropped block is
fetched again (small verified ranges), never read as a hole.

Cost per window, in this process: one :meth:`BlockOrder.map` of its positions, one sort of their
block ids, one ``token_span`` and one ``fcntl`` per block; the transfer and the drops run in two
background threads, the parts of the window the loop stands in first (``python -m
benchmarks.bench_block_fetch``).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any

import numpy as np

from mmpack._src.core.sample_order import reads_remotely
from mmpack.errors import SlowReadWarning

__all__ = ["WindowFetcher"]

Key = tuple[int, int]  # (epoch, window)

_WARNED: set[tuple[str, str]] = set()  # (store URL, way of reading) warned of in this process

_STEP = 64
"""Indices drawn between two looks at the window the sampler stands in (a look: ~10 us)."""

_QUEUE_WAIT = 60.0
"""The longest a window's fetch waits for the window before it to queue its parts (a claim and
a few thousand submissions: milliseconds; the wait only orders the two)."""

_CLAIM_WAIT = 30.0
"""The longest the draws wait, as they enter the next window, for its blocks to be claimed (so
that the reads of its first samples wait for its parts instead of fetching small ranges; the
claim follows the current window's: milliseconds unless the machine is starved)."""


class WindowFetcher:
    """Whole blocks of the current and next window of ``sampler`` fetched into ``view``'s node
    cache (see the module docstring).

    Parameters
    ----------
    view : WindowDataset or PackedDataset
        Over a remote store opened with ``cache_limit`` (its ``store.span_fetcher``), with
        ``token_span(lo, hi)``.
    sampler : ResumableSampler
        With ``shuffle="blocks"`` over (about) ``view.block_bounds(B)``.

    Raises
    ------
    ValueError
        The sampler has no block-window order, or the view's store no span fetcher (a local
        store, or a remote one opened without a node cache).
    """

    def __init__(self, view: Any, sampler: Any) -> None:
        order = sampler.block_order
        if order is None:
            raise ValueError(
                f"WindowFetcher needs a sampler with shuffle='blocks', got shuffle="
                f"{sampler.shuffle!r}"
            )
        spans = getattr(getattr(view, "store", None), "span_fetcher", None)
        if spans is None or not callable(getattr(view, "token_span", None)):
            raise ValueError(
                f"WindowFetcher needs a view over a remote store opened with a cache_limit, got "
                f"{type(view).__name__}"
            )
        self.view, self.sampler, self.order, self.spans = view, sampler, order, spans
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[Key, list[tuple[int, int]]] = {}
        self._jobs: dict[Key, Future[int]] = {}
        self._queued: dict[Key, threading.Event] = {}  # set once a window's parts are queued
        self._claimed: dict[Key, threading.Event] = {}  # set once a window's blocks are claimed
        self._pool: ThreadPoolExecutor | None = None
        self._drops: list[Future[int]] = []  # drops of windows left behind, under way
        self._found = (-1, 0, 0, 0)  # (epoch, first position, end, window) last found
        self._base = self._first = 0
        self._epoch = -1
        self.current: Key | None = None
        """The window the loop stands in (None before :meth:`start`)."""

    def __getstate__(self) -> dict[str, Any]:
        """A copy (a pickled or deep-copied sampler's) holds no window, lock or thread."""
        return {"view": self.view, "sampler": self.sampler, "order": self.order}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.view, self.sampler, self.order = state["view"], state["sampler"], state["order"]
        self.spans = self.view.store.span_fetcher
        self._setup()

    @classmethod
    def auto(cls, view: Any, sampler: Any) -> WindowFetcher | None:
        """A fetcher where one applies (a block-window sampler over a view of a remote store
        with a node cache), else None; a remote store read in a way that cannot fetch whole
        blocks (the global order; the block order without a node cache) is warned of once
        (:class:`~mmpack.errors.SlowReadWarning`, naming the fix)."""
        if getattr(sampler, "block_order", None) is None:
            if sampler.shuffle is True:
                _warn_slow(view, "global")
            return None
        if getattr(getattr(view, "store", None), "span_fetcher", None) is None:
            _warn_slow(view, "blocks")
            return None
        if not callable(getattr(view, "token_span", None)):
            return None
        fetcher = cls(view, sampler)
        _warn_small_cache(view, fetcher.order, fetcher.spans)
        return fetcher

    # ------------------------------------------------------------------------------ windows
    def window_spans(self, epoch: int, window: int) -> list[tuple[int, int]]:
        """Token spans ``(start, stop)`` of the blocks of ``window`` of ``epoch``, in the order
        the window's positions first need them."""
        order = self.order
        offsets = order.window_offsets(epoch)
        positions = np.arange(int(offsets[window]), int(offsets[window + 1]), dtype=np.int64)
        samples = order.map(positions, epoch)
        blocks = np.searchsorted(order.bounds, samples, side="right") - 1
        ids, first = np.unique(blocks, return_index=True)
        bounds = order.bounds
        return [
            self.view.token_span(int(bounds[j]), int(bounds[j + 1]))
            for j in ids[np.argsort(first)].tolist()
        ]

    def _next(self, key: Key) -> Key:
        epoch, w = key
        return (epoch, w + 1) if w + 1 < self.order.n_windows else (epoch + 1, 0)

    def _window_at(self, position: int) -> tuple[int, int, int]:
        """``(epoch, window, epoch position)`` of the rank's ``position``-th index of the pass
        (counted from its start)."""
        stream = self.sampler.stream(self._epoch)  # the epoch's positions after skips/replays
        k = self._first + position
        g = int(self.sampler.dealing.stream_index(k, k + 1, self._base)[0])
        g = min(g, stream.length - 1)  # padding past the end wraps to the start: stay at the end
        epoch = self._epoch
        if g < 0:  # an epoch whose every position is skipped
            return epoch, 0, 0
        if not stream.simple:  # stream index g -> (epoch, epoch position) of what it serves
            piece, at = stream.locate(np.array([max(g, 0)], np.int64))
            epoch, g = int(stream.epochs[int(piece[0])]), int(at[0])
        return epoch, self._window_of(g, epoch), g

    def _window_of(self, g: int, epoch: int) -> int:
        """The window of epoch position ``g`` (the last one found is kept: a batch's position
        mostly lies in it)."""
        e, lo, hi, w = self._found
        if e == epoch and lo <= g < hi:
            return w
        offsets = self.order.window_offsets(epoch)
        w = int(np.searchsorted(offsets, g, side="right")) - 1
        self._found = (epoch, int(offsets[w]), int(offsets[w + 1]), w)
        return w

    # ------------------------------------------------------------------------------ driving
    def drive(self, indices: Iterator[Any]) -> Iterator[Any]:
        """``indices`` (a pass of the sampler, not drawn from yet) as they are drawn, the
        windows fetched and dropped as the draws go: :meth:`start` at the first draw, then a
        look every :data:`_STEP` indices at the window the draws stand in (:meth:`follow`)."""
        self.start()
        if not self.order.n_blocks:
            yield from indices
            return
        count = look = 0
        for index in indices:
            if count == look:
                look += _STEP
                self.follow(count)
            count += 1
            yield index

    def start(self) -> None:
        """A pass of the sampler begins (call before the first index is drawn): where it starts
        is read from ``sampler.state_dict()``; the first window's blocks are claimed before
        this returns (readers then wait for their parts instead of fetching small ranges)."""
        state = self.sampler.state_dict()
        self._epoch, self._first, self._base = state["epoch"], state["position"], state["offset"]
        if self.order.n_blocks:
            epoch, w, _ = self._window_at(0)
            self._goto((epoch, w), wait_claim=True)

    def follow(self, count: int) -> None:
        """The sampler is about to hand out the index after the first ``count`` of the pass:
        where it stands in the window after the current one, wait (at most :data:`_CLAIM_WAIT`)
        for that window's blocks to be claimed, then move there (drop the current one, fetch
        the one after) once it is half-way through it (the loop's reads lag the draws, see the
        module docstring); a jump elsewhere (a skip, a replay) moves at once."""
        if not self.order.n_blocks or self.current is None:
            return
        epoch, w, g = self._window_at(count)
        key = (epoch, w)
        if key == self.current:
            return
        if key == self._next(self.current):
            claimed = self._claimed.get(key)
            if claimed is not None and not claimed.is_set():  # the reads are about to enter it
                claimed.wait(_CLAIM_WAIT)
            offsets = self.order.window_offsets(epoch)
            lo, hi = int(offsets[w]), int(offsets[w + 1])
            if g - lo < (hi - lo) // 2:  # the reads may still stand in the current window
                return
        self._goto(key, wait_claim=False)

    def close(self) -> None:
        """Unpin and drop every window this fetcher holds (nothing another process pins), and
        wait for the drops under way."""
        with self._lock:
            keys = list(self._live)
        for key in keys:
            self._release(key)
        for job in self._drops:
            job.result(60.0)
        self._drops.clear()
        self.current = None

    def _goto(self, key: Key, wait_claim: bool) -> None:
        wanted = [key, self._next(key)]
        with self._lock:
            gone = [k for k in self._live if k not in wanted]
        if self._pool is None:
            self.spans.warm()  # the threads' kernels compiled here: no thread compiles
            # two threads: the next window's parts queue right behind the current one's
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="mmpack-window")
        pool = self._pool
        self._drops = [job for job in self._drops if not job.done()]
        drops = [pool.submit(self.spans.drop, spans) for spans in map(self._unpin, gone)]
        self._drops.extend(drops)
        self.current = key
        before: threading.Event | None = None
        for k in wanted:
            with self._lock:
                if k in self._live:
                    before = self._queued.get(k)
                    continue
                spans = self.window_spans(*k)
                self._live[k] = spans
                queued = self._queued[k] = threading.Event()
            self.spans.pin(k, spans)
            claimed = self._claimed[k] = threading.Event()
            self._jobs[k] = pool.submit(self._fetch, k, spans, claimed, queued, before, drops)
            before = queued
            if wait_claim and k == key:
                claimed.wait(30.0)

    def _fetch(
        self,
        key: Key,
        spans: list[tuple[int, int]],
        claimed: threading.Event,
        queued: threading.Event,
        before: threading.Event | None,
        after: list[Future],
    ) -> int:
        """The background job of one window: once the windows left before it are dropped (the
        cache never holds more than two) and the window before it has queued its parts (``before``:
        its parts go out first, where the two would otherwise interleave and the loop wait for
        both), fetch it unless it was left meanwhile (then drop what it stored)."""
        try:
            for job in after:  # submitted before this one: running or done, never queued
                job.result()
            if before is not None:
                before.wait(_QUEUE_WAIT)  # set by that job's end at the latest
            with self._lock:
                if key not in self._live:
                    return 0
            return int(self.spans.fetch(spans, claimed=claimed, queued=queued))
        finally:
            claimed.set()
            queued.set()
            with self._lock:
                left = key not in self._live
            if left:
                self.spans.drop(spans)

    def _unpin(self, key: Key) -> list[tuple[int, int]]:
        """Leave window ``key``: forget it and release its pins; returns its spans (to drop)."""
        with self._lock:
            spans = self._live.pop(key, [])
            self._queued.pop(key, None)
            self._claimed.pop(key, None)
        self.spans.unpin(key)
        return spans

    def _release(self, key: Key) -> None:
        self.spans.drop(self._unpin(key))

    @property
    def live(self) -> list[Key]:
        """The windows this fetcher holds (pinned) now."""
        with self._lock:
            return list(self._live)

    def wait(self, timeout: float = 60.0) -> None:
        """Wait for the fetches under way (errors surface here; readers meet them too)."""
        for job in list(self._jobs.values()) + list(self._drops):
            job.result(timeout)


def _warn_slow(view: Any, way: str) -> None:
    """Warn once per process, store and ``way`` (``"global"``, ``"blocks"``) where ``view``
    reads remotely (:func:`~mmpack._src.core.sample_order.reads_remotely`: its store declares itself
    ``remote``, or a mixture's sources all do) in a way that cannot fetch whole blocks."""
    if not reads_remotely(view):
        return
    store = getattr(view, "store", None)
    if store is None:
        url = f"a mixture of {len(view.sources)} remote sources"
    else:
        url = str(store.location)
    if (url, way) in _WARNED:
        return
    _WARNED.add((url, way))
    if way == "global":
        if store is None:
            fix = "build the mixture with block_bytes and leave shuffle to its default"
        elif callable(getattr(view, "block_bounds", None)):
            fix = "leave shuffle to its default (the block order) to fetch whole blocks"
        else:  # a view without block bounds (e.g. MegatronGPTDataset) has no block order
            fix = "read it through a WindowDataset or PackedDataset in the block order"
        message = (
            f"mmpack: {url} is read in the global shuffled order: every sample is a small range "
            f"request, 20-300x slower than the block order; {fix}"
        )
    else:
        message = (
            f"mmpack: shuffle='blocks' over {url} cannot fetch whole blocks: that needs the view "
            "of one remote store (not a mixture, a subset or a join) with a node cache (a "
            "writable cache_dir, cache_limit not 0)"
        )
    warnings.warn(message, SlowReadWarning, stacklevel=_user_level())


def _warn_small_cache(view: Any, order: Any, spans: Any) -> None:
    """Warn once per process, store, window and limit where two windows of ``order`` need more
    bytes than ``view``'s node cache may hold: blocks would then be dropped before the window
    reads them and fetched again.  Two windows hold about ``2 W / B`` of the store's token bytes
    (``W`` blocks a window, ``B`` blocks), all of it when ``2 W >= B``."""
    store = view.store
    limit = int(spans.fetcher.node.cache.limit)
    total = int(store.num_tokens) * store.dtype.itemsize
    blocks, w = max(1, order.n_blocks), order.window_blocks
    need = min(total, -(-2 * w * total // blocks))
    key = (str(store.location), f"room {w} {limit}")
    if need <= limit or key in _WARNED:
        return
    _WARNED.add(key)
    fit = limit * blocks // (2 * total)
    fix = f"open the store with cache_limit >= {need}"
    if fit >= 1:
        fix += f" or read it with window_blocks <= {fit}"
    warnings.warn(
        f"mmpack: two windows of the block order over {store.location} hold about "
        f"{need / 2**20:,.1f} MiB ({min(2 * w, blocks)} blocks of about "
        f"{total / blocks / 2**20:,.1f} MiB) but its node cache may hold {limit / 2**20:,.1f} "
        f"MiB: blocks would be dropped before their window reads them and fetched again; {fix}",
        SlowReadWarning,
        stacklevel=_user_level(),
    )


def _user_level() -> int:
    """The ``stacklevel`` of the first frame outside the mmpack package, counted from the
    caller (``loader()``'s caller, or the caller of ``ResumableSampler(...)``)."""
    here = os.path.abspath(__file__)  # mmpack/_src/torch/block_fetch.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(here))) + os.sep
    frame: FrameType | None = sys._getframe(1)  # stacklevel 1: _warn_slow itself
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level
