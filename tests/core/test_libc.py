"""The libc lookup (mmpack._src.core.libc): found once per process, never again by a later build."""

from __future__ import annotations

import numpy as np

import mmpack


def test_a_build_looks_libc_up_once_per_process(tmp_path, monkeypatch):
    """``ctypes.util.find_library`` spawns ``ldconfig`` (~10 ms): a second build never calls it."""
    import ctypes.util

    docs = [np.arange(j, j + 3000, dtype=np.uint16) for j in range(200)]
    mmpack.build(tmp_path / "s", docs, fsync=False)
    mmpack.build(tmp_path / "s", docs, fsync=False, overwrite=True)  # the swap's libc lookup

    def spawn(name):
        raise AssertionError(f"find_library({name!r}) during a build")

    monkeypatch.setattr(ctypes.util, "find_library", spawn)
    store = mmpack.build(tmp_path / "s", docs, fsync=False, overwrite=True)
    assert len(store) == 200
