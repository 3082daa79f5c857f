"""Tokenizers for ingestion: the built-in byte-level one and Hugging Face tokenizers, one interface.

Every tokenizer exposes ``encode_batch(texts) -> list[np.ndarray]`` (one 1-D array of ids per
text, of dtype ``token_dtype``, no special tokens added), ``decode(ids) -> str``, ``eot_id`` (or
None), ``vocab_size``, ``max_id`` (the largest id it can produce, added tokens included: it, not
``vocab_size``, sizes an embedding and the store dtype), and ``spec``, a picklable
:class:`TokenizerSpec` from which :func:`load_tokenizer` rebuilds it in a worker.  Kinds:

- ``"byte"``: the UTF-8 bytes, ids 0..255, ``eot_id`` 256; stores are ``uint8``.  Cost: one
  ``str.encode`` per text; decoding replaces a character cut by a window edge with U+FFFD.
- ``"tokenizers"``: a Hugging Face ``tokenizer.json`` (a file, or a folder whose config files
  name the eos token), encoded in Rust on all cores unless ``TOKENIZERS_PARALLELISM=false``.
- ``"transformers"``: a tokenizer folder without ``tokenizer.json`` (e.g. SentencePiece), loaded
  offline; ``transformers`` is imported only then.

Templates (:class:`TemplateTokenizer`, :func:`with_template`): the tokens a model expects
around a document, stored with it.  ``"tokenizer"`` is the tokenizer's own post-processor
(``TemplateProcessing``, ``add_special_tokens=True``); a string of whitespace-separated items
has ``$A`` once for the document's tokens and vocabulary tokens or integer ids around it
(``"<s> $A"``, ``"[CLS] $A [SEP]"``, ``"$A <|endoftext|>"``).  The template is part of the spec
and of the store's tokenizer record.  Cost: one small concatenation per document.

Nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from mmpack.errors import MissingDependencyError, Param, with_params

__all__ = [
    "BYTE_EOT_ID",
    "ByteTokenizer",
    "HFTokenizer",
    "TemplateTokenizer",
    "Tokenizer",
    "TokenizerSpec",
    "TransformersTokenizer",
    "load_tokenizer",
    "with_template",
]

BYTE_EOT_ID = 256
"""End-of-text id of the byte-level tokenizer (one past the byte values)."""

_EOT_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "[EOS]",
    "<|end|>",
)
"""Special tokens taken as end-of-text, in order of preference, when no config names one."""


@dataclass(frozen=True)
class TokenizerSpec:
    """What :func:`load_tokenizer` needs to rebuild a tokenizer: ``kind`` (``"byte"``,
    ``"tokenizers"`` or ``"transformers"``) and ``path`` (None for ``"byte"``).  Picklable."""

    kind: str
    path: str | None = None
    template: str | None = None
    """Special-token template applied at encoding (:class:`TemplateTokenizer`), or None."""

    def __str__(self) -> str:
        text = (
            "byte-level (UTF-8 bytes, eot 256)"
            if self.kind == "byte"
            else f"{self.kind}:{self.path}"
        )
        return text if self.template is None else f"{text} with template {self.template!r}"


class Tokenizer:
    """The interface every tokenizer implements (see the module docstring)."""

    spec: TokenizerSpec
    eot_id: int | None
    vocab_size: int
    max_id: int

    @property
    def token_dtype(self) -> np.dtype:
        """The unsigned dtype that holds every id this tokenizer can produce, ``max_id`` included
        (drives the store dtype)."""
        for dt in (np.uint8, np.uint16, np.uint32):
            if self.max_id <= np.iinfo(dt).max:
                return np.dtype(dt)
        return np.dtype(np.uint64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (1-D arrays of ``token_dtype``), no special tokens added.

        Raises on the first text it cannot encode; callers that need to know which text failed
        encode one at a time after a failed batch."""
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        """Token ids of one text: ``encode_batch([text])[0]``."""
        return self.encode_batch([text])[0]

    def decode(self, ids: Any) -> str:
        """The text of ``ids`` (any 1-D integer sequence); special tokens are shown."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.spec)!r}, vocab_size={self.vocab_size}, "
            f"eot_id={self.eot_id})"
        )

    def __reduce__(self):
        return (load_tokenizer, (self.spec,))


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0..255, ``eot_id`` 256 (shown as ``<|endoftext|>``)."""

    eot_text = "<|endoftext|>"

    def __init__(self) -> None:
        self.spec = TokenizerSpec("byte")
        self.eot_id = BYTE_EOT_ID
        self.vocab_size = BYTE_EOT_ID + 1
        self.max_id = BYTE_EOT_ID

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)  # the eot is never stored, only inserted by the views

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Any) -> str:
        arr = _as_ids(ids)
        if arr.size and (arr.min() < 0 or arr.max() > BYTE_EOT_ID):
            bad = arr[(arr < 0) | (arr > BYTE_EOT_ID)][0]
            raise ValueError(
                f"id {int(bad)} is not a byte-level token (accepted: 0..255 and the eot 256)"
            )
        cuts = np.flatnonzero(arr == BYTE_EOT_ID)
        parts, lo = [], 0
        for c in cuts.tolist():
            parts.append(arr[lo:c].astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
            parts.append(self.eot_text)
            lo = c + 1
        parts.append(arr[lo:].astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
        return "".join(parts)


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer loaded from a ``tokenizer.json``.

    Parameters
    ----------
    path : str or os.PathLike
        The ``tokenizer.json`` file, or a folder holding it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from tokenizers import Tokenizer as _RustTokenizer
        except ImportError:
            raise MissingDependencyError(
                f"the tokenizer {str(path)!r} needs the `tokenizers` package, which is not "
                "installed",
                "tokenizers",
                "ingest",
            ) from None

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tok = _RustTokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise ValueError(f"cannot load the tokenizer {str(file)!r}: {exc}") from None
        self.spec = TokenizerSpec("tokenizers", str(path.resolve()))
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.max_id = _max_id(
            self._tok.get_vocab(with_added_tokens=True).values(),
            self._tok.get_added_tokens_decoder(),
        )
        self.eot_id = _find_eot(
            self._tok.token_to_id,
            _configured_eos(file.parent),
            [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special],
        )
        self._fast = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        dtype = self.token_dtype
        return [_id_array(e.ids, dtype, self) for e in self._fast(texts, add_special_tokens=False)]

    def decode(self, ids: Any) -> str:
        arr = _as_ids(ids)
        if arr.size and (arr.min() < 0 or arr.max() > self.max_id):
            raise ValueError(
                f"ids must lie in [0, {self.max_id}] for this tokenizer, got "
                f"{int(arr.min())}..{int(arr.max())}"
            )
        return self._tok.decode(arr.tolist(), skip_special_tokens=False)


class TransformersTokenizer(Tokenizer):
    """A ``transformers`` tokenizer folder (e.g. SentencePiece), loaded offline."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise MissingDependencyError(
                f"{str(path)!r} holds no tokenizer.json, so it needs the `transformers` package "
                "to load, which is not installed (or save a fast tokenizer's tokenizer.json into "
                "the folder)",
                "transformers",
            ) from None
        path = Path(path)
        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.spec = TokenizerSpec("transformers", str(path.resolve()))
        self.vocab_size = int(len(self._tok))
        get_vocab = getattr(self._tok, "get_vocab", dict)
        self.max_id = _max_id(
            get_vocab().values(),
            getattr(self._tok, "added_tokens_decoder", {}),
            [self.vocab_size - 1],
        )
        eos = getattr(self._tok, "eos_token_id", None)
        self.eot_id = None if eos is None else int(eos)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        dtype = self.token_dtype
        out = self._tok(list(texts), add_special_tokens=False)["input_ids"]
        return [_id_array(ids, dtype, self) for ids in out]

    def decode(self, ids: Any) -> str:
        text = self._tok.decode(_as_ids(ids).tolist(), skip_special_tokens=False)
        return cast(str, text)  # one flat list of ids decodes to one string


def load_tokenizer(spec: Any = None) -> Tokenizer:
    """Load a tokenizer.

    Parameters
    ----------
    spec : None, "byte", str, os.PathLike, TokenizerSpec or Tokenizer
        None or ``"byte"``: the byte-level tokenizer.  A path: a ``tokenizer.json`` file, or a
        folder holding ``tokenizer.json`` (loaded with ``tokenizers``), or a ``transformers``
        tokenizer folder without one.  A :class:`TokenizerSpec` (from ``tokenizer.spec``)
        rebuilds that tokenizer; a tokenizer is returned as is.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    ValueError
        The file is not a tokenizer, or the spec kind is unknown.
    MissingDependencyError
        (an ``ImportError``) A ``transformers`` folder and ``transformers`` is not installed, or
        a ``tokenizer.json`` and ``tokenizers`` (the ``ingest`` extra) is not.
    """
    if isinstance(spec, Tokenizer):
        return spec
    if spec is None or (isinstance(spec, str) and spec in ("byte", "bytes")):
        return ByteTokenizer()
    if isinstance(spec, TokenizerSpec) and spec.template is not None:
        return with_template(load_tokenizer(TokenizerSpec(spec.kind, spec.path)), spec.template)
    if isinstance(spec, TokenizerSpec):
        if spec.kind == "byte":
            return ByteTokenizer()
        if spec.kind in ("tokenizers", "transformers"):
            if spec.path is None:
                raise TypeError(f"a TokenizerSpec of kind {spec.kind!r} needs a path, got None")
            if spec.kind == "tokenizers":
                return HFTokenizer(spec.path)
            return TransformersTokenizer(spec.path)
        raise ValueError(
            f"unknown tokenizer kind {spec.kind!r}; accepted: 'byte', 'tokenizers', 'transformers'"
        )
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            f"tokenizer must be None, 'byte', a path or a TokenizerSpec, got {type(spec).__name__}"
        )
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(
            f"tokenizer {str(path)!r} does not exist (give a tokenizer.json file, a tokenizer "
            "folder, or 'byte')"
        )
    if path.is_dir() and not (path / "tokenizer.json").is_file():
        return TransformersTokenizer(path)
    return HFTokenizer(path)


# --------------------------------------------------------------------------------- helpers
# ------------------------------------------------------------------------------- templates
def with_template(tok: Any, template: str | None) -> Any:
    """``tok`` wrapped to apply ``template`` (None: ``tok`` itself)."""
    if template is None:
        return tok
    if not isinstance(template, str) or not template.strip():
        raise ValueError(
            f"template must be 'tokenizer' or a string like '<s> $A', got {template!r}"
        )
    return TemplateTokenizer(tok, template)


class TemplateTokenizer(Tokenizer):
    """A tokenizer whose ``encode_batch`` adds special tokens (see the module docstring)."""

    def __init__(self, base: Any, template: str) -> None:
        self.base = base
        self.template = template
        self.spec = TokenizerSpec(base.spec.kind, base.spec.path, template)
        self.eot_id = base.eot_id
        self.vocab_size = base.vocab_size
        self.prefix = self.suffix = np.empty(0, dtype=np.int64)
        if template == "tokenizer":
            if isinstance(base, ByteTokenizer):
                raise with_params(
                    ValueError,
                    Param("template", "tokenizer"),
                    ": the byte-level tokenizer has no post-processor; give a template such as "
                    "'$A <|endoftext|>'",
                )
            if not isinstance(base, (HFTokenizer, TransformersTokenizer)):
                raise with_params(
                    TypeError,
                    Param("template", "tokenizer"),
                    f" needs a Hugging Face tokenizer, got {type(base).__name__}",
                )
            self._post = True
            return
        self._post = False
        items = template.split()
        if items.count("$A") != 1:
            raise ValueError(f"template {template!r} must hold '$A' (the document) exactly once")
        at = items.index("$A")
        ids = [self._id(item) for item in items[:at] + items[at + 1 :]]
        self.prefix = np.array(ids[:at], dtype=np.int64)
        self.suffix = np.array(ids[at:], dtype=np.int64)

    def _id(self, item: str) -> int:
        from mmpack._src.ingest.tokenizer import BYTE_EOT_ID, ByteTokenizer, HFTokenizer

        value: int | None
        if item.isdigit():
            value = int(item)
        elif isinstance(self.base, ByteTokenizer):
            value = BYTE_EOT_ID if item == "<|endoftext|>" else None
        elif isinstance(self.base, HFTokenizer):
            value = self.base._tok.token_to_id(item)
        else:
            value = self.base._tok.convert_tokens_to_ids(item)
            value = None if value == getattr(self.base._tok, "unk_token_id", -1) else value
        if value is None:
            raise ValueError(
                f"template {self.template!r}: {item!r} is not a token of "
                f"{self.base.spec} (give a token of its vocabulary or an id)"
            )
        if not 0 <= value < max(self.vocab_size, 1):
            raise ValueError(
                f"template {self.template!r}: id {value} is outside the "
                f"vocabulary ({self.vocab_size} ids)"
            )
        return int(value)

    @property
    def token_dtype(self) -> np.dtype:
        dtype = self.base.token_dtype
        top = int(max(self.prefix.max(initial=0), self.suffix.max(initial=0)))
        if self._post:
            top = self.vocab_size - 1
        for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
            if top <= np.iinfo(dt).max and np.dtype(dt).itemsize >= dtype.itemsize:
                return np.dtype(dt)
        return np.dtype(np.uint64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        dtype = self.token_dtype
        if self._post:
            if isinstance(self.base, HFTokenizer):
                enc = self.base._tok.encode_batch(list(texts), add_special_tokens=True)
                return [np.asarray(e.ids, dtype=dtype) for e in enc]
            out = self.base._tok(list(texts), add_special_tokens=True)["input_ids"]
            return [np.asarray(ids, dtype=dtype) for ids in out]
        pre, post = self.prefix.astype(dtype), self.suffix.astype(dtype)
        return [
            np.concatenate((pre, ids.astype(dtype, copy=False), post))
            for ids in self.base.encode_batch(texts)
        ]

    def decode(self, ids: Any) -> str:
        return self.base.decode(ids)

    def __repr__(self) -> str:
        return f"TemplateTokenizer({self.base!r}, template={self.template!r})"

    def __reduce__(self):
        return (load_tokenizer, (self.spec,))


def _max_id(*id_groups: Any) -> int:
    """The largest id among the groups (iterables of ints; mappings: their keys)."""
    return max((int(i) for group in id_groups for i in group), default=0)


def _id_array(ids: list[int], dtype: np.dtype, tok: Tokenizer) -> np.ndarray:
    """``ids`` as ``dtype``; an id the dtype cannot hold (a tokenizer producing an id beyond its
    own vocabulary) is a clear error, never a wrapped value."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(dtype).max):
        bad = int(arr.max()) if arr.max() > np.iinfo(dtype).max else int(arr.min())
        raise ValueError(
            f"the tokenizer produced id {bad}, outside 0..{tok.max_id} (its largest "
            f"id, stored as {dtype.name})"
        )
    return arr.astype(dtype)


def _as_ids(ids: Any) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(
            f"ids must be a 1-D sequence of integers, got shape {arr.shape} {arr.dtype}"
        )
    return arr.astype(np.int64, copy=False)


def _configured_eos(folder: Path) -> str | None:
    """The eos token named by a transformers folder's config files, if any."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            cfg = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        eos = cfg.get("eos_token") if isinstance(cfg, dict) else None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            return eos
    return None


def _find_eot(token_to_id, configured: str | None, specials: list[str]) -> int | None:
    for name in ([configured] if configured else []) + list(_EOT_CANDIDATES):
        tid = token_to_id(name)
        if tid is not None and (name == configured or name in specials):
            return int(tid)
    return None
