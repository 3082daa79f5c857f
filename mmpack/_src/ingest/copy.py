"""Copying a store: local or on object storage, in any direction, with all its metadata,
verified at the destination and published atomically (``mmpack cp SRC DST``).

The copy reads the source through the :class:`~mmpack.TokenStore` interface and
writes it with the build's writer (:func:`mmpack._src.store.writer.store_writer`), so it is published
exactly as a build (a temporary folder renamed into place; on object storage ``mmpack.json``
written last): nothing at ``dst`` opens until the copy is complete and verified.  Copied: every
document in the source's dtype, its loss mask, the metadata's optional sections
(:attr:`TokenStore.extra <mmpack.TokenStore.extra>`), the attached files and the
per-document fields.  An mmpack store keeps its layout (``backend=`` changes it), so its copy
has the same XXH64 stripe digests and the same fingerprint (a store of another stripe size is
re-blocked, so its fingerprint changes).  A join is copied as one flattened store; another
tool's files (Megatron, EOS-separated) as an mmpack store of their documents.

Verification: a local source is opened with ``verify_reads=True`` (every stripe checked against
its own checksums before its tokens are copied: a damaged source is refused, naming its first
bad block, and nothing is published); a remote source checks every page it fetches.  An mmpack
source's recorded digests must equal the copy's; before it is published the copy is opened from
the destination and verified (every stripe read back, every attached file compared).

Cost: the source is read once (twice for another tool's files without a checksum sidecar) and
the destination once more; a remote destination is written locally first, then uploaded.
Memory: one chunk of about 16 Mi tokens (a longer document is read whole).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.progress import progress_bar
from mmpack._src.store.format import FORMAT_NAME, STRIPE_BYTES, StoreMeta
from mmpack._src.store.publish import inside_build
from mmpack._src.store.reader import TokenStore, open_store
from mmpack._src.store.writer import store_writer
from mmpack.errors import FormatError

__all__ = ["copy_store", "open_source"]

_CHUNK_TOKENS = 1 << 24


def copy_store(
    src: str | os.PathLike[str] | TokenStore,
    dst: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    backend: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = False,
) -> TokenStore:
    """Copy the store ``src`` to ``dst`` (see the module docstring) and return the copy opened.

    Parameters
    ----------
    src : path, URL or TokenStore
        The store to copy: anything ``mmpack.open`` opens (opened by :func:`open_source`), or an
        opened store, read as it was opened (another tool's flat file, for example, opened with
        its ``eos``).
    dst : path or URL
        The store to create (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file://``, or a
        folder); must not exist unless ``overwrite``.
    overwrite : bool
        Replace the store at ``dst`` (atomically), as :func:`mmpack.build` does: only an mmpack
        store or an empty folder is replaced.
    backend : {"memmap", "zarr"}, optional
        The copy's layout; default the source's (memmap for a join or another tool's files).
    storage_options : dict, optional
        Endpoint, credentials and client settings for a URL ``src`` and ``dst``
        (:func:`mmpack._src.remote.opener.open_url`).
    progress : bool or None
        Bars on stderr (copying, uploading, verifying) over the bytes each step moves, with an
        ETA (:func:`mmpack._src.core.progress.progress_bar`); none by default; ``None``: when stderr
        is a terminal (``mmpack cp``'s default).

    Returns
    -------
    TokenStore
        The copy, opened from ``dst``.

    Raises
    ------
    StoreExistsError
        ``dst`` exists and ``overwrite`` is false.
    FileExistsError
        ``overwrite`` is true but ``dst`` is not an mmpack store or an empty folder.
    FormatError
        The source is damaged (a block fails its checksum), or the copy does not verify at the
        destination; nothing is published.
    ValueError
        ``src`` and ``dst`` are the same store, or ``dst`` lies inside ``src``.
    """
    remote_dst = isinstance(dst, str) and "://" in dst
    if isinstance(src, TokenStore):
        source = src
    else:
        url = isinstance(src, str) and "://" in src
        source = open_source(src, storage_options if url else None)
    _check_distinct(source, dst)
    own = source.meta.get("format") == FORMAT_NAME
    recorded = StoreMeta.from_json(source.meta, Path(source.path)) if own else None
    expected = recorded if recorded is not None and recorded.block_bytes == STRIPE_BYTES else None
    # (a store of another block size is re-blocked: its blocks were checked as they were read)
    files = {name: source.read_attached(name) for name in source.attached_files}
    extra = _sections(source, files)
    options: dict[str, Any] = {
        "dtype": source.dtype,
        "backend": backend or (source.backend if own else "memmap"),
        "overwrite": overwrite,
        "check": _verifier(source, expected, files, progress),
        "fields": {name: source.fields.field(name) for name in source.fields},
    }
    if remote_dst:
        options.update(storage_options=storage_options, progress=progress)
    with store_writer(dst, **options) as writer:
        writer.extra.update(extra)
        for name, data in files.items():
            writer.attach(name, data)
        _stream(source, writer, progress)
    assert writer.store is not None  # set by the clean exit of the with-block
    return writer.store


def open_source(
    location: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> TokenStore:
    """Open ``location`` to be copied: a local store with ``verify_reads=True`` (each block
    checked before it is read), a URL with ``storage_options`` (its reads are always checked);
    ``options`` go to ``mmpack.open`` (``format``, ``eos``, ...)."""
    if isinstance(location, str) and "://" in location:
        return open_store(location, storage_options=storage_options, **options)
    if storage_options is not None:
        raise TypeError(f"storage_options is for URLs; {str(location)!r} is a local path")
    return open_store(location, verify_reads=True, **options)


def _check_distinct(source: TokenStore, dst: str | os.PathLike[str]) -> None:
    """Refuse a copy onto its own source, or into it (what ``dst`` replaces must not be read)."""
    where = source.location
    if isinstance(dst, str) and "://" in dst:
        same = where.rstrip("/") == dst.rstrip("/")
    else:
        same = "://" not in where and inside_build(os.fspath(dst), where)
        same = same or ("://" not in where and inside_build(where, os.fspath(dst)))
    if same:
        raise ValueError(
            f"cannot copy {where!r} to {os.fspath(dst)!r}: one is the other or lies inside it "
            "(a copy never replaces what it reads)"
        )


def _sections(source: TokenStore, files: dict[str, bytes]) -> dict[str, Any]:
    """The source's optional metadata sections, as the copy records them: a tokenizer record
    that names a file the copy does not hold (a join's parts held it) no longer names it; the
    file it names must still hash to the recorded identity (:class:`FormatError` otherwise)."""
    extra = source.extra
    rec = extra.get("tokenizer")
    name = rec.get("file") if isinstance(rec, dict) else None
    if isinstance(rec, dict) and name and name not in files:
        extra["tokenizer"] = {k: v for k, v in rec.items() if k != "file"}
    elif isinstance(rec, dict) and name in files:
        identity = str(rec.get("identity"))
        digest = "sha256:" + hashlib.sha256(files[name]).hexdigest()
        if identity.startswith("sha256:") and digest != identity:
            raise FormatError(
                f"{source.location}: its {name} does not match the tokenizer recorded at build "
                f"({identity}): it was modified; nothing was copied"
            )
    return extra


def _stream(source: TokenStore, writer: Any, progress: bool | None) -> None:
    """Every document of ``source`` into ``writer``, in chunks of about ``_CHUNK_TOKENS`` tokens
    (whole documents), the next chunk requested while this one is written."""
    offsets, mask = source.offsets, source.loss_mask
    n, item = len(source), source.dtype.itemsize
    if mask is not None:  # a masked store stays masked, even with no document
        writer.add_batch(np.empty(0, source.dtype), np.empty(0, np.int64), np.empty(0, np.uint8))
    previous = source.advise("sequential")
    try:
        with progress_bar(progress, source.nbytes, desc="copying") as bar:
            a = 0
            b = _chunk_end(offsets, a, n)
            while a < n:
                lo, hi = int(offsets[a]), int(offsets[b])
                after = _chunk_end(offsets, b, n)
                if b < n:
                    source.prefetch_range(hi, int(offsets[after]))
                flags = None if mask is None else mask.read_range(lo, hi)
                writer.add_batch(source.read_range(lo, hi), np.diff(offsets[a : b + 1]), flags)
                bar.update((hi - lo) * item)
                a, b = b, after
            bar.update((n + 1) * 8)
    finally:
        source.advise(previous)


def _chunk_end(offsets: np.ndarray, a: int, n: int) -> int:
    """The document after the chunk that starts at document ``a``: about ``_CHUNK_TOKENS``
    tokens, at least one document (``n`` when ``a == n``)."""
    if a >= n:
        return n
    b = int(np.searchsorted(offsets, int(offsets[a]) + _CHUNK_TOKENS, side="right")) - 1
    return min(max(b, a + 1), n)


def _verifier(
    source: TokenStore,
    expected: StoreMeta | None,
    files: dict[str, bytes],
    progress: bool | None,
):
    """The writer's ``check``: the finished copy, opened from the destination before it is
    published, holds the source's block digests (an mmpack source), verifies (every block read
    back) and holds the attached files byte for byte."""

    def check(copy: TokenStore) -> None:
        if expected is not None:
            _compare_digests(expected, StoreMeta.from_json(copy.meta, Path(copy.path)), source)
        copy.verify(progress=progress)
        for name, data in files.items():
            if copy.read_attached(name) != data:
                raise FormatError(
                    f"{copy.location}: the copy of {name} differs from the source's; nothing "
                    "was published"
                )

    return check


def _compare_digests(expected: StoreMeta, got: StoreMeta, source: TokenStore) -> None:
    """:class:`FormatError` naming the first block whose digest, computed on the bytes read
    from ``source``, differs from the one ``source`` records."""
    if (got.dtype, got.num_docs, got.num_tokens) != (
        expected.dtype,
        expected.num_docs,
        expected.num_tokens,
    ):
        raise FormatError(
            f"{source.location}: the copy holds {got.num_docs} documents and {got.num_tokens} "
            f"tokens ({got.dtype}) but the source records {expected.num_docs} and "
            f"{expected.num_tokens} ({expected.dtype}); nothing was published"
        )
    if got.loss_mask != expected.loss_mask:
        raise FormatError(
            f"{source.location}: the copy's loss mask (fingerprint {got.loss_mask}) differs from "
            f"the source's ({expected.loss_mask}); nothing was published"
        )
    for name, want, have in (
        ("offsets", expected.offsets_crc32, got.offsets_crc32),
        ("tokens", expected.tokens_digests, got.tokens_digests),
    ):
        for b, (w, h) in enumerate(zip(want, have)):
            if w != h:
                lo = b * expected.block_bytes
                raise FormatError(
                    f"{source.location}: {name} stripe {b} (bytes {lo}..{lo + expected.block_bytes}"
                    ") as read differs from its recorded checksum: the source is damaged or "
                    "changed during the copy; nothing was published"
                )
