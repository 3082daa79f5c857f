"""Stores written by other tools, served in place, and exports to their formats.

::

    foreign.py         ForeignStore: a TokenStore over another tool's files (mapped, read-only);
                       cache folder, the cached index's key, pickling by reopening
    sidecar.py         the checksum sidecar: recorded by the first verify(), checked by later
                       ones and, with verify_reads=True, by every read's blocks
    token_ids.py       signed files served unsigned; the check that no id is negative
    megatron.py        Megatron-LM PREFIX.bin + PREFIX.idx  (format="megatron", auto-detected)
    eos_separated.py   flat token files with EOS between documents, OLMo-core / Dolma and .npy
                       (format="eos-separated", eos=ID)
    export.py          export_megatron / export_flat: atomic writers of those formats
    megatron_order.py  megatron-core GPTDataset's document, sample and shuffle index over a store
    arrayfile.py       named arrays in one checksummed file (the cached Megatron order)

Registered in :mod:`mmpack._src.store.registry` when this package is imported (``import mmpack``
does).  ``mmpack.open(PREFIX)`` finds a Megatron dataset when ``PREFIX.idx`` exists;
``mmpack.open(PATH, format="eos-separated", eos=ID)`` opens a flat file.  Derived files (the EOS
index, packing plans, checksum sidecars) go to ``~/.cache/mmpack`` (or ``cache_dir=``, or
``$MMPACK_CACHE_DIR``), never beside the user's files.
"""

from __future__ import annotations

from mmpack._src.store.registry import register_detector, register_opener

__all__: list[
    str
] = []  # reached by module path: mmpack._src.formats.megatron, .eos_separated, .export

register_opener("megatron", "mmpack._src.formats.megatron:open_megatron")
register_opener("eos-separated", "mmpack._src.formats.eos_separated:open_eos_separated")
register_detector("mmpack._src.formats.megatron:detect_megatron")
register_detector("mmpack._src.formats.eos_separated:detect_npy")
