"""Batches that cross from DataLoader workers cheaply: one reused shared-memory buffer per batch.

Where the time goes.  A worker's batch reaches the training loop through a pickle: every tensor
is moved into a *new* shared-memory segment (``share_memory_``: create, fault in every page, copy)
and re-mapped by the main process (fault in every page again); small tensors pay a segment each.
On the 2-core machine this was written on, three int64 ``(32, 2048)`` tensors per batch through 2
workers deliver about 6-12 Mtok/s whatever the dataset does (the *naive floor*), against
~150-190 Mtok/s for mmpack with no worker.

What :class:`SharedCollator` does instead, per batch, in the worker:

1. collate as :func:`mmpack.torch.collate.collate` (same keys, same values), with ``dtype=``
   (``torch.int32`` halves the bytes);
2. copy the per-token fields into **one** ``(fields, B, seqlen)`` buffer taken from a per-worker
   pool of shared-memory buffers: a buffer is reused once the main process has dropped every
   tensor of the batch it carried, so in steady state no segment is created and no page of the
   worker's side faults;
3. send the small fields (boundaries, ``max_seqlen``) by value inside the pickle (no segment).

The main process rebuilds the same dict (the per-token tensors are views of the one buffer) and
arms a ``weakref.finalize`` on the buffer: when the last of those views is collected, a flag in a
small shared array marks the buffer free for its worker.  A batch the training loop still holds
is therefore never overwritten; when none is free the worker allocates another buffer (up to
``slots`` per worker, then fresh untracked buffers).  ``pin_memory=True`` copies the batch to
pinned memory and drops the shared one at once, which frees it early.

With no worker (``num_workers=0``) it is :func:`collate` with ``dtype``: nothing is shared.
Measured figures (``python -m benchmarks.bench_e2e --workers``) are in the README.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from mmpack.torch.collate import BATCH_TOKEN_FIELDS, Collator

__all__ = ["SharedCollator"]

_FREE, _BUSY = 0, 1
_MAX_WORKERS = 256
_FLAGS: dict[tuple[int, int], torch.Tensor] = {}  # (pid, serial) of the collator -> its flags
_SERIAL = itertools.count()


class SharedCollator:
    """A :class:`~mmpack.torch.collate.Collator` whose batches leave workers in reused shared buffers.

    Parameters
    ----------
    dtype : torch.dtype, default torch.int64
        Dtype of the per-token tensors (``torch.int32`` halves the transfer).
    slots : int, default 16
        Reusable buffers per worker (beyond them, batches get fresh buffers, never reused).  Needs
        to exceed the batches alive at once per worker: ``prefetch_factor`` plus those the loop
        holds.
    **collate_options
        ``varlen``, ``pad_to_multiple_of``, ``pad_id``, ``ignore_index``: as for
        :class:`~mmpack.torch.collate.Collator`.

    Returns (``__call__``)
    ----------------------
    dict
        Exactly what :func:`mmpack.torch.collate.collate` returns (per-token tensors of ``dtype``),
        the per-token tensors being views of one ``(fields, B, seqlen)`` tensor.
    """

    def __init__(
        self, *, dtype: torch.dtype = torch.int64, slots: int = 16, **collate_options: Any
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got slots={slots!r}")
        self._collator = Collator(dtype=dtype, **collate_options)
        self.dtype = dtype
        self.slots = int(slots)
        self._pool: _Pool | None = None
        # The free/busy flags of every worker's buffers, made here in the main process: workers
        # inherit them (fork) or receive them once (spawn); batches carry only this key.
        self._key = (os.getpid(), next(_SERIAL))
        self._flags = torch.zeros(_MAX_WORKERS, self.slots, dtype=torch.int32).share_memory_()
        _FLAGS[self._key] = self._flags

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # each worker process builds its own
        return state

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        out = self._collator(samples)
        info = get_worker_info()
        if info is None:
            return out  # main process: nothing crosses a process boundary
        worker = int(info.id)
        if self._pool is None:
            tracked = worker < _MAX_WORKERS
            self._pool = _Pool(
                self._flags[worker] if tracked else torch.zeros(self.slots, dtype=torch.int32)
            )
        names = [k for k in BATCH_TOKEN_FIELDS if k in out]
        if not names:
            return out
        first = out[names[0]]
        buf, slot = self._pool.acquire((len(names), *first.shape), self.dtype)
        for i, name in enumerate(names):
            buf[i].copy_(out.pop(name))
        small = {key: _to_wire(value) for key, value in out.items()}
        return _SharedBatch(
            buf, names, small, (*self._key, worker, slot if worker < _MAX_WORKERS else -1)
        )


class _Pool:
    """A worker's shared buffers (by slot) and its row of the shared free/busy flags.

    A slot is taken only while its flag is free: a slot still busy with a batch of an earlier
    worker of the same id (non-persistent workers) is left alone until the main process frees it.
    """

    def __init__(self, flags: torch.Tensor) -> None:
        self.flags = flags
        self.buffers: dict[int, torch.Tensor] = {}

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        flags = self.flags.numpy()
        for slot, buf in self.buffers.items():
            if flags[slot] == _FREE and buf.shape == shape and buf.dtype == dtype:
                flags[slot] = _BUSY
                return buf, slot
        buf = torch.empty(shape, dtype=dtype).share_memory_()
        free = np.flatnonzero(flags == _FREE)
        if free.size:
            slot = int(free[0])
            self.buffers[slot] = buf
            flags[slot] = _BUSY
            return buf, slot
        return buf, -1  # every slot busy: a buffer that is never reused


class _SharedBatch(dict):
    """The worker-side batch; unpickles in the main process as a plain dict (see module doc)."""

    def __init__(
        self,
        buf: torch.Tensor,
        names: list[str],
        small: dict[str, Any],
        where: tuple[int, int, int, int],
    ) -> None:
        super().__init__({name: buf[i] for i, name in enumerate(names)}, **_from_wire_all(small))
        self._wire = (buf, names, small, where)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self._wire)


def _rebuild(
    buf: torch.Tensor, names: list[str], small: dict[str, Any], where: tuple[int, int, int, int]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: buf[i] for i, name in enumerate(names)
    }  # views: they keep buf alive
    out.update(_from_wire_all(small))
    pid, serial, worker, slot = where
    flags = _FLAGS.get((pid, serial))
    if flags is not None and slot >= 0:  # else: nobody here can free it; the worker never reuses it
        weakref.finalize(buf, _release, flags, worker, slot)
    return out


def _release(flags: torch.Tensor, worker: int, slot: int) -> None:
    flags[worker, slot] = _FREE


class _Wire:
    """A small tensor (or tuple of tensors) sent by value: numpy arrays pickle as bytes."""

    __slots__ = ("arrays", "is_tuple")

    def __init__(self, arrays: list[np.ndarray], is_tuple: bool) -> None:
        self.arrays, self.is_tuple = arrays, is_tuple

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Wire, (self.arrays, self.is_tuple))


def _to_wire(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Wire([value.numpy()], False)
    if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
        return _Wire([v.numpy() for v in value], True)
    return value


def _from_wire_all(small: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in small.items():
        if isinstance(value, _Wire):
            tensors = [torch.from_numpy(a) for a in value.arrays]
            value = tuple(tensors) if value.is_tuple else tensors[0]
        out[key] = value
    return out
