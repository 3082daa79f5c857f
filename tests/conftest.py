"""Shared fixtures and hypothesis profiles.

Run the suite with ``make test``.  ``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) runs every
property test with fewer examples so CI stays within its time budget; nothing is skipped.
``HYPOTHESIS_PROFILE=nojit`` is the run of the kernel/twin table (tests/test_reference.py) as
plain Python (``NUMBA_DISABLE_JIT=1``, ``make test``'s last step): a few examples per kernel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The suite runs with ``--import-mode=importlib`` (pyproject.toml): test files are imported by path,
# and only tests/ itself is put on sys.path, for the shared helpers (``_s3``, ``_orders``, ...) and
# ``reference``.  The layer folders (tests/torch/, tests/store/, ...) hold no ``__init__.py``, so
# none of them is a package that could shadow an installed one (tests/test_layers.py checks).
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "nojit",
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


import pytest


def pytest_collection_modifyitems(items):
    """Every test that uses the S3 server carries the ``s3`` marker (``-m "not s3"`` works)."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """mmpack's cache folder inside the test's folder (``cache-home``), never ~/.cache."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 server on 127.0.0.1 (``tests/_s3.py``), started once per session and
    stopped by its pid; yields the :class:`_s3.S3Server` (``.options`` for mmpack)."""
    from _s3 import S3Server

    server = S3Server.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()
