"""The join manifest (mmpack._src.joins.manifest): small, relative to the join and movable with
its parts; a malformed field is named; a manifest that makes a join contain itself is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from _joins import corpus as _corpus
from _joins import edit_manifest as _edit_manifest
from _joins import parts_on_disk as _parts_on_disk

import mmpack
from mmpack._src.joins.parts import JOIN_FILE
from mmpack.errors import FormatError


def test_manifest_is_small_relative_and_movable(tmp_path):
    docs = _corpus(200)
    root = tmp_path / "a"
    root.mkdir()
    paths = _parts_on_disk(root, docs, [0, 100, 200])
    j = mmpack.join(paths, root / "j")
    assert j.part_locations == ["../p0", "../p1"]
    written = sum(f.stat().st_size for f in (root / "j").iterdir())
    offsets_bytes = (len(j) + 1) * 8
    assert written < offsets_bytes + 2000
    shutil.move(root, tmp_path / "b")
    moved = mmpack.open(tmp_path / "b" / "j")
    assert moved.fingerprint == j.fingerprint and len(moved) == 200


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw.update(version=2), "join version 2 was written by a newer mmpack"),
        (lambda raw: raw.update(version=True), "invalid join version True"),
        (lambda raw: raw.update(version="1"), "invalid join version '1'"),
        (lambda raw: raw["parts"][0].update(num_docs=-1), "num_docs must be a non-negative"),
        (lambda raw: raw["offsets"].update(block_bytes=1.5), "block_bytes must be a non-negative"),
    ],
)
def test_malformed_manifest_names_the_field(tmp_path, edit, message):
    """The manifest's version and counts are checked by the store format's own checks (one
    wording for the store's metadata and the join's manifest)."""
    paths = _parts_on_disk(tmp_path, _corpus(), [0, 30, 60])
    mmpack.join(paths, tmp_path / "j")
    manifest = tmp_path / "j" / JOIN_FILE
    raw = json.loads(manifest.read_text())
    edit(raw)
    manifest.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match=message):
        mmpack.open(tmp_path / "j")


def test_a_cyclic_manifest_written_elsewhere_is_a_format_error(tmp_path):
    docs = _corpus()
    mmpack.build(tmp_path / "p", docs)
    mmpack.join([tmp_path / "p"], tmp_path / "A")
    mmpack.join([tmp_path / "A"], tmp_path / "B")
    # A's manifest now names B (same counts and fingerprint: only the location changes)
    _edit_manifest(tmp_path / "A", lambda raw: raw["parts"][0].update(location="../B"))
    for name in ("A", "B"):
        with pytest.raises(FormatError, match="contains itself"):
            mmpack.open(tmp_path / name)
    _edit_manifest(tmp_path / "A", lambda raw: raw["parts"][0].update(location="."))
    with pytest.raises(FormatError, match="contains itself"):
        mmpack.open(tmp_path / "A")
