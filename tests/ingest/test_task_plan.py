"""plan_tasks (mmpack._src.ingest.task_plan): the inputs' files grouped into tasks in order, of at
most part_bytes each; a pattern matching nothing and an in-memory iterable are refused."""

from __future__ import annotations

import os

import pytest
from _text_corpora import write_inputs as _write_inputs

from mmpack.ingest import plan_tasks


def test_plan_tasks_groups_files_in_order(tmp_path):
    inputs = _write_inputs(tmp_path)
    tasks = plan_tasks(inputs, part_bytes=1)
    assert [os.path.basename(f) for t in tasks for f in t] == [
        f"shard-{k:02d}.jsonl" for k in range(7)
    ] + ["notes.txt"]
    assert all(len(t) == 1 for t in tasks)
    assert len(plan_tasks(inputs, part_bytes=1 << 40)) == 1
    with pytest.raises(FileNotFoundError, match="no file matches"):
        plan_tasks([str(tmp_path / "*.parquet")])
    with pytest.raises(TypeError, match="ingest"):
        plan_tasks(iter(["text"]))
