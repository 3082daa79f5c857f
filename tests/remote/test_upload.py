"""The upload's check table: XXH64 of every check page of the token file, read in any chunking,
its CRC-32 per stripe in the record; a record naming another digest, or without those CRC-32s,
is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _remote_stores import _corpus
from _s3 import (
    isolate_cache_and_env,
)

import mmpack
from mmpack.errors import (
    FormatError,
)


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def test_check_table_is_the_xxh64_of_every_check_page(tmp_path):
    """The uploaded table holds XXH64 (seed 0) of each 16 KiB page of ``tokens.bin`` (the
    reference package, page by page); a record naming another digest, or none, is refused."""
    import xxhash

    from mmpack._src.remote.upload import check_table

    store = mmpack.build((tmp_path / "remote").as_uri(), _corpus(seed=5))
    remote = store.meta["remote"]
    assert (remote["check_object"], remote["check_digest"]) == ("tokens.xxh", "xxh64")
    data = tmp_path / "remote" / remote["data"]
    tokens, page = (data / "tokens.bin").read_bytes(), remote["check_block_bytes"]
    want = [xxhash.xxh64_intdigest(tokens[a : a + page]) for a in range(0, len(tokens), page)]
    assert len(want) > 1 and len(tokens) % page  # several pages, the last one short
    assert np.frombuffer((data / "tokens.xxh").read_bytes(), "<u8").tolist() == want
    for chunk in (page, 3 * page, 3 * page + 5):  # read in several chunks: the same table
        assert check_table(data / "tokens.bin", page, chunk) == (data / "tokens.xxh").read_bytes()
    meta = tmp_path / "remote" / "mmpack.json"
    raw = json.loads(meta.read_text())
    raw["remote"]["check_digest"] = "crc32"  # another kind of table: refused, named
    meta.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="check_digest 'crc32' is not 'xxh64'"):
        mmpack.open((tmp_path / "remote").as_uri(), cache_dir=tmp_path / "c")
    del raw["remote"]["check_digest"]
    meta.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="malformed remote record"):
        mmpack.open((tmp_path / "remote").as_uri(), cache_dir=tmp_path / "c2")


def test_the_record_holds_the_tables_crc32_per_stripe(tmp_path, monkeypatch):
    """``check_crc32s``: the CRC-32 of each ``check_stripe_bytes`` of ``tokens.xxh`` (16 MiB by
    default); a record of one CRC-32 of the whole table is refused, saying to upload again."""
    import mmpack._src.remote.upload as upload
    from mmpack._src.store.format import STRIPE_BYTES, crc32_blocks

    for stripe in (STRIPE_BYTES, 64):
        monkeypatch.setattr(upload, "CHECK_STRIPE_BYTES", stripe)
        root = tmp_path / f"r{stripe}"
        store = mmpack.build(root.as_uri(), _corpus(seed=5))
        remote = store.meta["remote"]
        table = (root / remote["data"] / "tokens.xxh").read_bytes()
        assert remote["check_stripe_bytes"] == stripe
        assert remote["check_crc32s"] == crc32_blocks(table, stripe)
        assert len(remote["check_crc32s"]) == (
            1 if stripe == STRIPE_BYTES else -(-len(table) // 64)
        )
    meta = root / "mmpack.json"
    raw = json.loads(meta.read_text())
    del raw["remote"]["check_crc32s"], raw["remote"]["check_stripe_bytes"]
    raw["remote"]["check_crc32"] = 0  # the record of an earlier upload
    meta.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="no check_stripe_bytes and check_crc32s .* upload the"):
        mmpack.open(root.as_uri(), cache_dir=tmp_path / "c")
