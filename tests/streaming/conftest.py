"""Fixtures of the streaming tests: a few random documents."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def docs():
    rng = np.random.default_rng(5)
    return [rng.integers(1, 50, size=int(n)).tolist() for n in rng.integers(1, 12, size=30)]
