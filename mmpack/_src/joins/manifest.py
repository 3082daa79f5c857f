"""The manifest of a joined store (``OUT/mmpack-join.json``): its format, its records, its
checks, its fingerprint.

The manifest records the format name and version, the token dtype (the widest of the parts'),
the document and token counts, the global offsets file with its block CRC-32s, and the parts in
order (location, fingerprint, dtype, counts; and the ``format`` and open ``options`` of a part in
another tool's format, such as its ``eos``); the layout and the publishing protocol are
described in :mod:`mmpack._src.joins.parts`.  :func:`read_manifest` reads and checks it (every count a
non-negative integer, the totals the sums of the parts', the fingerprint that of the contents);
:func:`manifest_fingerprint` is the one definition of that fingerprint, used by the writer
(:mod:`mmpack._src.joins.join`) and the reader alike, as :func:`part_record` is of a part's record and
:func:`common_tokenizer` of the ``"tokenizer"`` section the writer adds.  Cost: one small JSON read, O(parts).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mmpack._src.store.format import TOKEN_DTYPES, check_count, check_version
from mmpack._src.store.publish import LOCK_FILE
from mmpack._src.store.registry import OPENERS
from mmpack._src.store.vocab import tokenizer_record
from mmpack.errors import FormatError, StoreNotFoundError

if TYPE_CHECKING:
    from mmpack._src.store.reader import TokenStore

__all__ = [
    "JOIN_FILE",
    "JOIN_FORMAT",
    "JOIN_LOCK_FILE",
    "JOIN_VERSION",
    "MANIFEST_KEYS",
    "common_tokenizer",
    "holds_tokenizer_copy",
    "join_entries",
    "manifest_fingerprint",
    "part_record",
    "read_manifest",
]

JOIN_FILE = "mmpack-join.json"
"""The manifest's file name inside the join folder."""
JOIN_FORMAT = "mmpack-join"
"""The manifest's ``format`` field."""
JOIN_VERSION = 1
"""The newest manifest version this mmpack reads and the one it writes."""
JOIN_LOCK_FILE = ".mmpack-join.lock"
"""The lock file that serialises the appenders of one join."""
MANIFEST_KEYS = frozenset(
    ("format", "version", "dtype", "num_docs", "num_tokens", "offsets", "parts", "fingerprint")
)
"""The manifest's own keys; the others are optional sections (``"tokenizer"``,
``"provenance"``, a caller's ``extra``)."""


def read_manifest(path: Path) -> dict[str, Any]:
    """The checked manifest of the join at ``path``.

    Raises
    ------
    StoreNotFoundError
        No such folder, or no manifest in it.
    FormatError
        The manifest is not JSON, not a join manifest, of a newer version, inconsistent, or
        its fingerprint does not match its contents.
    """
    file = path / JOIN_FILE
    if not path.exists():
        raise StoreNotFoundError(f"no joined store at {str(path)!r}: the path does not exist")
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise StoreNotFoundError(f"{str(path)!r} holds no {JOIN_FILE}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{file} is not valid JSON: {exc}") from None
    _check_manifest(raw, file)
    return raw


def _check_manifest(raw: Any, where: Path) -> None:
    if not isinstance(raw, dict) or raw.get("format") != JOIN_FORMAT:
        raise FormatError(f"{where}: not an mmpack join manifest")
    check_version(raw.get("version"), JOIN_VERSION, where, "join")
    try:
        dtype = np.dtype(raw["dtype"])
        parts = raw["parts"]
        docs = sum(check_count(p["num_docs"], "a part's num_docs", where) for p in parts)
        tokens = sum(check_count(p["num_tokens"], "a part's num_tokens", where) for p in parts)
        ok = (
            dtype in TOKEN_DTYPES
            and dtype.byteorder != ">"
            and all(
                isinstance(p["location"], str) and isinstance(p["fingerprint"], str) for p in parts
            )
            and all(_reopening_ok(p) for p in parts)
            and raw["num_docs"] == docs
            and raw["num_tokens"] == tokens
            and isinstance(raw["offsets"]["file"], str)
            and "/" not in raw["offsets"]["file"]
            and check_count(raw["offsets"]["block_bytes"], "block_bytes", where) > 0
            and all(isinstance(c, int) for c in raw["offsets"]["crc32"])
        )
    except (KeyError, TypeError) as exc:
        raise FormatError(f"{where}: manifest field missing or malformed: {exc!r}") from None
    if not ok:
        raise FormatError(f"{where}: the manifest is inconsistent (dtype, counts or offsets)")
    if raw.get("fingerprint") != manifest_fingerprint(raw):
        raise FormatError(
            f"{where}: fingerprint {raw.get('fingerprint')!r} does not match the manifest"
        )


_CALLERS_OPTIONS = {"format", "verify_reads", "cache_dir", "storage_options", "cache_limit"}
"""Options a part's record never holds: they are the caller's (:mod:`mmpack._src.joins.opening`)."""


def _reopening_ok(part: dict[str, Any]) -> bool:
    """A part in another tool's format records its ``format`` and JSON ``options`` (e.g.
    ``eos``) together; a part of mmpack's own records neither."""
    if "format" not in part and "options" not in part:
        return True
    options = part.get("options")
    return (
        isinstance(part.get("format"), str)
        and isinstance(options, dict)
        and all(isinstance(k, str) and k not in _CALLERS_OPTIONS for k in options)
    )


def manifest_fingerprint(raw: dict[str, Any]) -> str:
    """The join's fingerprint: a hash of its format, dtype, counts, the parts' fingerprints in
    order and the offsets' checksums (extra sections such as provenance are not part of it)."""
    payload = json.dumps(
        [
            JOIN_FORMAT,
            raw["dtype"],
            raw["num_docs"],
            raw["num_tokens"],
            [p["fingerprint"] for p in raw["parts"]],
            raw["offsets"]["crc32"],
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def join_entries(path: Path) -> set[str] | None:
    """The names a join folder holds of its own (its manifest, the offsets file it names, its
    lock, its copy of the tokenizer, the ``parts`` of a distributed build and the builder's lock
    file a build killed right after publishing leaves, the plan ``cache``);
    None when ``path`` holds no readable join.  What ``overwrite`` may replace
    (:func:`mmpack._src.store.publish.check_replaceable`, through
    :data:`mmpack._src.store.registry.OWNERS`)."""
    try:
        raw = read_manifest(path)
    except (FormatError, OSError):
        return None
    own = {JOIN_FILE, JOIN_LOCK_FILE, LOCK_FILE, raw["offsets"]["file"], "parts", "cache"}
    tokenizer = raw.get("tokenizer")
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("file"), str):
        own.add(tokenizer["file"])
    return own


# --------------------------------------------------------------------------------- records
def part_record(store: TokenStore, out_abs: Path) -> dict[str, Any]:
    """The manifest record of the part ``store`` of a join written at ``out_abs`` (an absolute
    path): its location (relative to ``out_abs`` unless remote), fingerprint, dtype, counts and
    what another tool's format needs to open it again."""
    loc = store.location
    return {
        "location": loc if "://" in loc else os.path.relpath(os.path.abspath(loc), out_abs),
        "fingerprint": store.fingerprint,
        "dtype": store.dtype.str,
        "num_docs": len(store),
        "num_tokens": store.num_tokens,
        **_reopening(store),
    }


def _reopening(store: TokenStore) -> dict[str, Any]:
    """What a part in another tool's format needs to be opened again besides its location (its
    ``format`` and options such as ``eos``; never a cache folder or credentials), as manifest
    fields (checked on reading by :func:`_reopening_ok`); nothing for mmpack's own stores and
    joins."""
    kind = store.meta.get("format")
    if not isinstance(kind, str) or kind not in OPENERS or "://" in store.location:
        return {}
    options = {
        k: v for k, v in store.open_options.items() if k not in ("cache_dir", "verify_reads")
    }
    if isinstance(options.get("metadata"), str):
        options["metadata"] = os.path.abspath(options["metadata"])
    return {"format": kind, "options": options}


def common_tokenizer(stores: list[TokenStore]) -> tuple[dict[str, Any] | None, bytes | None]:
    """The tokenizer record every store shares (None if one records none or they differ) and
    the bytes of a copied ``tokenizer.json`` from a local part, if any."""
    records = [tokenizer_record(s) for s in stores]
    if not records or any(r is None for r in records):
        return None, None
    if len({r.get("identity") for r in records}) != 1:  # type: ignore[union-attr]
        return None, None
    rec = {k: v for k, v in records[0].items() if k != "file"}  # type: ignore[union-attr]
    for store, r in zip(stores, records):
        name = r.get("file")  # type: ignore[union-attr]
        if name and "://" not in store.location and (Path(store.path) / name).is_file():
            rec["file"] = name
            return rec, (Path(store.path) / name).read_bytes()
    return rec, None


def holds_tokenizer_copy(folder: Path, rec: dict[str, Any]) -> bool:
    """Whether ``folder`` already holds the ``tokenizer.json`` of the tokenizer record ``rec``
    (its SHA-256 is the record's ``identity``)."""
    try:
        data = (folder / "tokenizer.json").read_bytes()
    except OSError:
        return False
    return "sha256:" + hashlib.sha256(data).hexdigest() == rec.get("identity")
