"""The store layer: the on-disk format, storage backends, reading (:func:`open_store`,
:class:`TokenStore`) and atomic writing (:func:`build`, :class:`StoreWriter`).

::

    format.py      metadata record, little-endian dtypes, block checksums, fingerprint
    backends/      where the two arrays live (memmap, Zarr v3) behind one reading interface
    reader.py      open_store / TokenStore: validated at open, memory-mapped, picklable
    writer.py      build / StoreWriter: streaming, validated, published atomically
"""

from __future__ import annotations

from mmpack.store.reader import TokenStore, open_store
from mmpack.store.writer import StoreWriter, build

__all__ = ["StoreWriter", "TokenStore", "build", "open_store"]
