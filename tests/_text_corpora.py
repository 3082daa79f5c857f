"""Small real text corpora and a BPE tokenizer trained on them, for the ingestion tests.

The corpus is the Python standard library's own source files (always present, nothing to
download); :func:`train_bpe` trains a byte-level BPE with ``tokenizers`` on a few hundred KB of it
in well under a second; :func:`write_inputs` writes it as JSONL shards and a text file.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
DATA = Path(__file__).resolve().parent / "data"
EOT = "<|endoftext|>"


def stdlib_files(max_bytes: int, *, skip: int = 0) -> list[Path]:
    """Sorted top-level stdlib ``.py`` files that are valid UTF-8, about ``max_bytes`` in all."""
    out, total = [], 0
    for path in sorted(STDLIB.glob("*.py"))[skip:]:
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(path)
        total += len(data)
        if total >= max_bytes:
            break
    return out


def stdlib_texts(max_bytes: int, *, skip: int = 0) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in stdlib_files(max_bytes, skip=skip)]


def train_bpe(out: Path, vocab_size: int = 2000, max_bytes: int = 400_000) -> Path:
    """Train a byte-level BPE (special token ``<|endoftext|>``) and save ``out/tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in stdlib_files(max_bytes)], trainer)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def write_inputs(root, n_files=7, bad_in=3):
    """``n_files`` JSONL shards of standard-library texts (a bad line in shard ``bad_in``, an
    empty document closing each) and one plain text file under ``root``; the input patterns."""
    texts = stdlib_texts(120_000)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(n_files):
        chunk = texts[k::n_files]
        lines = [json.dumps({"text": t}) for t in chunk] + [json.dumps({"text": ""})]
        if k == bad_in:
            lines.insert(1, "{not json")
        (root / f"shard-{k:02d}.jsonl").write_text("\n".join(lines) + "\n")
    (root / "notes.txt").write_text("a plain text file, one document\n")
    return [str(root / "shard-*.jsonl"), str(root / "notes.txt")]
