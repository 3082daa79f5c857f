"""The ``mmpack`` command (top layer).

::

    commands.py        main(): dispatch, error messages in flag terms; build, join, demo, bench
    store_commands.py  the subcommands over an existing store: info, show, pack, verify, export
    parser.py          build_parser(): one function per subcommand
    arguments.py       argparse types and the options several subcommands share
    demo.py            the demo and the packing comparison shared with ``mmpack pack``
"""

from __future__ import annotations

from mmpack.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
