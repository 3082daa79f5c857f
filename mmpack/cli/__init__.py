"""The ``mmpack`` command (top layer): ``main.py`` parses and dispatches, ``demo.py`` is the
demo and the packing comparison shared with ``mmpack pack``."""

from __future__ import annotations

from mmpack.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
