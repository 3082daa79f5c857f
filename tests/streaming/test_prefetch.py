"""Background prefetch: order, bounded depth, clean early stop, error propagation."""

from __future__ import annotations

import gc
import threading
import traceback

import pytest

from mmpack._src.streaming.prefetch import Prefetched, Prefetcher


def test_yields_everything_in_order():
    with Prefetcher(range(100), depth=3) as p:
        assert list(p) == list(range(100))
    assert not p.thread.is_alive()
    assert list(Prefetcher([], depth=1)) == []


def test_depth_bounds_read_ahead():
    pulled = []

    def gen():
        for i in range(50):
            pulled.append(i)
            yield i

    p = Prefetcher(gen(), depth=2)
    assert next(p) == 0
    p.thread.join(0.3)  # the producer is blocked on the full queue, not finished
    assert p.thread.is_alive()
    # consumed 1, queue holds 2, producer holds at most 1 more
    assert len(pulled) <= 4
    p.close()
    assert not p.thread.is_alive()


def test_close_stops_thread_and_closes_generator():
    finalized = threading.Event()

    def gen():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            finalized.set()

    p = Prefetcher(gen(), depth=2)
    assert [next(p) for _ in range(5)] == [0, 1, 2, 3, 4]
    p.close()
    assert not p.thread.is_alive()
    assert finalized.is_set()
    with pytest.raises(StopIteration):
        next(p)
    p.close()  # idempotent


def test_context_manager_early_exit():
    def endless():
        while True:
            yield 1

    with Prefetcher(endless(), depth=4) as p:
        next(p)
        thread = p.thread
    assert not thread.is_alive()


def test_garbage_collection_stops_thread():
    def endless():
        while True:
            yield 1

    p = Prefetcher(endless(), depth=2)
    next(p)
    thread = p.thread
    del p
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_consumer_generator_closed_early():
    def endless():
        while True:
            yield 1

    threads = []

    def consumer():
        with Prefetcher(endless(), depth=2) as p:
            threads.append(p.thread)
            yield from p

    g = consumer()
    next(g)
    g.close()
    assert not threads[0].is_alive()


def test_producer_error_is_reraised_with_its_traceback():
    def failing_producer():
        yield 1
        yield 2
        raise KeyError("boom")

    p = Prefetcher(failing_producer(), depth=2)
    assert next(p) == 1 and next(p) == 2
    with pytest.raises(KeyError, match="boom") as info:
        next(p)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_producer" in frames
    assert not p.thread.is_alive()
    with pytest.raises(StopIteration):
        next(p)


def test_invalid_depth():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="depth"):
            Prefetcher([], depth=bad)


def test_prefetched_is_reiterable():
    wrapped = Prefetched(range(5), depth=2)
    assert list(wrapped) == list(range(5))
    assert list(wrapped) == list(range(5))
