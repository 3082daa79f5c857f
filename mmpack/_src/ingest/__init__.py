"""The ingestion layer: raw text -> tokenized documents -> a store (and a store copied to another).

::

    tokenizer.py    byte-level, tokenizers and transformers tokenizers behind one interface;
                    special-token templates (the tokenizer's post-processor, or "<s> $A")
    pipeline.py     ingest(): the API, from inputs to a store
    chat.py         chat and prompt/completion records -> documents with loss masks, stores
    chat_template.py  a record's checks, ids and mask (TRL's rules); ChatTokenizer for ingest
    chat_readers.py the sources of chat records: JSON, Parquet, datasets and iterables
    inputs.py       format detection and input resolution (paths, globs, datasets, iterables)
    readers.py      the sources: text, JSON, Parquet, datasets and iterables in memory
    records.py      the record/reason protocol; damaged .gz checks
    report.py       IngestIssue, IngestReport and the on_error policy over the issues
    batching.py     records -> batches; a tokenized batch accounted for and written
    workers.py      the tokenizer worker pool
    compression.py  .zst inputs
    provenance.py   the tokenizer record and provenance a build writes; the tokenizer read back
    distributed.py  one part per task on Dask (or serially), joined: build_distributed()
    task_plan.py    inputs grouped, in order, into one task per part
    part_build.py   the engine-neutral per-part function: inputs -> one part, atomically
    engines.py      the Dask and serial runners, progress
    region_plan.py  a store's packing plan per region built on the engines: build_region_plan()
    copy.py         copy_store (``mmpack cp``): a store copied, local or remote, with its metadata
"""

from __future__ import annotations

__all__: list[str] = []  # public through mmpack.ingest
