"""Look-ahead for stores on object storage: fetch the next batches' tokens while this one trains.

The seam: the sampler knows the order (a pure function of seed, epoch and position), the view
knows the token ranges of a sample (``view.prefetch(indices)`` ->
``store.prefetch_ranges(starts, lengths)``), the store fetches them in the background.
:class:`LookaheadBatches` joins the two: it wraps any iterable of index batches (e.g.
``torch.utils.data.BatchSampler(ResumableSampler(...), 32, False)``) and, before yielding batch
``b``, hints batches ``b+1 .. b+depth``.  Use it as a loop's batch source or as a DataLoader's
``batch_sampler`` with ``num_workers=0`` (the hints go to the process that reads; a DataLoader
worker does not see the main process's hints).  Local memory-mapped stores ignore the hints.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["LookaheadBatches"]


class LookaheadBatches:
    """Yield the batches of ``batches`` unchanged, prefetching the next ``depth`` of them
    through ``view.prefetch``."""

    def __init__(self, view: Any, batches: Iterable[Any], depth: int = 4) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"depth must be a non-negative integer, got {depth!r}")
        if not callable(getattr(view, "prefetch", None)):
            raise TypeError(f"{type(view).__name__} has no prefetch(indices) method")
        self.view = view
        self.batches = batches
        self.depth = depth

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.batches)
        ahead: deque[Any] = deque()
        for batch in it:
            ahead.append(batch)
            self.view.prefetch(batch)
            if len(ahead) > self.depth:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()
