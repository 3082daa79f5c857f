"""Specification of :mod:`mmpack._src.sampling.weights`: weights quantized to integer quotas of a
period dividing ``RESOLUTION``, within 1.5 / RESOLUTION of the normalized weights, a positive
weight never dropped.

Run: ``.venv/bin/python -m pytest tests/sampling/test_weights.py -q``.
"""

from __future__ import annotations

import numpy as np
from _mixture_sources import mixture_weights
from hypothesis import given

from mmpack._src.sampling.mixture import RESOLUTION, quantize_weights


@given(mixture_weights)
def test_quantization(weights):
    quotas, period = quantize_weights(weights)
    assert quotas.sum() == period and RESOLUTION % period == 0
    assert ((quotas > 0) == (np.asarray(weights) > 0)).all()
    w = np.asarray(weights) / sum(weights)
    assert np.abs(quotas / period - w).max() <= 1.5 / RESOLUTION + 1e-12 or (
        w[w > 0].min() < 1 / RESOLUTION
    )


def test_quantization_examples():
    assert quantize_weights([0.7, 0.3])[1] == 10
    np.testing.assert_array_equal(quantize_weights([1, 2])[0], [333333, 666667])
    np.testing.assert_array_equal(quantize_weights([0.999, 0.0005, 0.0005])[0], [1998, 1, 1])
    quotas, _ = quantize_weights([1e-12, 1.0, 0.0])
    assert quotas[0] == 1 and quotas[2] == 0  # a positive weight is never dropped
