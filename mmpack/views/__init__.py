"""The views layer: training samples over a store, answered exactly and at random.

::

    window.py      WindowDataset: (seqlen, stride) windows over the concatenated documents
    window_stats.py  WindowStats: what the windows cover (WindowDataset.stats())
    plan.py        the packing plan (best-fit decreasing or online), over document lengths
    plan_file.py   the plan's file format and its cache in the store's cache folder
    plan_pages.py  a mapped plan file's chunk digests, each checked on first use
    plan_pieces.py the plan's pieces as stored: region-relative references, a sparse split table
    packed.py      PackedDataset: one sample per bin of a plan
    packed_config.py  PackedDataset's options, checked once
    packed_gather.py  batched reads of packed rows
    masking.py     MLM corruption (80/10/10, counter-based), shared with the streaming packer
    batch.py       SampleBatch: what __getitems__ returns (columns, per-sample dicts on demand)
    provenance.py  where a batch's samples come from: documents and token ranges, flat arrays
    buffers.py     pooled output buffers for batched gathers
    readahead.py   cold local data: a batch's and a single read's pages requested together
    megatron_gpt.py MegatronGPTDataset: megatron-core GPTDataset's samples, in its order
"""

__all__: list[str] = []
