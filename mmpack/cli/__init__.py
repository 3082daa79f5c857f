"""The ``mmpack`` command (top layer).

::

    commands.py          main(): dispatch, error messages in flag terms; build, join, demo, bench
    inspect_commands.py  the subcommands that describe a store: info, show
    store_commands.py    the subcommands that work on a store: pack, verify, export, cp
    parser.py            build_parser(): one function per subcommand
    build_options.py     the options of build: what it reads, how it tokenizes, where it runs
    arguments.py         argparse types and the options several subcommands share
    demo.py              the demo and the packing comparison shared with ``mmpack pack``

Public here: :func:`main` and :func:`build_parser`, and the two demo helpers notebooks and
scripts use, :func:`compare_packing` (the efficiency table of ``mmpack pack``) and
:func:`stdlib_sources` (a real corpus every Python installation carries).  The helpers load on
first use, so ``mmpack --help`` never imports numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmpack.cli.commands import build_parser, main

if TYPE_CHECKING:
    from mmpack.cli.demo import compare_packing, stdlib_sources

__all__ = ["build_parser", "compare_packing", "main", "stdlib_sources"]

_LAZY = {"compare_packing", "stdlib_sources"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from mmpack.cli import demo

        value = getattr(demo, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpack.cli' has no attribute {name!r}")
