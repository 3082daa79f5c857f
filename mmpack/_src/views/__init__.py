"""The views layer: training samples over a store, answered exactly and at random (the packing
plan is :mod:`mmpack._src.packing`'s).

::

    window.py      WindowDataset: (seqlen, stride) windows over the concatenated documents
    window_stats.py  WindowStats: what the windows cover (WindowDataset.stats())
    packed.py      PackedDataset: one sample per bin of a plan
    packed_config.py  PackedDataset's options, checked once
    packed_gather.py  batched reads of packed rows
    batch.py       SampleBatch: what __getitems__ returns (columns, per-sample dicts on demand)
    provenance.py  where a batch's samples come from: documents and token ranges, flat arrays
    buffers.py     pooled output buffers for batched gathers
    readahead.py   cold local data: a batch's and a single read's pages requested together
    megatron_gpt.py MegatronGPTDataset: megatron-core GPTDataset's samples, in its order
"""

__all__: list[str] = []
