"""The torch layer: everything that imports ``torch``.

::

    sampler.py     ResumableSampler: shuffled, sharded, resumable, O(1) memory
    collate.py     collate / Collator: (B, seqlen) tensors plus varlen cu_seqlens
    attention.py   block-diagonal masks for SDPA and FlexAttention from cu_seqlens
    hf.py          hf_inputs: a packed batch as keyword arguments of a transformers model
    elastic.py     elastic resume arithmetic: a sampler state saved at W1 ranks resumed at W2
"""

__all__: list[str] = []
