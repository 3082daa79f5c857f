"""The subset flags (mmpack._src.cli.subsets): --where and --split/--split-part select the
documents a command reads; a bad value or a split without its part is refused."""

from __future__ import annotations

import pytest

import mmpack

pytestmark = pytest.mark.usefixtures("cache_home")


def test_the_cli_reads_a_subset(tmp_path, capsys):
    from mmpack.cli import main

    mmpack.build(tmp_path / "s", [[1, 2], [3], [4, 5, 6]], fields={"source": [3, 1, 3]})
    assert main(["info", str(tmp_path / "s"), "--where", "source=3"]) == 0
    out = capsys.readouterr().out
    assert "subset       2 of the 3 documents" in out
    assert main(["info", str(tmp_path / "s"), "--split", "a=0.5,b=0.5", "--split-part", "b"]) == 0
    assert main(["info", str(tmp_path / "s"), "--where", "source=x"]) != 0
    assert "holds numbers" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "s"), "--split", "a=0.5,b=0.5"]) != 0
    assert "--split-part" in capsys.readouterr().err
    assert main(["cp", str(tmp_path / "s"), str(tmp_path / "c"), "--where", "source=1"]) == 0
    assert mmpack.open(tmp_path / "c")[0].tolist() == [3]
