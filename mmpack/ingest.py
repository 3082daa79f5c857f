"""Ingestion: raw text, JSON, Parquet, datasets or chat records tokenized into a store, on one
machine or as parts on a Dask cluster, and a store copied (local or remote).

The guide is ``docs/guide/building.md``; chat and prompt/completion records with their loss
masks are in ``docs/guide/fine-tuning.md``, the cluster builds in ``docs/distributed.md``.
"""

from __future__ import annotations

from mmpack._src.ingest.chat import build_chat, chat_documents
from mmpack._src.ingest.copy import copy_store
from mmpack._src.ingest.distributed import build_distributed, build_part, plan_tasks
from mmpack._src.ingest.pipeline import FORMATS, IngestIssue, IngestReport, ingest
from mmpack._src.ingest.region_plan import build_region_plan
from mmpack._src.ingest.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer",
    "FORMATS",
    "IngestIssue",
    "IngestReport",
    "Tokenizer",
    "build_chat",
    "build_distributed",
    "build_part",
    "build_region_plan",
    "chat_documents",
    "copy_store",
    "ingest",
    "load_tokenizer",
    "plan_tasks",
]
