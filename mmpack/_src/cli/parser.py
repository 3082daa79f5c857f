"""The argument parser of the ``mmpack`` command: :func:`build_parser` and one function per
subcommand that adds its options (``build``'s many are :mod:`mmpack._src.cli.build_options`).

An option that several subcommands share (the STORE arguments, ``--seqlen``, ``--long-docs``,
``--eot``/``--no-eot``, ``--pad-id``, ``-o``/``--output``, ``--overwrite``, ``--json``,
``--tokenizer``) is added
by one helper of :mod:`mmpack._src.cli.arguments`, so it is spelled and checked the same everywhere.
Each subparser records itself as ``parser`` (for error messages in its own terms);
:func:`mmpack.cli.main` dispatches on ``command``.  Nothing here imports the library, so
``mmpack --help`` starts fast.  Cost: about a hundred ``add_argument`` calls, a few ms in all.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mmpack._src.cli.arguments import (
    _add_check_vocab,
    _add_choice,
    _add_count,
    _add_eot,
    _add_flag,
    _add_long_docs,
    _add_optional,
    _add_output,
    _add_pad_id,
    _add_progress,
    _add_seqlen,
    _add_store_arguments,
    _add_tokenizer,
    _int_at_least,
    _positive_int,
    _seed,
    _stride,
    _subcommand,
)
from mmpack._src.cli.build_options import _add_build_engine, _add_build_policy, _add_build_reading

__all__ = ["build_parser"]

_PROG = "mmpack"
_ALGORITHMS = ("bfd", "online", "nextfit")


_COMMANDS: dict[str, tuple[str, str]] = {
    "build": (
        "tokenize text files into a new store",
        "Tokenize text into a new token store.  INPUT: files or quoted globs "
        "(.txt/.md and common source and markup files such as .py, .rst, .c, .js, "
        ".html, .yaml: one document per file, or per line with --lines; more "
        "extensions as text with --text-ext; .jsonl/.json records with a text "
        "field; .parquet with a text column; optionally .gz or .zst; or a folder "
        "saved by Hugging Face datasets).  Bad records are reported on stderr with "
        "their file and line.  A file is all or nothing: a corrupt or truncated "
        "compressed file, or a file whose reading fails, is skipped whole.",
    ),
    "info": (
        "what a store holds",
        "Counts, dtype, backend, size on disk, document-length "
        "quantiles and a histogram of a store.",
    ),
    "show": (
        "one window or packed sample",
        "Print sample I of the window view (or of the packed view "
        "with --packed), or with --position P the sample a ResumableSampler "
        "run served at global position P: its arrays, the documents it comes from, "
        "and with --decode its text, segment by segment.",
    ),
    "pack": (
        "packing statistics for a sequence length",
        "Build the packing plans (best-fit decreasing, online "
        "best fit, next fit) for SEQLEN and compare them with plain "
        "padding (one document per row) and concatenate-and-chunk: "
        "rows, efficiency (real tokens / slots), padding, documents "
        "cut.",
    ),
    "verify": (
        "check a store's checksums",
        "Recompute every block checksum of a store; exit 1 naming the first bad block.",
    ),
    "export": (
        "write a store as Megatron .bin/.idx or a flat token file",
        "Write STORE (any store mmpack opens) in another tool's "
        "format: Megatron-LM's PREFIX.bin + PREFIX.idx (one sequence "
        "per document), numpy .npy or OLMo-core's headerless flat "
        "file (+ NAME.csv.gz), each document followed by --eos.  "
        "Files appear complete or not at all.",
    ),
    "cp": (
        "copy a store, local or on object storage, with its metadata",
        "Copy the store SRC to DST (local folders and s3://, gs://, az://, file:// "
        "URLs, in any direction, also between buckets): every document, the "
        "metadata (the tokenizer record, the provenance, the files the build "
        "attached such as tokenizer.json), every block checksum compared with "
        "SRC's and checked again at DST before it is published atomically "
        "(nothing opens at DST until the copy is complete and verified).  A join is "
        "copied as one flattened store, another tool's files as an mmpack store.",
    ),
    "join": (
        "join stores into one without copying tokens",
        "Join PART stores (in order) into the store OUT: writes a "
        "manifest (part locations relative to OUT, fingerprints, "
        "counts) and the global document offsets (8 bytes per "
        "document), never a token.  OUT opens like any store; a "
        "part that later changes or goes missing is refused.",
    ),
    "demo": (
        "the whole pipeline on the Python standard library",
        "Build a store from the Python standard library's own "
        "source files (byte-level tokens), then show what it holds, "
        "window samples, packing statistics and random-access "
        "speed.  Nothing is downloaded.",
    ),
    "bench": (
        "run the benchmarks (python -m benchmarks)",
        "Run 'python -m benchmarks' of the source checkout; every "
        "argument after 'bench' is passed on (e.g. 'mmpack bench "
        "--quick store window'; 'mmpack bench -- --help' for "
        "its options).",
    ),
}
"""Each subcommand's one-line help (``mmpack --help``) and description (``mmpack NAME --help``)."""


def _command(sub: Any, name: str) -> argparse.ArgumentParser:
    """The subparser ``name``, its help and description from :data:`_COMMANDS`."""
    return _subcommand(sub, name, *_COMMANDS[name])


def _benchmarks_root() -> Path | None:
    """The source checkout holding ``benchmarks/`` next to this mmpack, if any."""
    root = Path(__file__).resolve().parents[3]  # mmpack/_src/cli/parser.py
    return root if (root / "benchmarks" / "__main__.py").is_file() else None


# --------------------------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``mmpack`` command (every option documented)."""
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Memory-mapped, random-access token stores for language-model training: "
        "build one from text, inspect it, and view it as windows or packed rows.",
        epilog="Run 'mmpack COMMAND --help' for the options of each command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_build(sub)
    _add_info(sub)
    _add_show(sub)
    _add_pack(sub)
    _add_verify(sub)
    _add_export(sub)
    _add_cp(sub)
    _add_join(sub)
    _add_demo(sub)
    if _benchmarks_root() is not None:
        _add_bench(sub)
    return p


# --------------------------------------------------------------------------------- build
def _add_build(sub: Any) -> None:
    b = _command(sub, "build")
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="input files, folders or globs")
    _add_output(b, "STORE", "the store folder to create")
    _add_tokenizer(
        b,
        "a tokenizer.json, a folder holding one, or a transformers tokenizer "
        "folder (default: byte-level, UTF-8 bytes, eot 256)",
    )
    _add_build_reading(b)
    _add_build_policy(b)
    _add_build_engine(b)


# --------------------------------------------------------------------------------- store commands
def _add_info(sub: Any) -> None:
    i = _command(sub, "info")
    _add_store_arguments(i)
    _add_flag(i, "--json", "print JSON instead of text")


def _add_show(sub: Any) -> None:
    s = _command(sub, "show")
    _add_store_arguments(s)
    _add_seqlen(s, "tokens per sample")
    s.add_argument(
        "--stride",
        type=_stride,
        default=None,
        metavar="S",
        help="distance between window starts (default: seqlen; windows only)",
    )
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "-i",
        "--index",
        type=int,
        default=None,
        metavar="I",
        help="sample index (negative counts from the end)",
    )
    which.add_argument(
        "--position",
        type=_int_at_least(0, "an integer position"),
        default=None,
        metavar="P",
        help="the sample a ResumableSampler run served at global position P: epoch * epoch "
        "length + position in the epoch order (the run is described by --seed, --shuffle, "
        "--world-size, --rank, --epoch, --drop-last, or --state)",
    )
    _add_flag(
        s, "--packed", "the packed view (whole documents best-fit into rows) instead of windows"
    )
    _add_eot(s, "end-of-text id inserted after every document")
    _add_pad_id(s)
    _add_check_vocab(s)
    _add_flag(s, "--keep-last", "windows: add the final partial window, padded (default: dropped)")
    _add_choice(
        s,
        "--algorithm",
        _ALGORITHMS,
        "bfd",
        "packing algorithm of --packed (default: bfd)",
    )
    _add_long_docs(s, "documents longer than a row, with --packed (default: split)")
    _add_flag(s, "--decode", "also print the decoded text")
    _add_tokenizer(
        s, "tokenizer for --decode (default: the one the store records, else byte-level)"
    )
    _add_run(s.add_argument_group("the run of --position (a ResumableSampler's parameters)"))


def _add_run(g: Any) -> None:
    """The options of ``show --position`` that describe the sampler of a run (``None``: not
    given, so that ``show -i`` can refuse them)."""
    g.add_argument("--seed", type=_seed, default=None, metavar="S", help="sampler seed (default 0)")
    g.add_argument(
        "--shuffle",
        choices=("true", "false", "blocks"),
        default=None,
        help="sampler order: keyed shuffle (default), in order, or block-window order",
    )
    g.add_argument(
        "--block-bytes",
        type=_positive_int,
        default=None,
        metavar="B",
        help="--shuffle blocks: the view's block_bounds(B) (default 4194304)",
    )
    g.add_argument(
        "--window-blocks",
        type=_positive_int,
        default=None,
        metavar="W",
        help="--shuffle blocks: blocks per window (default 256)",
    )
    g.add_argument(
        "--world-size", type=_positive_int, default=None, metavar="W", help="ranks (default 1)"
    )
    g.add_argument(
        "--rank",
        type=_int_at_least(0, "an integer rank"),
        default=None,
        metavar="R",
        help="P counts rank R's own samples (default: P counts all ranks' positions)",
    )
    g.add_argument(
        "--epoch",
        type=_int_at_least(0, "an integer epoch", 2**64 - 1, "epochs are 64-bit keys"),
        default=None,
        metavar="E",
        help="P is a position of epoch E (default: P runs on across epochs)",
    )
    g.add_argument(
        "--drop-last",
        action="store_true",
        default=None,
        help="the sampler dropped the tail of each epoch (drop_last=True)",
    )
    g.add_argument(
        "--state",
        default=None,
        metavar="FILE",
        help="the state the run saved (mmpack.torch.loader's state_dict(), over a view, a "
        "mixture or Stages, or a ResumableSampler's or a Stages'), as JSON or the file torch.save "
        "wrote: the run's order, seed, --drop-last, world size and its skips and replays (instead "
        "of those flags)",
    )
    g.add_argument(
        "--index-only",
        action="store_true",
        default=None,
        help="print only the index of the run's dataset served at P, not a sample: for a run "
        "over a mixture (or another dataset than the view), whose Mixture.source_of(index) "
        "names the source and its item",
    )


def _add_pack(sub: Any) -> None:
    k = _command(sub, "pack")
    _add_store_arguments(k)
    _add_seqlen(k, "tokens per row")
    _add_eot(k, "an end-of-text token follows every document (only its slot counts)")
    _add_long_docs(k, "documents longer than a row (default: split)")
    _add_count(k, "--lookahead", 1024, "open rows of the online algorithm (default: 1024)")
    _add_flag(k, "--json", "print JSON instead of a table")


def _add_verify(sub: Any) -> None:
    v = _command(sub, "verify")
    _add_store_arguments(v)
    _add_progress(v)


def _add_export(sub: Any) -> None:
    x = _command(sub, "export")
    _add_store_arguments(x)
    _add_choice(
        x,
        "--to",
        ("megatron", "npy", "olmo"),
        None,
        "megatron: PREFIX.bin + PREFIX.idx; npy: numpy .npy (np.load reads "
        "it); olmo: headerless flat file as OLMo-core reads it, plus its "
        ".csv.gz document metadata",
        required=True,
    )
    _add_output(x, "OUT", "the Megatron prefix or the file to write")
    _add_flag(x, "--overwrite", "replace existing files")
    _add_progress(x)


def _add_cp(sub: Any) -> None:
    c = _command(sub, "cp")
    _add_store_arguments(c, "SRC")
    c.add_argument(
        "destination",
        metavar="DST",
        help="the store to create: a folder, or a URL (s3://bucket/prefix, file:///path, ...)",
    )
    _add_choice(
        c,
        "--backend",
        ("memmap", "zarr"),
        None,
        "layout of the copy (default: SRC's; memmap for a join or another tool's files)",
    )
    _add_flag(c, "--overwrite", "replace an existing store at DST")
    _add_progress(c)


# --------------------------------------------------------------------------------- join, demo, bench
def _add_join(sub: Any) -> None:
    j = _command(sub, "join")
    j.add_argument("parts", nargs="+", metavar="PART", help="part stores, in order")
    _add_output(j, "OUT", "the join folder")
    _add_flag(j, "--append", "add the parts after those of the existing join OUT")
    _add_flag(j, "--overwrite", "replace the manifest of the existing join OUT (parts are kept)")
    _add_flag(
        j,
        "--mixed-tokenizers",
        "join parts built with different tokenizers (their ids then mean different things)",
    )


def _add_demo(sub: Any) -> None:
    d = _command(sub, "demo")
    _add_optional(
        d, "--out", "DIR", "keep the store in DIR/stdlib (default: a temporary folder, removed)"
    )
    _add_flag(d, "--overwrite", "replace DIR/stdlib if it exists")


def _add_bench(sub: Any) -> None:
    n = _command(sub, "bench")
    n.add_argument(
        "bench_args",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="arguments for python -m benchmarks (e.g. --quick)",
    )
