"""Special-token templates: documents stored with the tokens a model expects around them.

A template is either ``"tokenizer"`` -- the tokenizer's own post-processor (``tokenizers``'
``TemplateProcessing``, e.g. ``<|begin_of_text|>`` for Llama 3, ``[CLS] ... [SEP]`` for BERT;
``transformers``' ``add_special_tokens=True``) -- or a string of whitespace-separated items with
``$A`` standing once for the document's tokens, each other item a token of the vocabulary or an
integer id: ``"<s> $A"`` (BOS), ``"[CLS] $A [SEP]"``, ``"$A <|endoftext|>"``.  The ids are
written into the store, so every view sees them as document tokens (the views' ``eot`` is still
inserted after them when given).  The template is part of the tokenizer's spec (workers rebuild
it) and of the store's tokenizer record.  Cost: one small concatenation per document.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack.ingest.tokenizer import Tokenizer

__all__ = ["TemplateTokenizer", "with_template"]


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
        from mmpack.ingest.tokenizer import (
            ByteTokenizer,
            HFTokenizer,
            TokenizerSpec,
            TransformersTokenizer,
        )

        self.base = base
        self.template = template
        self.spec = TokenizerSpec(base.spec.kind, base.spec.path, template)
        self.eot_id = base.eot_id
        self.vocab_size = base.vocab_size
        self.prefix = self.suffix = np.empty(0, dtype=np.int64)
        if template == "tokenizer":
            if isinstance(base, ByteTokenizer):
                raise ValueError(
                    "template='tokenizer': the byte-level tokenizer has no "
                    "post-processor; give a template such as '$A <|endoftext|>'"
                )
            if not isinstance(base, (HFTokenizer, TransformersTokenizer)):
                raise TypeError(
                    f"template='tokenizer' needs a Hugging Face tokenizer, got "
                    f"{type(base).__name__}"
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
        from mmpack.ingest.tokenizer import BYTE_EOT_ID, ByteTokenizer, HFTokenizer

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
            from mmpack.ingest.tokenizer import HFTokenizer

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
        from mmpack.ingest.tokenizer import load_tokenizer

        return (load_tokenizer, (self.spec,))
