"""Shared fixtures and hypothesis profiles.

Run the suite with ``make test``.  ``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) runs every
property test with fewer examples so CI stays within its time budget; nothing is skipped.
"""

from __future__ import annotations

import os

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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
