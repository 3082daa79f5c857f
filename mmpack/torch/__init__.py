"""The torch layer: everything that imports ``torch``.

::

    sampler.py     ResumableSampler: shuffled, sharded, resumable, O(1) memory
    collate.py     collate / Collator: (B, seqlen) tensors plus varlen cu_seqlens
    attention.py   block-diagonal masks for SDPA and FlexAttention from cu_seqlens
"""

__all__: list[str] = []
