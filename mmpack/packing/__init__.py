"""The packing layer: what both packers share, the plan's bins and the stream's batches.

::

    options.py     RowOptions: the options of packed rows, checked once (check_row_options)
    masking.py     MLM corruption (80/10/10, counter-based): the one rule of both packers

The packers' kernels (the free-space tree and its placements, the row writer, the label rule)
are in :mod:`mmpack.kernels.plan_bestfit` and :mod:`mmpack.kernels.packed_rows`; the drivers
are :class:`~mmpack.views.packed.PackedDataset` and
:class:`~mmpack.streaming.packer.StreamingPacker`.
"""

__all__: list[str] = []
