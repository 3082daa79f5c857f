"""The command-line parser (mmpack._src.cli.parser): every subcommand's help is complete, each
argument with its help."""

from __future__ import annotations

import argparse

import pytest
from _cli import SUBCOMMANDS

from mmpack._src.cli.commands import build_parser
from mmpack.cli import main


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_complete_help(sub, capsys):
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: mmpack {sub}")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in subparsers.choices[sub]._actions:
        assert action.help and action.help != argparse.SUPPRESS, (sub, action.dest)
