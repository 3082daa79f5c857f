"""Timing helpers shared by the benchmark modules: warm up, repeat, report median and p99."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def per_call_seconds(fn: Callable[[], Any], calls: int, warmup: int = 3) -> np.ndarray:
    """Seconds taken by each of ``calls`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = np.empty(calls)
    clock = time.perf_counter
    for k in range(calls):
        t0 = clock()
        fn()
        out[k] = clock() - t0
    return out


def per_item_seconds(fn: Callable[[Any], Any], items: Any, warmup: int = 100) -> np.ndarray:
    """Seconds taken by ``fn(item)`` for each item (after ``warmup`` untimed items)."""
    for item in items[:warmup]:
        fn(item)
    out = np.empty(len(items))
    clock = time.perf_counter_ns
    for k, item in enumerate(items):
        t0 = clock()
        fn(item)
        out[k] = clock() - t0
    return out * 1e-9


def median_p99(seconds: np.ndarray) -> tuple[float, float]:
    return float(np.median(seconds)), float(np.percentile(seconds, 99))


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for a benchmark to print next to its figures."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
