"""The packing layer: what both packers share (a plan's bins, a stream's batches), and the plan.

::

    options.py     RowOptions: the options of packed rows, checked once (check_row_options)
    masking.py     MLM corruption (80/10/10, counter-based): the one rule of both packers
    plan.py        the packing plan (best-fit decreasing or online), over document lengths
    plan_stats.py  what a plan packed (PackingStats)
    region_cuts.py where the regions of a plan end
    plan_pieces.py the plan's pieces as stored: region-relative references, a sparse split table
    plan_file.py   the plan's file format and its cache in the store's cache folder
    plan_pages.py  a mapped plan file's chunk digests, each checked on first use
    plan_regions.py  cached_plan: a plan built region by region, each written as it is made

The packers' kernels (the free-space tree and its placements, the row writer, the label rule)
are in :mod:`mmpack._src.kernels.plan_bestfit` and :mod:`mmpack._src.kernels.packed_rows`; the drivers
are :class:`~mmpack.PackedDataset` and
:class:`~mmpack.StreamingPacker`.
"""

__all__: list[str] = []
