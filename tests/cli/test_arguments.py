"""The flags' types and messages (mmpack._src.cli.arguments): a bad argument exits 2 with one
usage error, in the process and in a subprocess; an out-of-range value names its flag, not the
Python parameter."""

from __future__ import annotations

import pytest
from _cli import mmpack_cmd

from mmpack.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["build", "x.txt"],  # -o is required
        ["build", "x.txt", "-o", "s", "--workers", "0"],
        ["build", "x.txt", "-o", "s", "--on-error", "maybe"],
        ["show", "s", "-i", "0"],  # --seqlen is required
        ["show", "s", "--seqlen", "-3", "-i", "0"],
        ["pack", "s", "--seqlen", "many"],
        ["info"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("mmpack")
    assert "error:" in err


def test_bad_arguments_exit_2_in_a_subprocess():
    res = mmpack_cmd("show", "s", "--seqlen", "x", "-i", "0")
    assert res.returncode == 2
    assert "argument --seqlen: expected an integer, got 'x'" in res.stderr


@pytest.mark.parametrize(
    ("argv", "flag", "text"),
    [
        (
            ["show", "s", "--seqlen", str(2**31), "-i", "0"],
            "--seqlen",
            "<= 2147483647 (cu_seqlens are int32)",
        ),
        (["pack", "s", "--seqlen", str(2**31)], "--seqlen", "<= 2147483647"),
        (
            ["show", "s", "--seqlen", "8", "-i", "0", "--eot", str(2**63)],
            "--eot",
            "(ids are int64)",
        ),
        (["show", "s", "--seqlen", "8", "-i", "0", "--pad-id", str(2**63)], "--pad-id", "int64"),
        (["show", "s", "--seqlen", "8", "-i", "0", "--stride", str(2**70)], "--stride", "int64"),
    ],
)
def test_out_of_range_values_name_their_flag(argv, flag, text, capsys):
    """These reached the library, whose messages spoke Python (`seqlen=2147483648 does not fit`,
    `eot=9223372036854775808 does not fit in int64`)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in last and text in last and f"{flag[2:]}=" not in last
