"""Storage backends: where a store's two arrays live and how token ranges are read.

A backend is a small class with a narrow reading interface, so a new one (compressed, remote) is
little code:

- ``read_range(start, stop)``: one flat token range as a numpy array (the default reads it
  through ``read_ranges``; the memmap backend slices its mapping, the remote one copies);
- ``read_ranges(starts, lengths) -> (src, src_starts)``: many ranges at once, such that
  ``src[src_starts[k] : src_starts[k] + lengths[k]]`` holds range ``k``.  The memmap backend returns
  the mapped array itself (zero copy: kernels copy straight from the page cache); the Zarr backend
  coalesces the ranges into chunk-aligned reads and returns one buffer;
- ``offsets``: the int64 document index;
- optional, for cold data (defaults do nothing): ``advise(pattern)`` (``"random"``,
  ``"sequential"``, ``"normal"``: how the tokens will be read next), ``resident(positions)`` (a
  cheap "would these reads need I/O?" probe) and ``prefetch(starts, lengths)`` (start fetching
  ranges without waiting).  The views call ``prefetch`` with the ranges of the batch or sample
  they are about to read (the memmap backend's page requests; remote stores are fetched ahead
  by the block order instead, :mod:`mmpack._src.torch.block_fetch`).

Both backends are written the same way (raw little-endian files streamed into a temporary folder,
see :mod:`mmpack._src.store.reader`); ``commit`` turns that folder into the backend's own layout before the
atomic rename.
"""

from __future__ import annotations

from mmpack._src.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
from mmpack._src.store.backends._memmap import MemmapBackend
from mmpack._src.store.backends._zarr import ZarrBackend

__all__ = [
    "BACKENDS",
    "Backend",
    "MemmapBackend",
    "OFFSETS_FILE",
    "TOKENS_FILE",
    "ZarrBackend",
    "get_backend",
]

BACKENDS: dict[str, type[Backend]] = {"memmap": MemmapBackend, "zarr": ZarrBackend}


def get_backend(name: str) -> type[Backend]:
    """The backend class called ``name``; ``ValueError`` listing the accepted names otherwise."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"backend={name!r} is not one of {sorted(BACKENDS)}") from None
