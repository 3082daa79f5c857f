"""Tiny picklable datasets for DataLoader tests (top level so "spawn" workers can import them)."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset

__all__ = ["IndexDataset"]


class IndexDataset(Dataset):
    """``n`` samples; sample ``i`` is ``np.array([i])`` (int64)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.array([i], dtype=np.int64)
