"""Stores that know their tokenizer: what a build records, and the tokenizer read back from a store.

At build, :func:`describe_store` adds two optional sections to the store's metadata record (see
:mod:`mmpack._src.store.vocab`; readers that do not know them ignore them, and the fingerprint does
not cover them) and copies the tokenizer's ``tokenizer.json`` into the store folder:

- ``"tokenizer"``: kind, identity (``"byte"`` or the SHA-256 of ``tokenizer.json``), the copied
  file's name, the source path, the vocabulary size and the special ids (eot/eos, bos, pad, mask,
  unk where the tokenizer has them: from its folder's ``tokenizer_config.json`` /
  ``special_tokens_map.json``, else from the usual token spellings among its special tokens);
- ``"provenance"``: the inputs, the counts (read, written, skipped, empty), the tokenizer, the
  mmpack version and the UTC time; for a chat build its ``loss_on``, and the ``fields`` taken
  from the records when ``fields=`` named some.

:func:`store_tokenizer` rebuilds the tokenizer from a store (``mmpack show --decode`` without
``--tokenizer``), checking the copied file against its recorded hash.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from mmpack._src.ingest.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    TokenizerSpec,
    TransformersTokenizer,
    load_tokenizer,
)
from mmpack._src.store.vocab import tokenizer_record
from mmpack.errors import FormatError

__all__ = [
    "describe_store",
    "provenance_record",
    "store_tokenizer",
    "tokenizer_files",
    "tokenizer_record_of",
]

TOKENIZER_FILE = "tokenizer.json"

_CANDIDATES = {
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[BOS]", "[CLS]"),
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "mask": ("<mask>", "[MASK]", "<|mask|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}
_CONFIG_KEYS = {"bos": "bos_token", "pad": "pad_token", "mask": "mask_token", "unk": "unk_token"}


def tokenizer_files(tok: Tokenizer) -> bytes | None:
    """The bytes of the tokenizer's ``tokenizer.json`` (None for byte-level and for
    ``transformers`` folders without one)."""
    tok = getattr(tok, "base", tok)  # a templated tokenizer: its base's file
    if isinstance(tok, HFTokenizer) and tok.spec.path is not None:
        path = Path(tok.spec.path)
        return (path / TOKENIZER_FILE if path.is_dir() else path).read_bytes()
    return None


def tokenizer_record_of(tok: Tokenizer, *, copied: bool) -> dict[str, Any]:
    """The ``"tokenizer"`` section for ``tok`` (``copied``: ``tokenizer.json`` is in the store)."""
    data = tokenizer_files(tok)
    template = getattr(tok, "template", None)
    tok = getattr(tok, "base", tok)
    if isinstance(tok, ByteTokenizer):
        identity = "byte"
    elif data is not None:
        identity = "sha256:" + hashlib.sha256(data).hexdigest()
    else:
        identity = f"{tok.spec.kind}:{tok.spec.path}"
    rec: dict[str, Any] = {
        "kind": tok.spec.kind,
        "identity": identity,
        "source": tok.spec.path,
        "vocab_size": int(tok.vocab_size),
        "special_ids": _special_ids(tok),
    }
    if copied and data is not None:
        rec["file"] = TOKENIZER_FILE
    if template is not None:
        rec["template"] = template
    return rec


def provenance_record(
    inputs: list[str],
    report: Any,
    tok: Tokenizer,
    builder: str,
    fields: Any = (),
) -> dict[str, Any]:
    """The ``"provenance"`` section of a build of ``inputs`` by ``builder`` (the caller's
    dotted name; ``report``: its counts); ``loss_on`` when ``tok`` is a chat build's,
    ``fields`` when it took some."""
    rec = {
        "builder": builder,
        "mmpack_version": _version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_build_time())),
        "tokenizer": str(tok.spec),
        "inputs": list(inputs),
        "docs_read": report.docs_read,
        "docs_written": report.docs_written,
        "docs_skipped": report.docs_skipped,
        "empty_skipped": report.empty_skipped,
        "tokens_written": report.tokens_written,
    }
    loss_on = getattr(tok, "loss_on", None)  # a chat build's ChatTokenizer
    if loss_on is not None:
        rec["loss_on"] = loss_on
    if fields:
        rec["fields"] = list(fields)
    return rec


def describe_store(
    writer: Any,
    tok: Tokenizer,
    report: Any,
    inputs: list[str],
    *,
    builder: str,
    copy_tokenizer: bool = True,
    fields: Any = (),
) -> None:
    """Record the tokenizer and the provenance in the store being written by ``writer`` (a
    :class:`~mmpack.store.StoreWriter` before its commit) by ``builder`` (the caller's
    dotted name, recorded as the provenance's ``"builder"``)."""
    data = tokenizer_files(tok) if copy_tokenizer else None
    if data is not None:
        writer.attach(TOKENIZER_FILE, data)
    writer.extra["tokenizer"] = tokenizer_record_of(tok, copied=data is not None)
    writer.extra["provenance"] = provenance_record(inputs, report, tok, builder, fields=fields)


def store_tokenizer(store: Any) -> Tokenizer:
    """The tokenizer a store was built with, from its record.

    Raises
    ------
    ValueError
        The store records no tokenizer.
    FormatError
        The copied ``tokenizer.json`` no longer matches its recorded hash.
    FileNotFoundError
        Neither a copy nor the source of the tokenizer is there any more.
    """
    rec = tokenizer_record(store)
    if rec is None:
        raise ValueError(f"{store.location} records no tokenizer; pass one (--tokenizer)")
    kind = rec.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if rec.get("file") and "://" not in store.location:
        path = Path(store.path) / rec["file"]
        data = path.read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != rec.get("identity"):
            raise FormatError(
                f"{path} does not match the tokenizer recorded at build "
                f"({rec.get('identity')}): it was modified"
            )
        return HFTokenizer(path)
    source = rec.get("source")
    if not source or not Path(source).exists():
        raise FileNotFoundError(
            f"{store.location} was built with the tokenizer {source!r}, which is gone and was not "
            "copied into the store; pass one (--tokenizer)"
        )
    return load_tokenizer(TokenizerSpec(str(kind), str(source)))


def _special_ids(tok: Tokenizer) -> dict[str, int]:
    out: dict[str, int] = {}
    if tok.eot_id is not None:
        out["eot"] = int(tok.eot_id)
    if isinstance(tok, HFTokenizer) and tok.spec.path is not None:
        rust = tok._tok
        folder = Path(tok.spec.path)
        folder = folder if folder.is_dir() else folder.parent
        specials = {t.content for t in rust.get_added_tokens_decoder().values() if t.special}
        configured = _configured(folder)
        for role, names in _CANDIDATES.items():
            named = configured.get(role)
            for name in ([named] if named else []) + [n for n in names if n in specials]:
                tid = rust.token_to_id(name)
                if tid is not None:
                    out[role] = int(tid)
                    break
    elif isinstance(tok, TransformersTokenizer):
        for role in _CANDIDATES:
            tid = getattr(tok._tok, f"{role}_token_id", None)
            if tid is not None:
                out[role] = int(tid)
    return out


def _configured(folder: Path) -> dict[str, str]:
    """Special tokens named by a transformers folder's config files."""
    import json

    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            cfg = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict):
            continue
        for role, key in _CONFIG_KEYS.items():
            value = cfg.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and role not in out:
                out[role] = value
    return out


def _build_time() -> float:
    """Now, or ``SOURCE_DATE_EPOCH`` when set (reproducible builds: byte-identical stores)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return float(epoch) if epoch.isdigit() else time.time()


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mmpack")
    except PackageNotFoundError:
        return None
