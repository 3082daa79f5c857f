"""``mmpack pack`` and ``mmpack verify``, run as users run them."""

from __future__ import annotations

import json

import numpy as np
from _cli import assert_one_line_error, mmpack_cmd

import mmpack
import mmpack.errors
from mmpack.cli import compare_packing


def test_pack_compares_algorithms_and_baselines(seed_store):
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for name in (
        "best-fit decreasing",
        "online best fit",
        "next fit",
        "pad (1 doc/row)",
        "concat + chunk",
    ):
        assert name in out
    # the seed store records no tokenizer: by default (eot 'store'), as its views, no eot
    assert "108 tokens to place (without an eot), seqlen 16" in out
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--eot", 420)
    assert "118 tokens to place (with an eot (420) per document), seqlen 16" in res.stdout
    res = mmpack_cmd("pack", seed_store, "--seqlen", 16, "--json", "--no-eot")
    got = json.loads(res.stdout)
    lens = mmpack.open(seed_store).doc_lens
    want = compare_packing(lens, 16, add_eot=False, algorithms=("bfd", "online", "nextfit"))
    assert [m["method"] for m in got["methods"]] == ["bfd", "online", "nextfit", "pad", "chunk"]
    for g, w in zip(got["methods"], want):
        assert (g["rows"], g["tokens"], g["padding"]) == (w["rows"], w["tokens"], w["padding"])
    pad = got["methods"][3]
    assert pad["rows"] == 10 and pad["tokens"] == 108  # one row per document, no eot


def test_verify_ok_and_corrupt(tmp_path):
    store = mmpack.build(tmp_path / "s", [np.arange(1000) % 200, [1, 2, 3]])
    res = mmpack_cmd("verify", store.path)
    assert res.returncode == 0 and ": ok, 2 checksum blocks" in res.stdout
    assert store.fingerprint in res.stdout
    tokens = tmp_path / "s" / "tokens.bin"
    data = bytearray(tokens.read_bytes())
    data[500] ^= 0xFF
    tokens.write_bytes(bytes(data))
    res = mmpack_cmd("verify", store.path)
    assert_one_line_error(res, "tokens stripe 0", "checksum")
