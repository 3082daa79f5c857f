"""The checksum sidecar of a store over other tools' files, and verify-on-read against it.

Other tools' files carry no checksums, so mmpack records its own: ``checksums.json`` in the
store's cache folder (never beside the user's files) holds, per source file, its size and the
CRC-32 of every 16 MiB block of its bytes (the first block includes any header).  The first
``verify()`` (or the first open with ``verify_reads=True``) records it, trusting the files then;
later ones compare against it.  A cache folder that cannot be written only warns: the sums are
then kept in memory for the life of the store object.

:class:`SidecarReads` is a store's :class:`~mmpack._src.store.integrity.ReadChecker` with
``verify_reads=True``: the first read that touches a block of the token file computes that
block's CRC-32 from the mapping the reads are served from (and, for a signed file, checks that
none of its ids is negative), compares it with the sidecar and marks it in a bitmap; later reads
of the block cost one bitmap lookup.  Cost: one CRC-32 per 16 MiB block once (~10 ms), like the
verify-on-read of mmpack's own stores.
"""

from __future__ import annotations

import json
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mmpack._src.formats.token_ids import check_ids_nonnegative
from mmpack._src.store.format import STRIPE_BYTES, write_json_atomic
from mmpack.errors import FormatError

__all__ = [
    "CHECKSUM_FILE",
    "SidecarReads",
    "compare_sums",
    "file_sums",
    "load_sidecar",
    "save_sidecar",
]

CHECKSUM_FILE = "checksums.json"
Sums = tuple[int, list[int]]
"""A file's ``(size, CRC-32 of each STRIPE_BYTES block)``."""


def file_sums(path: Path, on_block: Callable[[int], None] | None = None) -> Sums:
    """Read ``path`` once: its size and the CRC-32 of each 16 MiB block (``on_block`` is told
    each block's size: a progress bar)."""
    crcs = []
    size = 0
    buf = bytearray(STRIPE_BYTES)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = 0
            while n < STRIPE_BYTES:  # fill the whole block: short reads must not shift blocks
                got = f.readinto(memoryview(buf)[n:])
                if not got:
                    break
                n += got
            if not n:
                break
            crcs.append(zlib.crc32(memoryview(buf)[:n]))
            size += n
            if on_block is not None:
                on_block(n)
    return size, crcs


def load_sidecar(sidecar: Path) -> dict[str, Sums] | None:
    """The recorded sums by file name, or None when there is no sidecar yet;
    :class:`FormatError` for one that cannot be read."""
    if not sidecar.is_file():
        return None
    try:
        raw = json.loads(sidecar.read_text())
        if raw.get("algorithm", "crc32") != "crc32" or raw.get("block_bytes") != STRIPE_BYTES:
            raise ValueError("another algorithm or block size")
        return {
            name: (int(size), [int(c) for c in crcs]) for name, (size, crcs) in raw["files"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(
            f"{sidecar}: unreadable checksum sidecar ({exc}); delete it to record a new one"
        ) from None


def save_sidecar(sidecar: Path, fingerprint: str, sums: dict[str, Sums]) -> bool:
    """Record ``sums`` at ``sidecar`` (atomically); a folder that cannot be written (read-only,
    full, not a folder) warns and returns False: the caller keeps the sums in memory."""
    try:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            sidecar,
            {
                "algorithm": "crc32",
                "block_bytes": STRIPE_BYTES,
                "fingerprint": fingerprint,
                "files": {name: [size, crcs] for name, (size, crcs) in sums.items()},
            },
        )
    except OSError as exc:
        warnings.warn(
            f"could not keep the checksum sidecar {sidecar} ({exc}): the files were read and "
            "their checksums are kept in memory for this store only; set cache_dir= or "
            "$MMPACK_CACHE_DIR to a writable folder to keep them",
            stacklevel=3,
        )
        return False
    return True


def compare_sums(current: dict[str, Sums], recorded: dict[str, Sums], where: object) -> None:
    """:class:`FormatError` naming the first file (and block) of ``current`` that differs from
    ``recorded`` (the sidecar ``where``)."""
    for name, (size, crcs) in current.items():
        if name not in recorded:
            raise FormatError(f"{where} has no checksums for {name}; delete it")
        rsize, rcrcs = recorded[name]
        if rsize != size:
            raise FormatError(
                f"{name} holds {size} bytes but {rsize} when its checksums were recorded: the "
                "file was modified"
            )
        for b, (got, want) in enumerate(zip(crcs, rcrcs)):
            if got != want:
                raise _block_error(name, b, size, want, got, where)


def _block_error(name: str, b: int, size: int, want: int, got: int, where: object) -> FormatError:
    lo = b * STRIPE_BYTES
    return FormatError(
        f"{name} stripe {b} (bytes {lo}..{min(size, lo + STRIPE_BYTES)}) differs from the checksum "
        f"recorded in {where} ({want:#010x} then, {got:#010x} now): the file was modified or "
        "corrupted"
    )


class SidecarReads:
    """Verify-on-read of a token file against its recorded sums (see the module docstring).

    Parameters
    ----------
    source : Path
        The token file (its name keys the sidecar).
    header : bytes
        The file's bytes before the first token (a ``.npy`` header; empty otherwise).
    tokens : numpy.ndarray
        The mapped tokens the store serves (the unsigned view), shape (num_tokens,).
    file_dtype : numpy.dtype
        The file's own dtype (a signed one has each verified block checked for negative ids).
    """

    def __init__(
        self, source: Path, header: bytes, tokens: np.ndarray, file_dtype: np.dtype
    ) -> None:
        self._source = source
        self._header = header
        self._tokens = tokens
        self._raw = tokens.reshape(-1).view(np.uint8) if tokens.size else np.empty(0, np.uint8)
        self._file_dtype = file_dtype
        self._size = len(header) + self._raw.shape[0]
        self._crcs: list[int] = []
        self._where: object = None
        self._done = np.zeros(-(-self._size // STRIPE_BYTES), dtype=bool)
        self._pending = int(self._done.shape[0])

    def expect(self, recorded: dict[str, Sums], where: object) -> None:
        """Check reads against ``recorded`` (the sums of the sidecar ``where``)."""
        name = self._source.name
        if name not in recorded:
            raise FormatError(f"{where} has no checksums for {name}; delete it")
        size, crcs = recorded[name]
        if size != self._size or len(crcs) != self._done.shape[0]:
            raise FormatError(
                f"{name} holds {self._size} bytes but {size} when its checksums were recorded: "
                "the file was modified"
            )
        self._crcs, self._where = list(crcs), where

    def all_checked(self) -> bool:
        return self._pending == 0

    def verify_span(self, start: int, stop: int) -> None:
        if stop <= start or not self._pending:
            return
        itemsize, h = self._tokens.dtype.itemsize, len(self._header)
        for b in range(
            (h + start * itemsize) // STRIPE_BYTES, (h + stop * itemsize - 1) // STRIPE_BYTES + 1
        ):
            if not self._done[b]:
                self._check_block(b)

    def verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        if not self._pending:
            return
        keep = lengths > 0
        starts, lengths = starts[keep], lengths[keep]
        if not starts.size:
            return
        itemsize, h = self._tokens.dtype.itemsize, len(self._header)
        first = (h + starts * itemsize) // STRIPE_BYTES
        last = (h + (starts + lengths) * itemsize - 1) // STRIPE_BYTES
        for b in np.unique(np.concatenate([first, last])).tolist():
            if not self._done[b]:
                self._check_block(b)
        for s, n in zip(starts[last - first > 1].tolist(), lengths[last - first > 1].tolist()):
            self.verify_span(s, s + n)  # a range over 3+ blocks

    def _check_block(self, b: int) -> None:
        if not self._crcs:
            raise RuntimeError("SidecarReads.expect() was not called")
        h, itemsize = len(self._header), self._tokens.dtype.itemsize
        lo, hi = b * STRIPE_BYTES, min(self._size, (b + 1) * STRIPE_BYTES)
        crc = zlib.crc32(self._header[lo:hi]) if lo < h else 0
        data = self._raw[max(lo, h) - h : max(hi, h) - h]
        got = zlib.crc32(memoryview(data), crc)  # type: ignore[arg-type]
        if got != self._crcs[b]:
            raise _block_error(self._source.name, b, self._size, self._crcs[b], got, self._where)
        first, end = max(0, lo - h) // itemsize, -(-max(0, hi - h) // itemsize)
        check_ids_nonnegative(self._tokens[first:end], self._file_dtype, self._source, first)
        if not self._done[b]:
            self._done[b] = True
            self._pending -= 1
