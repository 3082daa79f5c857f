"""The checksummed array file (:mod:`mmpack._src.formats.arrayfile`): round trip, mapped read-only,
and every damage refused."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from mmpack._src.formats.arrayfile import load_arrays, save_arrays
from mmpack.errors import FormatError, StateMismatchError

KEY = {"what": "test", "n": 3}


def _arrays():
    return {
        "a": np.arange(10, dtype=np.int32),
        "pairs": np.arange(12, dtype=np.int64).reshape(6, 2),
        "u": np.array([7, 8, 9], dtype=np.uint32),
        "empty": np.empty(0, dtype=np.int64),
    }


def test_round_trip_is_mapped_and_exact(tmp_path):
    path = tmp_path / "x.mmarr"
    save_arrays(path, KEY, _arrays(), {"epochs": 2})
    got, info = load_arrays(path, dict(KEY))
    assert info == {"epochs": 2}
    for name, want in _arrays().items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        np.testing.assert_array_equal(got[name], want)
    assert not got["a"].flags.writeable  # a read-only mapping of the file
    assert os.listdir(tmp_path) == ["x.mmarr"]  # no temporary file left


def _header(raw):
    return json.loads(raw[16 : 16 + int.from_bytes(raw[8:16], "little")])


@pytest.mark.parametrize("where", ["header", "data", "magic", "truncated"])
def test_damage_is_refused(tmp_path, where):
    path = tmp_path / "x.mmarr"
    save_arrays(path, KEY, _arrays())
    raw = bytearray(path.read_bytes())
    if where == "header":
        raw[20] ^= 1
    elif where == "data":
        raw[_header(raw)["arrays"]["pairs"]["offset"] + 9] ^= 1
    elif where == "magic":
        raw[0] ^= 1
    else:
        raw = raw[: _header(raw)["arrays"]["u"]["offset"] + 4]
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError):
        load_arrays(path, KEY)


def test_another_key_is_refused(tmp_path):
    path = tmp_path / "x.mmarr"
    save_arrays(path, KEY, _arrays())
    with pytest.raises(StateMismatchError, match="other data or other parameters"):
        load_arrays(path, {**KEY, "n": 4})


def test_a_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "x.mmarr"
    with pytest.raises(TypeError):
        save_arrays(path, {"bad": object()}, _arrays())  # the key is not JSON
    assert os.listdir(tmp_path) == []


def test_both_checksummed_writers_publish_through_one_helper(tmp_path, monkeypatch):
    """The array file and the plan file are written by one helper
    (:func:`mmpack._src.store.checked_file.write_checked_file` over
    :func:`mmpack._src.store.format.atomic_file`): a write that fails after its bytes are written
    leaves the previous file whole under its name and no temporary file beside it."""
    import contextlib

    import mmpack._src.store.checked_file as checked_file
    import mmpack._src.store.format as store_format
    from mmpack.packing import PlanSpec, build_plan, plan_cache_key, save_plan

    plan = build_plan(np.array([3, 4, 5]), 8, add_eot=True)
    key = plan_cache_key("f" * 16, PlanSpec(8, add_eot=True))
    writers = {
        "x.mmarr": lambda path: save_arrays(path, KEY, _arrays()),
        "p.mmplan": lambda path: save_plan(plan, path, key),
    }
    for name, write in writers.items():
        write(tmp_path / name)
    before = {name: (tmp_path / name).read_bytes() for name in writers}
    plain = tmp_path / "plain"
    plain.write_bytes(b"")  # the permissions of an ordinary new file (the umask's)
    for name in writers:
        assert (tmp_path / name).stat().st_mode == plain.stat().st_mode
    plain.unlink()

    published = []

    @contextlib.contextmanager
    def full_disk(path, **kwargs):
        published.append(os.path.basename(path))
        with store_format.atomic_file(path, **kwargs) as f:
            yield f
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(checked_file, "atomic_file", full_disk)
    for name, write in writers.items():
        with pytest.raises(OSError, match="No space left"):
            write(tmp_path / name)
        assert (tmp_path / name).read_bytes() == before[name]
    assert sorted(os.listdir(tmp_path)) == sorted(writers) == sorted(published)
