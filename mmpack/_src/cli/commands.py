"""The ``mmpack`` command: a thin argparse layer over the library.

Subcommands: ``build`` (ingest text into a store, :func:`mmpack.ingest.ingest`), ``info``
(what a store holds), ``show`` (one window or packed sample, as ids or decoded text), ``pack``
(packing statistics of every algorithm against padding and concatenate-and-chunk), ``verify``
(checksums), ``join`` (stores joined without copying tokens, :func:`mmpack.join`), ``export`` (to
Megatron ``.bin/.idx`` or a flat EOS-separated file), ``cp`` (a store copied, local or on object
storage, :func:`mmpack.ingest.copy_store`), ``demo`` (the whole pipeline on the Python
standard library's sources) and ``bench`` (``python -m benchmarks`` of a source checkout).  The
parser is :mod:`mmpack._src.cli.parser`; the subcommands over an existing store are
:mod:`mmpack._src.cli.inspect_commands` (``info``, ``show``) and :mod:`mmpack._src.cli.store_commands` (the
others); this module holds :func:`main`, the others and the error
rendering.

Exit codes: 0 success; 1 a missing or corrupt store, a refused build, an I/O error (a read-only
or full disk, a permission denied) or any other expected error (one line on stderr, no
traceback); 2 bad arguments (argparse).  Library imports happen inside the subcommands so that
``mmpack --help`` starts fast.

Messages name this command's flags, never Python parameters: a library error that names a
parameter is built from :class:`mmpack.errors.Param` parts, and :func:`main` spells each one as
the flag of the running subcommand whose ``dest`` is the parameter's name (``overwrite=True`` ->
``--overwrite``, ``on_error='skip'`` -> ``--on-error skip``).
"""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmpack._src.cli.inspect_commands import _cmd_info, _cmd_show
from mmpack._src.cli.parser import _PROG, _benchmarks_root, build_parser
from mmpack._src.cli.store_commands import _cmd_cp, _cmd_export, _cmd_pack, _cmd_verify, _fmt_bytes

__all__ = ["build_parser", "main"]


# --------------------------------------------------------------------------------- build
def _cmd_build(args: argparse.Namespace) -> int:
    from mmpack._src.ingest.pipeline import ingest

    def on_issue(issue) -> None:
        tag = "skipped" if issue.is_error else "note"
        print(f"{_PROG}: {tag}: {issue}", file=sys.stderr)

    if args.scheduler is not None and args.engine != "dask":
        raise ValueError("--scheduler needs --engine dask")
    if args.loss_on is not None:
        _check_chat_flags(args)
    options: dict[str, Any] = dict(  # what both engines take, as ingest() keywords
        tokenizer=args.tokenizer,
        field=args.field,
        lines=args.lines,
        format=_formats(args),
        batch_size=args.batch_size,
        on_error=args.on_error,
        skip_empty=args.skip_empty,
        backend=args.backend,
        overwrite=args.overwrite,
        split=args.split,
        template=args.template,
        shuffle_docs=args.shuffle_docs,
        progress=args.progress,
        on_issue=on_issue,
    )
    if args.loss_on is not None:
        options["loss_on"] = args.loss_on
    if args.fields is not None:
        options["fields"] = args.fields
    if args.engine != "local":
        from mmpack._src.ingest.distributed import build_distributed
        from mmpack._src.ingest.report import counted
        from mmpack._src.joins.parts import JoinedStore

        report = build_distributed(
            args.inputs,
            args.output,
            engine=args.engine,
            scheduler=args.scheduler,
            n_workers=args.workers,
            part_bytes=args.part_mb << 20,
            **options,
        )
        assert isinstance(report.store, JoinedStore)  # build_distributed opens the joined parts
        parts = counted(len(report.store.parts), "part")
        print(report.summary() + f" ({parts}, engine {args.engine})")
        _print_targets(report.store, args.loss_on)
        return 0
    report = ingest(
        args.inputs,
        args.output,
        text_extensions=[e for group in args.text_extensions or () for e in group],
        workers=args.workers,
        **options,
    )
    print(report.summary())
    _print_targets(report.store, args.loss_on)
    return 0


def _check_chat_flags(args: argparse.Namespace) -> None:
    """``build --loss-on``: a --tokenizer, and none of the flags of plain text."""
    if args.tokenizer is None:
        raise ValueError("--loss-on needs --tokenizer: a transformers folder with a chat template")
    given = [
        flag
        for flag, on in (
            ("--template", args.template is not None),
            ("--lines", args.lines),
            ("--field", args.field != "text"),
        )
        if on
    ]
    if given:
        raise ValueError(
            f"--loss-on reads chat records (messages, or prompt and completion); drop "
            f"{', '.join(given)}"
        )


def _print_targets(store: Any, loss_on: str | None) -> None:
    """A chat build's second line: the conversations and how many tokens are targets."""
    if loss_on is None:
        return
    import numpy as np

    mask = store.loss_mask
    assert mask is not None
    step = 1 << 24
    targets = sum(
        int(np.count_nonzero(mask.read_range(lo, min(lo + step, mask.num_tokens))))
        for lo in range(0, mask.num_tokens, step)
    )
    print(
        f"{len(store):,} conversations, {store.num_tokens:,} tokens, {targets:,} of them "
        f"targets (--loss-on {loss_on})"
    )


def _formats(args: argparse.Namespace):
    """``--format`` or the ``--format-for PATTERN=FORMAT`` patterns (not both)."""
    if not args.format_for:
        return args.format
    if args.format is not None:
        raise ValueError("give --format or --format-for, not both")
    patterns = {}
    for item in args.format_for:
        pattern, sep, kind = item.rpartition("=")
        if not sep or not pattern:
            raise ValueError(
                f"--format-for expects PATTERN=FORMAT (e.g. '*.py=text'), got {item!r}"
            )
        patterns[pattern] = kind
    return patterns


# --------------------------------------------------------------------------------- join
def _cmd_join(args: argparse.Namespace) -> int:
    from mmpack._src.joins.join import join

    store = join(
        args.parts,
        args.output,
        append=args.append,
        overwrite=args.overwrite,
        mixed_tokenizers=args.mixed_tokenizers,
    )
    index = sum(f.stat().st_size for f in Path(args.output).iterdir() if f.is_file())
    token_bytes = store.num_tokens * store.dtype.itemsize
    share = f" ({index / token_bytes:.2%} of the token bytes)" if token_bytes else ""
    print(
        f"{store.path}: {len(store.parts)} parts, {len(store):,} documents, "
        f"{store.num_tokens:,} tokens ({store.dtype.name}); wrote {_fmt_bytes(index)} of "
        f"manifest and offsets{share}; fingerprint {store.fingerprint}"
    )
    return 0


# --------------------------------------------------------------------------------- demo, bench
def _cmd_demo(args: argparse.Namespace) -> int:
    from mmpack._src.cli.demo import run_demo

    run_demo(out=args.out, overwrite=args.overwrite)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    root = _benchmarks_root()
    if root is None:
        raise FileNotFoundError(
            "benchmarks/ is not next to this mmpack (the benchmarks ship with the source "
            "checkout, not the installed package)"
        )
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.bench_args], cwd=root)


def _flag_speller(parser: argparse.ArgumentParser):
    """Spell a :class:`~mmpack.errors.Param` as the flag of ``parser`` whose ``dest`` is its name
    (``--overwrite``, ``--on-error skip``, ``--text-ext .sql``, ``--eot store``), or as its
    ``--no-`` flag when the value is the one that flag sets (``check_vocab=False`` ->
    ``--no-check-vocab``, ``eot=None`` -> ``--no-eot``); the Python spelling when the
    subcommand has no such flag."""
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if action.option_strings:
            actions.setdefault(action.dest, []).append(action)

    def spell(param) -> str:
        candidates = actions.get(param.name)
        if not candidates:
            return str(param)
        for action in candidates:  # a switch that sets this very value: --overwrite, --no-eot
            if param.has_value and action.nargs == 0 and _same(action.const, param.value):
                return max(action.option_strings, key=len)
        action = next(
            (a for a in candidates if not a.option_strings[0].startswith("--no-")), candidates[0]
        )
        flag = max(action.option_strings, key=len)
        if not param.has_value:
            return flag
        value = param.value
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        return f"{flag} {value}"

    return spell


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (``True`` is not ``1``)."""
    return type(a) is type(b) and a == b


_IO_HINTS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def _one_line(exc: BaseException, parser: argparse.ArgumentParser) -> str:
    """The message of an expected error, on one line, in this command's terms."""
    from mmpack.errors import render_message

    if (
        isinstance(exc, OSError)
        and exc.errno is not None
        and getattr(exc, "message_parts", None) is None
    ):
        # "[Errno 28] No space left on device: 'x'" -> "No space left on device: 'x' (...)"
        where = "" if exc.filename is None else f": {str(exc.filename)!r}"
        hint = _IO_HINTS.get(exc.errno)
        msg = f"{exc.strerror or exc}{where}" + (f" ({hint})" if hint else "")
    else:
        msg = render_message(exc, _flag_speller(parser))
    return " ".join(msg.split()) or type(exc).__name__


def _handlers() -> dict[str, Callable[[argparse.Namespace], int]]:
    """The handler of each subcommand (read at each call: a test may replace one)."""
    return {
        "build": _cmd_build,
        "info": _cmd_info,
        "show": _cmd_show,
        "pack": _cmd_pack,
        "verify": _cmd_verify,
        "export": _cmd_export,
        "cp": _cmd_cp,
        "join": _cmd_join,
        "demo": _cmd_demo,
        "bench": _cmd_bench,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the ``mmpack`` command; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == ["bench"] and argv[1:2] not in (["-h"], ["--help"]):
        # Everything after 'bench' belongs to python -m benchmarks, options included.
        args = parser.parse_args(["bench"])
        args.bench_args = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    else:
        args = parser.parse_args(argv)
    from mmpack.errors import MmpackError

    try:
        return _handlers()[args.command](args)
    except BrokenPipeError:  # e.g. `mmpack info STORE | head` (an OSError: caught first)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (MmpackError, OSError, ValueError, IndexError, ImportError) as exc:
        print(f"{_PROG}: error: {_one_line(exc, args.parser)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
