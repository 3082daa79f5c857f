"""The ``mmpack`` command (top layer): ``commands.py`` parses and dispatches, ``demo.py`` is the
demo and the packing comparison shared with ``mmpack pack``."""

from __future__ import annotations

from mmpack.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
