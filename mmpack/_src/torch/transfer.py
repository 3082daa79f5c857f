"""Batches that cross from DataLoader workers cheaply: reused shared buffers, sent once.

A worker's batch reaches the training loop through a pickle: by default every tensor goes into
a *new* shared-memory segment (create, fault in, copy), its file descriptor is handed over by the
worker's resource-sharer thread, and the main process maps it and faults it in again.  What
:func:`share_batch` does instead, in a worker (:func:`mmpack.torch.collate` calls it on
every batch it makes there, so ``DataLoader(view, num_workers=k, collate_fn=collate)`` takes
this path with nothing to configure):

1. copy the batch's per-token tensors into **one** ``(fields, B, seqlen)`` buffer from the
   worker's pool of :data:`SLOTS` shared-memory buffers, reused once the main process has
   dropped every tensor of the batch it carried (steady state: no segment, no page fault);
2. send each buffer's descriptor **once**: the main process keeps the buffers it received (keyed
   by worker token, slot and generation) and later batches in that slot carry only the key;
3. send the small fields (boundaries, ``max_seqlen``, ``provenance``) by value in the pickle.

The main process rebuilds the same dict over a storage of its own; a ``weakref.finalize`` frees
the slot only when nothing at all views the batch, so what the loop keeps is never overwritten
(with no slot free the worker sends a fresh buffer, never reused; a value sharing the buffer
other than the per-token views keeps the slot busy for good).

Cost per batch, steady state: one copy of the per-token fields in the worker and a pickle of the
small fields and the key; without a worker the batch is returned unchanged.  Against torch's own
path: ``python -m benchmarks.bench_e2e --workers`` (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import secrets
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from mmpack._src.core.process import PerProcess

__all__ = ["SLOTS", "share_batch"]

SLOTS = 16
"""Reusable buffers per worker: more than the batches alive at once per worker (the
DataLoader's ``prefetch_factor`` plus those the loop holds); beyond them, fresh buffers."""

_FREE, _BUSY = 0, 1
_ACK = SLOTS  # column of the flags row: 1 once the main process holds the shared state
_SMALL_BYTES = 1 << 16  # tensors up to this size go by value inside the pickle

_REMOTES: dict[tuple[int, int], _Remote] = {}  # main process: token -> a worker's buffers


def share_batch(batch: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``batch`` ready to leave a DataLoader worker through a reused shared buffer.

    Parameters
    ----------
    batch : dict
        A batch; its CPU tensors under ``names`` of the first one's shape and dtype go in the
        buffer, the other values as they are (small tensors by value).
    names : sequence of str
        The per-token keys, in the order they are laid out in the buffer.

    Returns
    -------
    dict
        ``batch`` itself outside a worker; in a worker an equal dict (the per-token values views
        of one ``(len(names), B, seqlen)`` shared buffer) that pickles as described in the module
        docstring and unpickles as a plain dict.
    """
    if get_worker_info() is None:
        return batch
    present = [name for name in names if isinstance(batch.get(name), torch.Tensor)]
    if not present:
        return batch
    first = batch[present[0]]
    present = [name for name in present if _same_layout(batch[name], first)]
    pool = _POOL.get()
    slot, generation, buf = pool.acquire((len(present), *first.shape), first.dtype)
    for i, name in enumerate(present):
        buf[i].copy_(batch[name])
    views = [buf[i] for i in range(len(present))]
    by_name = dict(zip(present, views))
    items = {key: by_name.get(key, value) for key, value in batch.items()}
    return _SharedBatch(items, views, pool, slot, generation, buf)


class _Pool:
    """A worker's shared buffers by slot, and the shared state the main process writes.

    ``state[0, slot]`` is the slot's flag (free/busy), ``state[0, SLOTS]`` is 1 once the main
    process holds ``state``; ``state[1, slot]`` is the generation of the slot's buffer the main
    process holds (0: none).
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.token = (self.pid, secrets.randbits(62))
        self.state = torch.zeros(2, SLOTS + 1, dtype=torch.int64).share_memory_()
        self.buffers: dict[int, tuple[int, torch.Tensor]] = {}
        self.generations = 0

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int, torch.Tensor]:
        """``(slot, generation, buffer)``: a free buffer of this shape and dtype, marked busy;
        slot -1 for a fresh buffer outside the pool (every slot busy)."""
        flags = self.state[0].numpy()
        for slot, (generation, buf) in self.buffers.items():
            if flags[slot] == _FREE and buf.shape == shape and buf.dtype == dtype:
                flags[slot] = _BUSY
                return slot, generation, buf
        buf = torch.empty(shape, dtype=dtype).share_memory_()
        free = [slot for slot in range(SLOTS) if flags[slot] == _FREE]
        if not free:
            return -1, 0, buf
        slot = min(free, key=lambda s: s in self.buffers)  # an empty slot before a used one
        self.generations += 1
        self.buffers[slot] = (self.generations, buf)
        flags[slot] = _BUSY
        return slot, self.generations, buf


_POOL: PerProcess[_Pool] = PerProcess(_Pool)  # this worker process's pool


class _SharedBatch(dict):
    """The worker-side batch; pickles as ``_rebuild(...)`` (see the module docstring)."""

    def __init__(
        self,
        items: dict[str, Any],
        views: list[torch.Tensor],
        pool: _Pool,
        slot: int,
        generation: int,
        buf: torch.Tensor,
    ) -> None:
        super().__init__(items)
        self._views = views  # row i of the buffer (identity tells them apart from other values)
        self._ship = (pool, slot, generation, buf)

    def __copy__(self) -> _SharedBatch:
        # What torch's default_convert makes of the batch (DataLoader(..., batch_size=None)):
        # the same values, still sent through the buffer.
        pool, slot, generation, buf = self._ship
        return _SharedBatch(dict(self), self._views, pool, slot, generation, buf)

    def __reduce__(self) -> tuple[Any, ...]:
        pool, slot, generation, buf = self._ship
        by_id = {id(v): i for i, v in enumerate(self._views)}
        layout: list[tuple[str, int]] = []  # (key, row of the buffer or -1)
        others: dict[str, Any] = {}
        ptr = buf.untyped_storage().data_ptr()
        shares = False
        for key, value in self.items():
            row = by_id.get(id(value), -1)
            layout.append((key, row))
            if row < 0:
                others[key] = wired = _to_wire(value)
                # a value sent by value is a copy; one torch sends may map the buffer
                shares = shares or (not isinstance(wired, _Wire) and _shares(value, ptr))
        used = any(row >= 0 for _, row in layout)
        if slot >= 0 and not used and not shares:
            pool.state[0, slot] = _FREE  # nothing of this batch lives in the buffer
        if not used:
            return (_plain, (layout, others))
        if shares and slot >= 0:
            slot = -1  # the main process never frees it: the worker never reuses it
        state = None if pool.state[0, _ACK] else pool.state
        held = slot >= 0 and int(pool.state[1, slot]) == generation
        return (
            _rebuild,
            (pool.token, state, slot, generation, None if held else buf, layout, others),
        )


class _Remote:
    """What the main process holds of one worker: its shared state and the buffers it sent."""

    __slots__ = ("buffers", "state")

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state
        self.buffers: dict[int, tuple[int, torch.Tensor]] = {}


def _rebuild(
    token: tuple[int, int],
    state: torch.Tensor | None,
    slot: int,
    generation: int,
    buf: torch.Tensor | None,
    layout: list[tuple[str, int]],
    others: dict[str, Any],
) -> dict[str, Any]:
    if token[0] == os.getpid():  # unpickled where it was made (a deep copy): values of its own
        buf = buf if buf is not None else _POOL.get().buffers[slot][1]
        small = _from_wire_all(others)
        return {key: (buf[row].clone() if row >= 0 else small[key]) for key, row in layout}
    remote = _REMOTES.get(token)
    if remote is None and state is not None:
        _forget_exited_workers()
        remote = _REMOTES[token] = _Remote(state)
        state[0, _ACK] = 1
    if buf is None:  # the main process holds it: the worker saw the acknowledgement
        held = None if remote is None else remote.buffers.get(slot)
        if held is None or held[0] != generation:
            raise RuntimeError(
                f"a DataLoader worker (pid {token[0]}) sent a batch in its shared buffer {slot} "
                f"generation {generation}, which this process does not hold; was the batch "
                "unpickled in another process than the one its worker sends to?"
            )
        buf = held[1]
    elif slot >= 0 and remote is not None:
        remote.buffers[slot] = (generation, buf)
        remote.state[1, slot] = generation
    # The batch's memory gets a storage of its own: ``torch.from_numpy`` over a numpy alias of the
    # buffer, which that storage alone holds.  Whatever views the batch's memory holds this
    # storage (a tensor, its ``.numpy()``, a memoryview of that, a DLPack capsule, the storage
    # itself), so the alias is collected, and the slot freed, only when nothing views it.
    lease = buf.numpy()
    root = torch.from_numpy(lease)
    if slot >= 0 and remote is not None:
        weakref.finalize(lease, _release, remote.state, slot)
    small = _from_wire_all(others)
    return {key: (root[row] if row >= 0 else small[key]) for key, row in layout}


def _plain(layout: list[tuple[str, int]], others: dict[str, Any]) -> dict[str, Any]:
    small = _from_wire_all(others)
    return {key: small[key] for key, _ in layout}


def _release(state: torch.Tensor, slot: int) -> None:
    state[0, slot] = _FREE


def _forget_exited_workers() -> None:
    """Drop the buffers of workers whose process has exited (their batches are gone)."""
    for token in list(_REMOTES):
        try:
            os.kill(token[0], 0)
        except ProcessLookupError:
            del _REMOTES[token]
        except PermissionError:
            pass  # a live process (of another user, the pid reused): kept


def _same_layout(value: torch.Tensor, first: torch.Tensor) -> bool:
    return value.shape == first.shape and value.dtype == first.dtype and value.device.type == "cpu"


def _shares(value: Any, ptr: int) -> bool:
    values = value if isinstance(value, (tuple, list)) else (value,)
    return any(
        isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == ptr for v in values
    )


class _Wire:
    """A small tensor, or a tuple of small 1-D tensors of one dtype (``cu_seqlens_rows``), sent by
    value: one numpy array (pickled as bytes) and, for a tuple, the lengths to split it at."""

    __slots__ = ("array", "lengths")

    def __init__(self, array: np.ndarray, lengths: list[int] | None) -> None:
        self.array, self.lengths = array, lengths

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Wire, (self.array, self.lengths))

    def value(self) -> Any:
        tensor = torch.from_numpy(self.array)
        return tensor if self.lengths is None else tuple(tensor.split(self.lengths))


def _small(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and not value.requires_grad
        and value.untyped_storage().nbytes() <= _SMALL_BYTES
    )


def _to_wire(value: Any) -> Any:
    if _small(value):
        return _Wire(value.numpy(), None)
    if isinstance(value, dict) and value and all(map(_small, value.values())):
        return {k: _Wire(v.numpy(), None) for k, v in value.items()}  # e.g. a provenance
    if (
        isinstance(value, tuple)
        and value
        and all(_small(v) and v.ndim == 1 and v.dtype == value[0].dtype for v in value)
    ):
        return _Wire(torch.cat(value).numpy(), [int(v.shape[0]) for v in value])
    return value


def _from_wire_all(small: dict[str, Any]) -> dict[str, Any]:
    return {k: _from_wire(v) for k, v in small.items()}


def _from_wire(value: Any) -> Any:
    if isinstance(value, _Wire):
        return value.value()
    if isinstance(value, dict) and value and all(isinstance(v, _Wire) for v in value.values()):
        return {k: v.value() for k, v in value.items()}
    return value
