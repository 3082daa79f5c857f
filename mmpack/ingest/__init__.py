"""The ingestion layer: raw text -> tokenized documents -> a store.

::

    tokenizer.py   byte-level, tokenizers and transformers tokenizers behind one interface
    pipeline.py    ingest(): readers for text/JSON/Parquet/datasets, worker pool, report
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
