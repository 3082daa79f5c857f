"""mmpack: a memory-mapped, random-access token index for language-model training."""

from mmpack.errors import FormatError, MmpackError, StateMismatchError
from mmpack.store import TokenStore, build
from mmpack.store import open_store as open
from mmpack.window import WindowDataset

__all__ = [
    "FormatError",
    "MmpackError",
    "StateMismatchError",
    "TokenStore",
    "WindowDataset",
    "build",
    "open",
]

assert sorted(__all__) == __all__
