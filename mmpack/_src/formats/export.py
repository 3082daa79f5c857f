"""Export any store to the formats other tools read: Megatron ``.bin/.idx`` and flat EOS files.

Both writers stream the store in blocks of about 16 Mi tokens (memory stays bounded whatever the
corpus), write temporary files beside the target (``.NAME.tmp-<pid>``) and rename them into place
only when complete, so a failed export leaves nothing that looks like data.  Existing files are
never replaced unless ``overwrite=True``.

- Megatron: one sequence per document, ``document_indices = 0..num_docs``; token dtype uint8,
  uint16, int32 (for ``uint32`` stores: Megatron has no uint32 code; every id must be < 2**31) or
  int64.  The ``.bin`` is renamed into place before the ``.idx`` (whose presence marks a dataset).
- Flat EOS file (OLMo-core): every document followed by ``eos`` unless it already ends with it
  (so an EOS-separated store exports back to the identical file); a document with ``eos`` inside
  it is refused (the file could not describe it).  ``header=True`` writes numpy's ``.npy``
  format (``np.load`` reads it), ``header=False`` OLMo-core's headerless layout, optionally with
  its ``NAME.csv.gz`` document metadata.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.core.validation import check_int_range
from mmpack._src.formats.eos_separated import olmo_metadata_path
from mmpack._src.formats.megatron import MAGIC, megatron_paths
from mmpack._src.store.reader import TokenStore
from mmpack.errors import Param, StoreExistsError, with_params

__all__ = ["export_flat", "export_megatron"]

_MEGATRON_EXPORT_DTYPES: dict[int, tuple[int, np.dtype]] = {
    1: (1, np.dtype("<u1")),
    2: (8, np.dtype("<u2")),
    4: (4, np.dtype("<i4")),
    8: (5, np.dtype("<i8")),
}
"""Token width in bytes -> (Megatron dtype code, dtype written)."""

_BLOCK_TOKENS = 1 << 24


def _check_store(store: Any, what: str) -> TokenStore:
    """``store`` as a :class:`TokenStore` that ``what`` (the target format) can hold: neither
    Megatron's ``.bin``/``.idx`` nor a flat file has a place for a per-token loss mask
    (megatron-core derives its loss mask from the eod and pad ids at read time), so a store with
    one is refused rather than exported without it."""
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a TokenStore (mmpack.open), got {type(store).__name__}")
    if store.has_loss_mask:
        raise ValueError(
            f"{store.location} has a per-token loss mask, which {what} cannot hold (it would be "
            "lost); train from the mmpack store, whose views turn the mask into labels"
        )
    return store


def _targets_free(paths: list[Path], overwrite: bool) -> None:
    for p in paths:
        if p.exists() and not overwrite:
            raise with_params(
                StoreExistsError, f"{p} exists; pass ", Param("overwrite", True), " to replace it"
            )
        if p.is_dir():
            raise IsADirectoryError(f"{p} is a folder; the export writes a file there")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _doc_blocks(store: TokenStore) -> Iterator[tuple[int, int]]:
    """Document ranges ``[a, b)`` of about ``_BLOCK_TOKENS`` tokens (at least one document)."""
    offsets = store.offsets
    a, n = 0, len(store)
    while a < n:
        b = int(np.searchsorted(offsets, offsets[a] + _BLOCK_TOKENS, side="right")) - 1
        b = min(max(b, a + 1), n)
        yield a, b
        a = b


def export_megatron(
    store: TokenStore,
    prefix: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Any = False,
) -> tuple[Path, Path]:
    """Write ``store`` as the Megatron dataset ``PREFIX.bin`` + ``PREFIX.idx``.

    Parameters
    ----------
    store : TokenStore
    prefix : str or os.PathLike
        The dataset prefix (a trailing ``.bin``/``.idx`` is dropped).
    overwrite : bool
        Replace existing files.
    progress : bool, None or Progress
        A bar over the store's token bytes read, with an ETA
        (:func:`mmpack._src.core.progress.progress_bar`): none by default; ``None`` when stderr is a
        terminal.

    Returns
    -------
    (bin_path, idx_path)

    Raises
    ------
    StoreExistsError
        A target exists and ``overwrite`` is False.
    ValueError
        A document longer than 2**31 - 1 tokens, an id that the Megatron dtype cannot hold, or
        a store with a loss mask (Megatron's files have no place for one).
    """
    store = _check_store(store, "Megatron's .bin/.idx")
    _, bin_path, idx_path = megatron_paths(prefix)
    _targets_free([bin_path, idx_path], overwrite)
    code, out_dtype = _MEGATRON_EXPORT_DTYPES[store.dtype.itemsize]
    lens = store.doc_lens
    if lens.size and int(lens.max()) > np.iinfo(np.int32).max:
        raise ValueError(
            f"document {int(np.argmax(lens))} has {int(lens.max())} tokens; "
            "Megatron's index stores lengths as int32"
        )
    limit = np.iinfo(out_dtype).max
    tmp_bin, tmp_idx = _tmp(bin_path), _tmp(idx_path)
    token_bytes = store.num_tokens * store.dtype.itemsize
    try:
        with open(tmp_bin, "wb") as f, progress_bar(progress, token_bytes, desc="exporting") as bar:
            for lo in range(0, store.num_tokens, _BLOCK_TOKENS):
                chunk = store.read_range(lo, min(store.num_tokens, lo + _BLOCK_TOKENS))
                if out_dtype.kind == "i" and chunk.size and int(chunk.max()) > limit:
                    raise ValueError(
                        f"token id {int(chunk.max())} does not fit Megatron's "
                        f"{out_dtype.name} (the widest unsigned-compatible code)"
                    )
                f.write(np.ascontiguousarray(chunk).tobytes())
                bar.update(chunk.size * store.dtype.itemsize)
            f.flush()
            os.fsync(f.fileno())
        num_docs = len(store)
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC + struct.pack("<QBQQ", 1, code, num_docs, num_docs + 1))
            f.write(lens.astype("<i4").tobytes())
            f.write((store.offsets[:-1] * out_dtype.itemsize).astype("<i8").tobytes())
            f.write(np.arange(num_docs + 1, dtype="<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_bin, bin_path)
        os.replace(tmp_idx, idx_path)
    finally:
        tmp_bin.unlink(missing_ok=True)
        tmp_idx.unlink(missing_ok=True)
    return bin_path, idx_path


def _needs_eos(store: TokenStore, eos: int) -> np.ndarray:
    """bool (num_docs,): documents that do not already end with ``eos``."""
    lens = store.doc_lens
    needs = np.ones(len(store), dtype=bool)
    full = np.flatnonzero(lens > 0)
    if full.size:
        last = store.offsets[1:][full] - 1
        src, at = store.read_ranges(last.astype(np.int64), np.ones(full.size, dtype=np.int64))
        needs[full] = np.asarray(src)[at] != eos
    return needs


def export_flat(
    store: TokenStore,
    path: str | os.PathLike[str],
    *,
    eos: int,
    header: bool = True,
    metadata: bool = False,
    overwrite: bool = False,
    progress: Any = False,
) -> Path:
    """Write ``store`` as one flat token file, each document followed by ``eos``.

    Parameters
    ----------
    store : TokenStore
    path : str or os.PathLike
        The file to write.
    eos : int
        The separator id (must fit ``store.dtype``).
    header : bool
        ``True``: numpy ``.npy`` format; ``False``: headerless (OLMo-core, ``np.memmap``).
    metadata : bool
        Also write OLMo-core's ``NAME.csv.gz`` (``start,end`` per document, EOS included).
    overwrite : bool
        Replace existing files.
    progress : bool, None or Progress
        A bar over the store's token bytes read (as :func:`export_megatron`).

    Raises
    ------
    ValueError
        ``eos`` out of range, a document holds ``eos`` before its end, or the store has a loss
        mask (a flat file has no place for one).
    """
    store = _check_store(store, "a flat EOS-separated file")
    eos = check_int_range(eos, "eos", 0, int(np.iinfo(store.dtype).max) + 1)
    path = Path(path)
    meta_path = olmo_metadata_path(path) if metadata else None
    _targets_free([path] + ([meta_path] if meta_path else []), overwrite)
    needs = _needs_eos(store, eos)
    total = store.num_tokens + int(needs.sum())
    # end of each document in the output, its EOS included
    out_ends = store.offsets[1:] + np.cumsum(needs, dtype=np.int64)
    tmp = _tmp(path)
    tmp_meta = _tmp(meta_path) if meta_path else None
    token_bytes = store.num_tokens * store.dtype.itemsize
    try:
        with open(tmp, "wb") as f, progress_bar(progress, token_bytes, desc="exporting") as bar:
            if header:
                np.lib.format.write_array_header_1_0(
                    f, {"descr": store.dtype.str, "fortran_order": False, "shape": (total,)}
                )
            for a, b in _doc_blocks(store):
                lo = int(store.offsets[a])
                chunk = np.asarray(store.read_range(lo, int(store.offsets[b])))
                inside = np.flatnonzero(chunk == eos) + lo + 1  # position after each eos
                ends = store.offsets[a + 1 : b + 1]
                stray = inside[~np.isin(inside, ends)]
                if stray.size:
                    doc = int(np.searchsorted(store.offsets, stray[0], side="right")) - 1
                    raise ValueError(
                        f"document {doc} holds eos={eos} at token {int(stray[0]) - 1 - int(store.offsets[doc])} "
                        "before its end; a flat EOS-separated file cannot describe it"
                    )
                at = (ends - lo)[needs[a:b]]
                f.write(np.insert(chunk, at, store.dtype.type(eos)).astype(store.dtype).tobytes())
                bar.update(chunk.size * store.dtype.itemsize)
            f.flush()
            os.fsync(f.fileno())
        if tmp_meta is not None and meta_path is not None:
            starts = np.concatenate(([0], out_ends[:-1]))
            with gzip.open(tmp_meta, "wt") as g:
                for s, e in zip(starts.tolist(), out_ends.tolist()):
                    g.write(f"{s},{e}\n")
            os.replace(tmp_meta, meta_path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        if tmp_meta is not None:
            tmp_meta.unlink(missing_ok=True)
    return path
