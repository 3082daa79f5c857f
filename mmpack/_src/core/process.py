"""State that belongs to one process: what must never cross ``fork``.

A forked child inherits its parent's memory but none of its threads: a lock a parent's thread
held stays held for ever in the child, a thread pool's workers are gone, a connection pool's
sockets and a mapping's claims are the parent's.  Every object that keeps such state (locks,
thread pools, connection pools, counts, mappings) keeps it in one :class:`PerProcess`, which makes
it afresh the first time each process asks for it (told apart by ``os.getpid()``) and is pickled
without it (a spawned process makes its own).  Module-level state is reset instead by an
``os.register_at_fork`` hook in its own module (numba's lock, the node cache's locks and
descriptors).

Cost: one ``os.getpid()`` and one comparison per :meth:`PerProcess.get`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``'s value, made once in each process that asks for it.

    Parameters
    ----------
    make : callable
        Makes the state (no argument); picklable where the owner is pickled (a class or a
        module-level function).
    """

    __slots__ = ("_make", "_pid", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._pid = -1
        self._value: T | None = None

    def get(self) -> T:
        """This process's state, made now if this process has none yet."""
        pid = os.getpid()
        if self._pid != pid:
            self._value = self._make()
            self._pid = pid
        return self._value  # type: ignore[return-value]

    def __getstate__(self) -> Callable[[], T]:
        return self._make

    def __setstate__(self, make: Callable[[], T]) -> None:
        self._make, self._pid, self._value = make, -1, None
