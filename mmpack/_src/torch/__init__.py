"""The torch layer: everything that imports ``torch``.

::

    sampler.py     ResumableSampler: shuffled, sharded, resumable, O(1) memory
    collate.py     collate / Collator: (B, seqlen) tensors plus varlen cu_seqlens
    stacking.py    per-sample fields stacked (and padded) into batch tensors, for collate
    boundaries.py  cu_seqlens rows validated and concatenated (numpy for collate, torch for masks)
    attention.py   block-diagonal masks for SDPA and FlexAttention from cu_seqlens
    hf.py          hf_inputs, DataCollator: packed batches as a transformers model's inputs (Trainer)
    elastic.py     elastic resume arithmetic: a sampler state saved at W1 ranks resumed at W2
    streaming.py   StreamingPacker as a DataLoader dataset (its consumers, tensors, PackerDataset)
    microbatch.py  packed batches of tensors split into per-row micro-batches
    transfer.py    batches out of DataLoader workers through reused shared buffers, sent once
    loading.py     loader(): a resumable StatefulDataLoader over a view, in one call

Importing the layer registers :class:`~mmpack.StreamingPacker` as a torch
``IterableDataset`` and tells it its rank and DataLoader worker (:mod:`mmpack._src.torch.streaming`).

Public through :mod:`mmpack.torch` (torchdata comes with torch in the ``torch`` extra).
"""

import mmpack._src.torch.streaming  # noqa: F401  (registers the packer with torch)

__all__: list[str] = []
