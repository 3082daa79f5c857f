"""The torch adapter: a resumable loader, collation, attention masks and Hugging Face inputs.

Importing it imports torch and registers :class:`mmpack.StreamingPacker` as a torch
``IterableDataset`` that knows its rank and DataLoader worker.  The guide is
``docs/guide/torch.md``.
"""

from __future__ import annotations

import mmpack._src.torch.streaming  # noqa: F401  (registers the packer with torch)
from mmpack._src.torch.attention import (
    batched_block_causal_mask,
    block_causal_mask,
    document_ids,
    document_mask_mod,
    flex_document_mask,
)
from mmpack._src.torch.collate import Collator, collate
from mmpack._src.torch.elastic import sampler_state
from mmpack._src.torch.hf import DataCollator, hf_inputs
from mmpack._src.torch.loading import ResumableLoader, loader
from mmpack._src.torch.sampler import ResumableSampler
from mmpack._src.torch.stages import Stages, stage_seed
from mmpack._src.torch.streaming import PackerDataset

__all__ = [
    "Collator",
    "DataCollator",
    "PackerDataset",
    "ResumableLoader",
    "ResumableSampler",
    "Stages",
    "batched_block_causal_mask",
    "block_causal_mask",
    "collate",
    "document_ids",
    "document_mask_mod",
    "flex_document_mask",
    "hf_inputs",
    "loader",
    "sampler_state",
    "stage_seed",
]
