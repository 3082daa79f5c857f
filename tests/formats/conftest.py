"""Fixtures of the foreign-format tests."""

from __future__ import annotations

import pytest

from mmpack._src.formats import foreign


@pytest.fixture
def foreign_cache(tmp_path, monkeypatch):
    """Derived files (indexes, checksum sidecars) in a cache inside the test's folder, never
    ~/.cache; files written by a test are seconds old at most: their index is cached all the
    same."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(foreign, "INDEX_SETTLE_NS", 0)
