"""``PerProcess`` (``mmpack/_src/core/process.py``): made once per process, afresh in a forked child,
pickled without its value."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading

from mmpack._src.core.process import PerProcess


class _State:
    made = 0

    def __init__(self) -> None:
        _State.made += 1
        self.pid = os.getpid()
        self.lock = threading.Lock()


class _Owner:
    """An owner whose factory is its own bound method (a reference cycle when pickled)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.state = PerProcess(self._make)

    def _make(self) -> tuple[int, int]:
        return self.n, os.getpid()


def test_the_value_is_made_once_in_a_process():
    before = _State.made
    p = PerProcess(_State)
    assert _State.made == before  # made on first use, not before
    first = p.get()
    assert p.get() is first and _State.made == before + 1
    assert first.pid == os.getpid()


def _in_child(p: PerProcess, parent_value: _State, out: mp.Queue) -> None:
    value = p.get()
    out.put((p.get() is value, value is parent_value, value.pid, os.getpid(),
             value.lock.acquire(timeout=1)))  # fmt: skip


def test_a_forked_child_makes_its_own_even_while_the_parent_holds_the_lock():
    p = PerProcess(_State)
    mine = p.get()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with mine.lock:  # held in the parent across the fork: the child's own lock is free
        child = ctx.Process(target=_in_child, args=(p, mine, out))
        child.start()
        got = out.get(timeout=60)
        child.join(timeout=60)
    seen, same, value_pid, child_pid, acquired = got
    assert seen and not same and value_pid == child_pid != os.getpid() and acquired
    assert p.get() is mine  # the parent keeps its own


def test_pickled_without_its_value_and_with_its_owner():
    p = PerProcess(_State)
    mine = p.get()
    q = pickle.loads(pickle.dumps(p))
    assert q.get() is not mine and isinstance(q.get(), _State)
    owner = _Owner(7)
    assert owner.state.get() == (7, os.getpid())
    copy = pickle.loads(pickle.dumps(owner))
    assert copy.state._value is None and copy.state.get() == (7, os.getpid())
    copy.n = 8
    assert owner.state.get() == (7, os.getpid())  # the copy's factory is the copy's own
