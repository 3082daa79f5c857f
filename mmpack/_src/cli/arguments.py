"""The argparse pieces of the ``mmpack`` command that its subcommands share: the types that refuse
a bad value naming its flag (an integer in range, a token id or ``store``, extensions) and the
options spelled the same in every subcommand that has them (the STORE arguments, ``--seqlen``,
``--long-docs``, ``--eot``/``--no-eot``, ``--pad-id``, ``--no-check-vocab``, ``-o``/``--output``,
``--tokenizer``, ``--progress``/``--no-progress``, switches such as ``--overwrite``).  Nothing here imports the library.  Cost: O(1) a value parsed.
"""

from __future__ import annotations

import argparse
from typing import Any

from mmpack._src.cli.subsets import add_subset_arguments

__all__: list[str] = []

_LONG_DOCS = ("split", "truncate", "drop")


# --------------------------------------------------------------------------------- types
def _int_at_least(lo: int, what: str, hi: int | None = None, why: str = ""):
    """An argparse ``type`` for an integer in ``[lo, hi]`` (``what`` names it in the error, ``why``
    says where ``hi`` comes from), so that a value out of range is refused naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected {what} >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"expected {what} <= {hi} ({why}), got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "an integer")
_token_id = _int_at_least(0, "an integer token id", 2**63 - 1, "ids are int64")
_seqlen = _int_at_least(1, "an integer", 2**31 - 1, "cu_seqlens are int32")
_stride = _int_at_least(1, "an integer", 2**63 - 1, "token offsets are int64")
_seed = _int_at_least(0, "an integer seed", 2**64 - 1, "seeds are 64-bit keys")


def _extensions(text: str) -> list[str]:
    """``--text-ext .py,.rst`` -> ``[".py", ".rst"]``."""
    exts = [e.strip() for e in text.split(",")]
    if not all(e.strip(".") for e in exts):
        raise argparse.ArgumentTypeError(f"expected extensions such as .py,.rst, got {text!r}")
    return exts


def _token_id_or_store(text: str) -> int | str:
    """An id, or ``store``: the id the store's tokenizer records (what the views take)."""
    return "store" if text == "store" else _token_id(text)


def _add_eot(p: argparse.ArgumentParser, help: str) -> None:
    """``--eot ID|store`` / ``--no-eot``, spelled, typed and defaulted the same in every
    subcommand: the default ``store`` is the eot the store's tokenizer records, none if it
    records none (as the views default)."""
    p.add_argument(
        "--eot",
        type=_token_id_or_store,
        default="store",
        metavar="ID",
        help=help + " (an id, or 'store': the store's tokenizer's eot, none if the store "
        "records none; default: store)",
    )
    p.add_argument(
        "--no-eot", dest="eot", action="store_const", const=None, help="no end-of-text token"
    )


def _add_pad_id(p: argparse.ArgumentParser) -> None:
    """``--pad-id ID|store``: the padding id, defaulting as the views do."""
    p.add_argument(
        "--pad-id",
        type=_token_id_or_store,
        default="store",
        metavar="ID",
        help="padding id (an id, or 'store': the store's tokenizer's pad, 0 if the store "
        "records none; default: store)",
    )


def _add_check_vocab(p: argparse.ArgumentParser) -> None:
    """``--no-check-vocab``: accept an ``--eot``/``--pad-id`` outside the store's recorded
    vocabulary."""
    p.add_argument(
        "--no-check-vocab",
        dest="check_vocab",
        action="store_false",
        help="accept an --eot or --pad-id outside the vocabulary of the store's tokenizer",
    )


# --------------------------------------------------------------------------------- shared options
def _add_store_arguments(p: argparse.ArgumentParser, metavar: str = "STORE") -> None:
    """STORE (named ``metavar`` in the help) and how to read it (``--format``, ``--eos``,
    ``--dtype``, ``--metadata``, and the subset options of :mod:`mmpack._src.cli.subsets`)."""
    p.add_argument(
        "store",
        metavar=metavar,
        help="an mmpack store folder or URL, a Megatron dataset prefix (PREFIX.bin + "
        "PREFIX.idx) or a flat token file",
    )
    _add_choice(
        p,
        "--format",
        ("mmpack", "megatron", "eos-separated"),
        None,
        "what STORE is (default: detected; a flat token file needs "
        "--format eos-separated --eos ID)",
    )
    p.add_argument(
        "--eos",
        type=_token_id,
        default=None,
        metavar="ID",
        help="end-of-sequence id that ends each document of a flat token file "
        "(export: the id written after each document)",
    )
    _add_choice(
        p,
        "--dtype",
        ("uint8", "uint16", "uint32", "uint64", "int32"),
        None,
        "token dtype of a headerless flat token file (OLMo-core: uint16 or uint32)",
    )
    p.add_argument(
        "--metadata",
        action="store_true",
        help="a flat token file's documents from OLMo-core's NAME.csv.gz beside it "
        "(default: found by scanning for --eos)",
    )
    add_subset_arguments(p)  # --where, --split (a subset of the store's documents)


def _add_output(p: argparse.ArgumentParser, metavar: str, help: str) -> None:
    p.add_argument("-o", "--output", required=True, metavar=metavar, help=help)


def _add_flag(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A switch such as ``--overwrite``, ``--json`` or ``--lines``."""
    p.add_argument(flag, action="store_true", help=help)


def _add_progress(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress``: a bar on stderr with a total and an ETA (default:
    when stderr is a terminal, so a pipe or a log file never gets one)."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr with a total and an ETA (default: when stderr is a "
        "terminal)",
    )


def _add_count(
    p: argparse.ArgumentParser, flag: str, default: int | None, help: str, metavar: str = "N"
) -> None:
    """An option taking an integer >= 1 (``--workers N``, ``--batch-size N``, ...)."""
    p.add_argument(flag, type=_positive_int, default=default, metavar=metavar, help=help)


def _add_choice(
    p: argparse.ArgumentParser,
    flag: str,
    choices: tuple[str, ...],
    default: str | None,
    help: str,
    required: bool = False,
) -> None:
    """An option taking one of ``choices`` (``--backend``, ``--engine``, ``--on-error``, ...)."""
    p.add_argument(flag, choices=choices, default=default, required=required, help=help)


def _add_optional(p: argparse.ArgumentParser, flag: str, metavar: str, help: str) -> None:
    """An option taking a string, None when not given (``--split NAME``, ``--scheduler ...``)."""
    p.add_argument(flag, metavar=metavar, default=None, help=help)


def _add_tokenizer(p: argparse.ArgumentParser, help: str) -> None:
    _add_optional(p, "--tokenizer", "PATH", help)


def _add_seqlen(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--seqlen", type=_seqlen, required=True, metavar="N", help=help)


def _add_long_docs(p: argparse.ArgumentParser, help: str) -> None:
    _add_choice(p, "--long-docs", _LONG_DOCS, "split", help)


def _subcommand(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A subparser that records itself as ``parser`` (errors are spelled in its flags)."""
    p = sub.add_parser(name, help=help, description=description)
    p.set_defaults(parser=p)
    return p
