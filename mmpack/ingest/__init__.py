"""The ingestion layer: raw text -> tokenized documents -> a store.

::

    tokenizer.py    byte-level, tokenizers and transformers tokenizers behind one interface
    templates.py    special-token templates (the tokenizer's post-processor, or "<s> $A")
    pipeline.py     ingest(): readers for text/JSON/Parquet/datasets, worker pool, report
    compression.py  .zst inputs
    provenance.py   the tokenizer record and provenance a build writes; the tokenizer read back
    distributed.py  one part per task on Dask (or serially), joined: build_distributed()
"""

from __future__ import annotations

from mmpack.ingest.pipeline import (
    FORMATS,
    IngestError,
    IngestIssue,
    IngestReport,
    IngestWarning,
    ingest,
)

__all__ = ["FORMATS", "IngestError", "IngestIssue", "IngestReport", "IngestWarning", "ingest"]
