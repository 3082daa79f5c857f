"""Stores written by other tools, served in place, and exports to their formats.

::

    _store.py          ForeignStore: a TokenStore over another tool's files (mapped, read-only);
                       cache folder, checksum sidecar, pickling by reopening
    megatron.py        Megatron-LM PREFIX.bin + PREFIX.idx  (format="megatron", auto-detected)
    eos_separated.py   flat token files with EOS between documents, OLMo-core / Dolma and .npy
                       (format="eos-separated", eos=ID)
    export.py          export_megatron / export_flat: atomic writers of those formats

``mmpack.open(PREFIX)`` finds a Megatron dataset when ``PREFIX.idx`` exists;
``mmpack.open(PATH, format="eos-separated", eos=ID)`` opens a flat file.  Derived files (the EOS
index, packing plans, checksum sidecars) go to ``~/.cache/mmpack`` (or ``cache_dir=``, or
``$MMPACK_CACHE_DIR``), never beside the user's files.
"""

from __future__ import annotations

from mmpack.store.foreign._store import ForeignStore, cache_root
from mmpack.store.foreign.eos_separated import EosSeparatedStore, open_eos_separated
from mmpack.store.foreign.export import export_flat, export_megatron
from mmpack.store.foreign.megatron import MegatronStore, open_megatron

__all__ = [
    "EosSeparatedStore",
    "ForeignStore",
    "MegatronStore",
    "cache_root",
    "export_flat",
    "export_megatron",
    "open_eos_separated",
    "open_megatron",
]
