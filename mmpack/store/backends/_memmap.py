"""The default backend: raw little-endian arrays mapped with ``numpy.memmap``.

Layout: ``mmpack.json`` (metadata), ``tokens.bin``, ``offsets.bin``.  Opening maps both files
read-only (no data is read); a range read is a slice of the mapping, so random access costs a
page-cache copy and nothing else.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
from mmpack.errors import FormatError
from mmpack.store.format import META_FILE, OFFSETS_DTYPE, StoreMeta, write_json_atomic


def map_readonly(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """Map ``count`` items of ``dtype`` from ``path``, after checking the file size."""
    expected = count * dtype.itemsize
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FormatError(f"{path} is missing: the store is incomplete") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FormatError(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)}): "
                          "the store is damaged; rebuild it")
    f = os.fdopen(fd, "rb")
    with f:  # size and mapping from one open file: a concurrent rebuild cannot slip between
        actual = st.st_size
        if actual != expected:
            raise FormatError(
                f"{path} holds {actual} bytes but the metadata says {count} items of {dtype} "
                f"({expected} bytes): the file is truncated or was replaced"
            )
        if count == 0:
            return np.empty(0, dtype=dtype)
        arr = np.memmap(f, dtype=dtype, mode="r", shape=(count,))
    return arr.view(np.ndarray)


class MemmapBackend(Backend):
    name = "memmap"

    def __init__(self, path: Path, meta: StoreMeta) -> None:
        super().__init__(path, meta)
        self.tokens = map_readonly(path / TOKENS_FILE, meta.dtype, meta.num_tokens)
        self._offsets = map_readonly(path / OFFSETS_FILE, OFFSETS_DTYPE, meta.num_docs + 1)

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        meta_path = path / META_FILE
        if not meta_path.is_file():
            if os.path.lexists(meta_path):  # a FIFO would block the read: never open it
                raise FormatError(f"{meta_path} is not a regular file: the store is damaged")
            return None
        try:
            return json.loads(meta_path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{meta_path} is not valid JSON: {exc}") from None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        write_json_atomic(tmpdir / META_FILE, meta.to_json())

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def read_range(self, start: int, stop: int) -> np.ndarray:
        return self.tokens[start:stop]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens, starts
