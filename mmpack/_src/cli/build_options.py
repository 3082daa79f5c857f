"""The options of ``mmpack build``, in three groups: what it reads (the field, lines or whole
files, the formats), how it tokenizes (workers, batches, the ``on_error`` policy, the template,
empty documents) and where it writes and runs (the backend; one local store, or parts on Dask or
serially, joined).  :func:`mmpack._src.cli.parser.build_parser` adds them to the ``build``
subparser; they map onto the parameters of :func:`mmpack.ingest.ingest`.  Nothing here
imports the library.  Cost: a few dozen ``add_argument`` calls.
"""

from __future__ import annotations

import argparse

from mmpack._src.cli.arguments import (
    _add_choice,
    _add_count,
    _add_flag,
    _add_optional,
    _add_progress,
    _extensions,
    _seed,
)

__all__: list[str] = []


def _add_build_reading(b: argparse.ArgumentParser) -> None:
    """What ``build`` reads: the field, lines or whole files, the formats."""
    b.add_argument(
        "--field",
        default="text",
        metavar="NAME",
        help="text field of JSON records / column of Parquet files (default: text)",
    )
    b.add_argument(
        "--fields",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        default=None,
        metavar="KEY,...",
        help="keys of JSON records (columns of Parquet files and saved datasets; with "
        "--loss-on, of each conversation's record) stored as per-document fields (numbers, "
        "or strings as categories), e.g. source,lang,quality; a record lacking one, or "
        "holding a null there, is a bad record; a file without such a column is refused",
    )
    _add_flag(b, "--lines", "text files hold one document per line (default: one per file)")
    _add_choice(
        b,
        "--format",
        ("text", "jsonl", "json", "parquet"),
        None,
        "format of every input file (default: from the extension)",
    )
    b.add_argument(
        "--text-ext",
        dest="text_extensions",
        type=_extensions,
        action="append",
        metavar="EXTS",
        help="also read files with these extensions as text, e.g. --text-ext "
        ".sql,.bas (comma-separated, repeatable; the others keep their format)",
    )
    b.add_argument(
        "--format-for",
        action="append",
        default=None,
        metavar="PATTERN=FORMAT",
        help="format of the files matching a glob pattern, e.g. '*.py=text' (source "
        "files as text next to JSON lines); repeatable; others go by extension",
    )


def _add_build_policy(b: argparse.ArgumentParser) -> None:
    """How ``build`` tokenizes: workers, batches, the ``on_error`` policy, the split read, the
    template added, empty documents."""
    _add_count(
        b, "--workers", None, "tokenizer processes (default: the CPU count; 1 for byte-level)"
    )
    _add_count(b, "--batch-size", 1000, "documents per tokenizer batch (default: 1000)")
    _add_choice(
        b,
        "--on-error",
        ("skip-some", "skip", "fail"),
        "skip-some",
        "a bad record (invalid UTF-8 or JSON, missing or non-string field, "
        "tokenizer failure, unreadable file) is reported and skipped; "
        "skip-some (default) then refuses the build, nothing written, if a file "
        "was unreadable, if no record of an INPUT could be stored, or if more "
        "than half of all records were skipped; skip builds from whatever is "
        "left; fail stops at the first bad record, nothing written",
    )
    _add_optional(
        b,
        "--split",
        "NAME",
        "the split of a saved Hugging Face DatasetDict to build (needed when it has several; "
        "one split is used)",
    )
    _add_optional(
        b,
        "--template",
        "TEMPLATE",
        "special tokens around every document: 'tokenizer' (the tokenizer's own "
        "post-processor, e.g. BOS or [CLS] ... [SEP]) or a template such as "
        "'<s> $A' or '[CLS] $A [SEP]' (default: none)",
    )
    _add_flag(b, "--skip-empty", "drop empty documents (default: store them as empty documents)")
    b.add_argument(
        "--shuffle-docs",
        type=_seed,
        default=None,
        metavar="SEED",
        help="store the documents in a keyed random order of SEED (an integer >= 0) instead "
        "of the input order, so that neighbouring documents are a random sample of the "
        "corpus; needs twice the token bytes on disk while it runs (with --engine dask/serial: "
        "each part shuffled, the parts joined in a keyed order)",
    )
    _add_choice(
        b,
        "--loss-on",
        ("assistant", "all", "completion"),
        None,
        "build a fine-tuning store with a per-token loss mask from chat records "
        '({"messages": [{"role", "content"}, ...]}, or {"prompt", "completion"} with '
        "completion) in JSON lines, JSON, Parquet or a saved Hugging Face dataset, tokenized "
        "with the --tokenizer folder's chat template: the assistant's tokens, all of them, "
        "or the completion's are the targets (as TRL's assistant_only_loss, no mask, "
        "completion_only_loss)",
    )


def _add_build_engine(b: argparse.ArgumentParser) -> None:
    """Where ``build`` writes and runs: the backend, one local store or parts on Dask (or
    serially) joined."""
    _add_choice(
        b,
        "--backend",
        ("memmap", "zarr"),
        "memmap",
        "storage backend (default: memmap)",
    )
    _add_flag(b, "--overwrite", "replace an existing store")
    _add_progress(b)
    _add_choice(
        b,
        "--engine",
        ("local", "dask", "serial"),
        "local",
        "local: one store, tokenized by a local process pool (default); dask: "
        "one part per task on a Dask cluster, joined into STORE (--workers then "
        "sizes the local cluster); serial: the same parts, one after another",
    )
    _add_optional(
        b,
        "--scheduler",
        "ADDRESS",
        "with --engine dask: a running scheduler (tcp://host:8786) instead of a "
        "local cluster on 127.0.0.1",
    )
    _add_count(
        b,
        "--part-mb",
        64,
        "with --engine dask/serial: input megabytes per part; files are grouped "
        "in order, never split (default: 64)",
        metavar="MB",
    )
