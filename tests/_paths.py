"""Where the tests live, whatever the depth of the test file: the repository root, ``tests/`` (on
``sys.path`` by ``conftest.py``, for the ``_`` helpers and ``reference``) and ``tests/data``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
