"""Ingestion throughput: ``mmpack build`` (1 and 2 workers, and ``--engine dask`` with 2 workers)
and Megatron's recipe (megatron-core's ``IndexedDatasetBuilder`` fed one document at a time, as
``tools/preprocess_data.py`` does) against the tokenizer's own ``encode_batch`` over the same
texts.

Corpus: the Python standard library's ``.py`` files (valid UTF-8), written as JSON lines into 8
files; tokenizer: a byte-level BPE of 8000 ids trained locally with ``tokenizers`` (nothing is
downloaded).  The floor is ``Tokenizer.encode_batch`` over every text in one process in batches
of 1000 (Rust, on every core: what a user gets by default) with no file reading and no writing
(mmpack calls ``encode_batch_fast`` where the installed ``tokenizers`` has it: no offsets);
each build reads the JSON lines, tokenizes and writes a store (``fsync`` on).  Rates are
tokens/s; ``floor / build`` ratios are medians of alternating pairs.  The Dask case runs on a
``LocalCluster`` (2 processes, 1 thread each, 127.0.0.1) started once beforehand (its ~2 s
start-up is reported apart).

Run ``python -m benchmarks.bench_ingest [--quick]``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _texts(max_bytes: int) -> list[str]:
    import sysconfig

    out, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return out


def _train(texts: list[str], out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts[:400], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


class _Written:
    def __init__(self, tokens: int) -> None:
        self.tokens_written = tokens


def _megatron_recipe(files: list[str], rust: Any, out: Path) -> _Written:
    """Megatron-LM's ``tools/preprocess_data.py`` loop in one process: each JSON line parsed,
    its text tokenized alone, the ids added to megatron-core's ``IndexedDatasetBuilder``
    (uint16), finalized.  (No eod is appended, so that the token counts match.)"""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(str(out / "data.bin"), dtype=np.uint16)
    n = 0
    for name in files:
        with open(name, encoding="utf-8") as f:
            for line in f:
                ids = rust.encode(json.loads(line)["text"], add_special_tokens=False).ids
                builder.add_document(torch.tensor(ids, dtype=torch.int64), [len(ids)])
                n += len(ids)
    builder.finalize(str(out / "data.idx"))
    return _Written(n)


def run(quick: bool = False) -> list[dict[str, Any]]:
    from dask.distributed import LocalCluster
    from tokenizers import Tokenizer

    from mmpack.ingest import build_distributed, ingest

    texts = _texts(500_000 if quick else 8_000_000)
    repeats = 2 if quick else 3
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-ingest-"))
    rows: list[dict[str, Any]] = []
    try:
        bpe = _train(texts, tmp / "bpe")
        files = []
        for k in range(8):
            path = tmp / f"in-{k}.jsonl"
            path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k::8]))
            files.append(str(path))
        rust = Tokenizer.from_file(str(bpe))

        def floor() -> int:
            n = 0
            for a in range(0, len(texts), 1000):
                n += sum(
                    len(e.ids)
                    for e in rust.encode_batch(texts[a : a + 1000], add_special_tokens=False)
                )
            return n

        tokens = floor()
        t0 = time.perf_counter()
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        )
        startup = time.perf_counter() - t0

        def megatron(out: Path):
            return _megatron_recipe(files, rust, out)

        cases = {
            "Megatron recipe, 1 process (json.loads, encode per doc, IndexedDatasetBuilder)": megatron,
            "build, 1 worker": lambda out: ingest(files, out, tokenizer=bpe, workers=1),
            "build, 2 workers": lambda out: ingest(files, out, tokenizer=bpe, workers=2),
            "build --engine dask, 2 workers": lambda out: build_distributed(
                files,
                out,
                engine="dask",
                scheduler=cluster.scheduler_address,
                tokenizer=bpe,
                part_bytes=1 + sum(Path(f).stat().st_size for f in files) // 8,
            ),
        }
        try:
            for name, fn in cases.items():
                ratios, ours, floors = [], [], []
                for r in range(repeats):
                    t0 = time.perf_counter()
                    floor()
                    f = time.perf_counter() - t0
                    out = tmp / f"out-{r}"
                    t0 = time.perf_counter()
                    report = fn(out)
                    t = time.perf_counter() - t0
                    assert report.tokens_written == tokens, (report.tokens_written, tokens)
                    shutil.rmtree(out, ignore_errors=True)
                    ratios.append(f / t)
                    ours.append(t)
                    floors.append(f)
                rows.append(
                    {
                        "case": name,
                        "tokens": tokens,
                        "build Mtok/s": tokens / float(np.median(ours)) / 1e6,
                        "encode_batch Mtok/s": tokens / float(np.median(floors)) / 1e6,
                        "build / encode_batch": float(np.median(ratios)),
                    }
                )
        finally:
            cluster.close()
        rows.append(
            {"case": "LocalCluster start-up (2 workers), s", "tokens": 0, "build Mtok/s": startup}
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("ingest", run(quick="--quick" in sys.argv))
