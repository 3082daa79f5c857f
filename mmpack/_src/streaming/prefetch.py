"""Background prefetch: run an iterator in a thread, ``depth`` items ahead of the consumer.

A producer thread pulls items from the wrapped iterator and puts them into a bounded
``queue.Queue(maxsize=depth)``; the consumer takes them out.  Nothing polls with ``sleep``: both
sides block on the queue, with short timeouts only so that they notice a stop request (producer)
or a producer that died without a word (consumer).  mmpack's kernels release the GIL, so packing
in the thread overlaps with the training step in the main thread.

The producer ends with a sentinel after the last item, or with the exception the iterator raised,
which the consumer re-raises as is (its traceback still shows the producer's frames).  Stopping
early -- :meth:`Prefetcher.close`, leaving a ``with`` block, or dropping the last reference to
the prefetcher (the thread holds none, so garbage collection finalises it) -- sets a stop event
and drains the queue so that a producer blocked on a full queue wakes up; the producer then closes
the wrapped iterator (running a generator's ``finally`` blocks in the producer thread) and ends.
A producer stuck inside the wrapped iterator's ``__next__`` finishes that call first; ``close``
waits for it up to ``join_timeout`` seconds (the thread is a daemon, so it never blocks exit).

Cost: one queue put and get per item (a few microseconds), ``depth`` items of memory.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Prefetched", "Prefetcher"]

T = TypeVar("T")

_POLL_S = 0.05


class _End:
    """End-of-stream sentinel."""


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = _End()


def _produce(iterator: Iterator[Any], q: queue.Queue, stop: threading.Event) -> None:
    # Module-level on purpose: the thread must not reference the Prefetcher, so that dropping
    # the Prefetcher lets the garbage collector finalise it and stop this thread.
    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not stop.is_set():
            try:
                item = next(iterator)
            except StopIteration:
                put(_END)
                return
            except BaseException as exc:
                put(_Failure(exc))
                return
            if not put(item):
                return
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass


def _shutdown(
    q: queue.Queue, stop: threading.Event, thread: threading.Thread, join_timeout: float
) -> None:
    stop.set()
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            break
    if thread is not threading.current_thread():
        thread.join(join_timeout)


class Prefetcher(Generic[T]):
    """Iterate ``iterable`` in a background thread, keeping up to ``depth`` items ready.

    Parameters
    ----------
    iterable : Iterable
        Iterated once (``iter(iterable)`` is called in the constructor).
    depth : int, default 2
        Maximum number of ready items held, ``>= 1``.
    join_timeout : float, default 5.0
        Seconds :meth:`close` waits for the thread to end.

    Notes
    -----
    A one-pass iterator, like a generator; use :class:`Prefetched` for a re-iterable wrapper.
    Use it as a context manager, or call :meth:`close` when stopping early; dropping the last
    reference also stops the thread.  An exception raised by the wrapped iterator is re-raised by
    ``next()`` in the consumer, after the items produced before it.
    """

    def __init__(self, iterable: Iterable[T], depth: int = 2, *, join_timeout: float = 5.0) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        if not join_timeout >= 0:
            raise ValueError(f"join_timeout must be >= 0 seconds, got {join_timeout!r}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce,
            args=(iter(iterable), self._queue, self._stop),
            name="mmpack-prefetch",
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(
            self, _shutdown, self._queue, self._stop, self._thread, join_timeout
        )

    @property
    def thread(self) -> threading.Thread:
        """The producer thread (for monitoring; it ends after the last item, an error or close)."""
        return self._thread

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if self._stop.is_set():
                    self._done = True
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the prefetch thread ended without a result") from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        """Stop the producer and wait for its thread to end (idempotent)."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Prefetched(Generic[T]):
    """Re-iterable wrapper: every ``iter()`` starts a new :class:`Prefetcher` over the iterable.

    Handy around a :class:`~mmpack.StreamingPacker`, whose every ``iter()`` is an epoch.
    """

    def __init__(self, iterable: Iterable[T], depth: int = 2) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        self.iterable = iterable
        self.depth = depth

    def __iter__(self) -> Prefetcher[T]:
        return Prefetcher(self.iterable, self.depth)
