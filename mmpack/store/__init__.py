"""The store layer: the on-disk format, storage backends, reading (:func:`open_store`,
:class:`TokenStore`) and atomic writing (:func:`build`, :class:`StoreWriter`).

::

    format.py      metadata record, little-endian dtypes, block checksums, fingerprint
    backends/      where the two arrays live (memmap, Zarr v3) behind one reading interface
    reader.py      open_store / TokenStore: validated at open, memory-mapped, picklable
    writer.py      build / StoreWriter: streaming, validated, published atomically
    parts.py       joined stores: a manifest of parts + global offsets, read through read_ranges
    join_manifest.py  the join's manifest: its format, checks and fingerprint (read and written)
    join.py        join(): writes a join without copying tokens, appends atomically
    vocab.py       the tokenizer a store records: ids for views, vocabulary/mixing checks
"""

from __future__ import annotations

from mmpack.store.reader import TokenStore, open_store
from mmpack.store.writer import StoreWriter, build

__all__ = ["StoreWriter", "TokenStore", "build", "open_store"]
