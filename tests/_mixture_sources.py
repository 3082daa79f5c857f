"""Fake sources and weights for the mixture tests: samples that name their source and item, one
kind with a recording ``__getitems__``; lists of 2 to 8 weights (some zero, some tiny) that
hypothesis draws; two stores whose views' ``cu_seqlens`` differ in shape."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from mmpack.sampling import uniform_bounds


class PlainSource:
    """``n`` samples; sample ``j`` is ``{"x": [tag, j], "y": [j] * width}`` (no ``__getitems__``)."""

    def __init__(self, n: int, tag: int, width: int = 3) -> None:
        self.n, self.tag, self.width = n, tag, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        if not 0 <= j < self.n:
            raise IndexError(j)
        return {
            "x": np.array([self.tag, j], dtype=np.int64),
            "y": np.full(self.width, j, dtype=np.int64),
        }

    def block_bounds(self, block_bytes: int) -> np.ndarray:
        """Blocks of 4 items (for ``Mixture(block_bytes=...)``)."""
        return uniform_bounds(self.n, 4)


class FakeSource(PlainSource):
    """:class:`PlainSource` with a ``__getitems__`` that records its calls."""

    def __init__(self, n: int, tag: int, width: int = 3) -> None:
        super().__init__(n, tag, width)
        self.batch_calls: list[list[int]] = []

    def __getitems__(self, js: list[int]) -> list[dict[str, np.ndarray]]:
        self.batch_calls.append(list(js))
        return [self[j] for j in js]


_weight = st.one_of(
    st.floats(0.0, 1.0),
    st.integers(0, 10).map(float),
    st.floats(-6, 0).map(lambda e: 10.0**e),
)
mixture_weights = st.lists(_weight, min_size=2, max_size=8).filter(lambda w: sum(w) > 0)


def two_stores(tmp_path):
    """Two stores whose documents differ in number and length, so the ``cu_seqlens`` of sample 0
    differ in length between their views."""
    from mmpack import build

    rng = np.random.default_rng(13)
    a = build(
        tmp_path / "a", [rng.integers(1, 50, size=int(n)) for n in rng.integers(1, 9, size=200)]
    )
    b = build(
        tmp_path / "b", [rng.integers(1, 50, size=int(n)) for n in rng.integers(20, 70, size=80)]
    )
    return a, b
