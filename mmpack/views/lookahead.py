"""Look-ahead for stores on object storage: fetch the next batches' tokens while this one trains.

The seam: the sampler knows the order (a pure function of seed, epoch and position), the view
knows the token ranges of a sample (``view.prefetch(indices)`` ->
``store.prefetch_ranges(starts, lengths)``), the store fetches them in the background.
:class:`LookaheadBatches` joins the two.  It wraps any iterable of index batches (e.g.
``torch.utils.data.BatchSampler(ResumableSampler(...), 32, False)``):

- ``num_workers=0`` (a plain loop, or a DataLoader without workers): before yielding batch
  ``b`` it calls ``view.prefetch`` on batches ``b+1 .. b+depth`` in this process;
- ``num_workers=W`` (a DataLoader's ``batch_sampler`` with ``W`` workers): the hints must reach
  the worker that will read those batches, so each yielded batch is a :class:`HintedBatch` (a
  list) carrying ``.ahead``, the next ``depth`` batches of the same worker (DataLoader deals
  batches to its workers round robin: ``b+W, b+2W, ...``); the views' ``__getitems__`` prefetch
  ``.ahead`` before reading.  A wrong guess costs bandwidth, never correctness.

Local memory-mapped stores ignore every hint.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["HintedBatch", "LookaheadBatches"]


class HintedBatch(list):
    """A batch of sample indices with ``ahead``: the indices the same reader will need next."""

    ahead: list[int]


class LookaheadBatches:
    """Yield the batches of ``batches`` unchanged, with the next ``depth`` batches hinted (see
    the module docstring for ``num_workers``)."""

    def __init__(self, view: Any, batches: Iterable[Any], depth: int = 4, *,
                 num_workers: int = 0) -> None:
        for name, value in (("depth", depth), ("num_workers", num_workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not callable(getattr(view, "prefetch", None)):
            raise TypeError(f"{type(view).__name__} has no prefetch(indices) method")
        self.view = view
        self.batches = batches
        self.depth = depth
        self.num_workers = num_workers

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers:
            yield from self._hinted()
            return
        ahead: deque[Any] = deque()
        for batch in self.batches:
            ahead.append(batch)
            self.view.prefetch(batch)
            if len(ahead) > self.depth:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()

    def _hinted(self) -> Iterator[HintedBatch]:
        w = self.num_workers
        window: deque[Any] = deque()
        it = iter(self.batches)
        exhausted = False
        while True:
            while not exhausted and len(window) <= w * self.depth:
                try:
                    window.append(next(it))
                except StopIteration:
                    exhausted = True
            if not window:
                return
            batch = HintedBatch(np.asarray(window.popleft()).tolist())
            same_worker = [window[k] for k in range(w - 1, len(window), w)][: self.depth]
            batch.ahead = [int(i) for b in same_worker for i in np.asarray(b).tolist()]
            yield batch
