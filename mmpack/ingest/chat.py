"""Chat and prompt/completion records tokenized with a tokenizer's own chat template, into
documents with loss masks (``{"input_ids": ..., "loss_mask": ...}``) for :func:`mmpack.build`.

A conversation is a record ``{"messages": [{"role": ..., "content": ...}, ...]}``; a
prompt/completion pair is ``{"prompt": ..., "completion": ...}``, both strings or both lists of
messages.  :func:`chat_documents` turns each record into one document, its mask chosen by
``loss_on``:

- ``"assistant"``: the conversation through the template with
  ``apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)``; the mask is
  the template's assistant mask (1 on the tokens its ``{% generation %}`` blocks produce: a
  template without them is refused, since its mask would be all 0);
- ``"all"``: the same ids, every token a target;
- ``"completion"``: the prompt's tokens 0 and the completion's 1.  Strings are tokenized
  without special tokens and concatenated; messages go through the template, the prompt with
  ``add_generation_prompt=True``, and the prompt's ids must be a prefix of the whole
  conversation's (else the record is refused).

A bad record (not a dict, no messages, a message without ``role``/``content``) raises
``ValueError`` naming its index.  Cost: one template rendering and tokenization per record
(transformers, in this process); the documents stream, so memory holds one record.  Nothing is
ever downloaded: a tokenizer given as a path is loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["LOSS_ON", "chat_documents"]

LOSS_ON = ("all", "assistant", "completion")
"""Accepted ``loss_on`` values."""


def chat_documents(
    records: Iterable[Any], tokenizer: Any, *, loss_on: str = "assistant"
) -> Iterator[dict[str, np.ndarray]]:
    """Documents with loss masks from chat records (see the module docstring).

    Parameters
    ----------
    records : iterable of dict
        Conversations (``{"messages": [...]}``) or, for ``loss_on="completion"``, pairs
        (``{"prompt": ..., "completion": ...}``).
    tokenizer : transformers tokenizer, str or os.PathLike
        A tokenizer with a chat template, or a folder holding one (loaded offline).
    loss_on : {"assistant", "all", "completion"}

    Yields
    ------
    dict
        ``{"input_ids": int64 (n,), "loss_mask": uint8 (n,)}``.

    Raises
    ------
    ValueError
        A bad ``loss_on``, a tokenizer without a chat template (or, for ``"assistant"``,
        without ``{% generation %}`` markers), or a bad record (its index named).
    """
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {list(LOSS_ON)}, got {loss_on!r}")
    tok = _tokenizer(tokenizer)
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("the tokenizer has no chat template (tokenizer.chat_template)")
    if loss_on == "assistant" and "generation" not in template:
        raise ValueError(
            "loss_on='assistant' needs a chat template with {% generation %} ... "
            "{% endgeneration %} around the assistant's tokens (transformers' assistant mask); "
            "this template has none"
        )
    for k, record in enumerate(records):
        if loss_on == "completion":
            ids, mask = _completion(tok, record, k)
        else:
            ids, mask = _conversation(tok, _messages(record, "messages", k), k)
            if loss_on == "all":
                mask = np.ones_like(mask)
        yield {"input_ids": ids, "loss_mask": mask}


def _tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, (str, os.PathLike)):
        import transformers  # imported only when a tokenizer is given by path

        return transformers.AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    if not hasattr(tokenizer, "apply_chat_template"):
        raise TypeError(
            f"tokenizer must be a transformers tokenizer or a path to one, got "
            f"{type(tokenizer).__name__}"
        )
    return tokenizer


def _messages(record: Any, key: str, k: int) -> list[dict[str, Any]]:
    """``record[key]``, checked to be a non-empty list of ``{"role", "content"}`` dicts."""
    if not isinstance(record, dict) or key not in record:
        what = f"has keys {sorted(record)}" if isinstance(record, dict) else "is not a dict"
        raise ValueError(f"record {k} {what}; a conversation is {{{key!r}: [messages]}}")
    messages = record[key]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"record {k}: {key} must be a non-empty list of messages")
    for m, msg in enumerate(messages):
        if not isinstance(msg, dict) or not {"role", "content"} <= set(msg):
            raise ValueError(
                f"record {k}: {key}[{m}] must be a dict with 'role' and 'content', got {msg!r}"
            )
    return messages


def _conversation(tok: Any, messages: list[dict[str, Any]], k: int) -> tuple[np.ndarray, ...]:
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = np.asarray(out["input_ids"], dtype=np.int64)
    mask = np.asarray(out.get("assistant_masks", np.zeros(ids.shape[0])), dtype=np.uint8)
    if mask.shape != ids.shape:  # never seen; the store would refuse it anyway
        raise ValueError(f"record {k}: the template's assistant mask does not fit its tokens")
    return ids, mask


def _completion(tok: Any, record: Any, k: int) -> tuple[np.ndarray, ...]:
    if not isinstance(record, dict) or not {"prompt", "completion"} <= set(record):
        what = f"has keys {sorted(record)}" if isinstance(record, dict) else "is not a dict"
        raise ValueError(
            f"record {k} {what}; loss_on='completion' takes {{'prompt': ..., 'completion': ...}}"
        )
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        head = tok(prompt, add_special_tokens=False)["input_ids"]
        tail = tok(completion, add_special_tokens=False)["input_ids"]
        ids = np.asarray([*head, *tail], dtype=np.int64)
        n_prompt = len(head)
    else:
        first = _messages(record, "prompt", k)
        whole = first + _messages(record, "completion", k)
        head = tok.apply_chat_template(first, tokenize=True, add_generation_prompt=True)
        head = head["input_ids"] if isinstance(head, dict) or hasattr(head, "keys") else head
        full = tok.apply_chat_template(whole, tokenize=True)
        full = full["input_ids"] if isinstance(full, dict) or hasattr(full, "keys") else full
        if list(full[: len(head)]) != list(head):
            raise ValueError(
                f"record {k}: the template renders the prompt differently alone and followed by "
                "the completion, so the prompt's tokens cannot be told apart"
            )
        ids = np.asarray(full, dtype=np.int64)
        n_prompt = len(head)
    mask = np.ones(ids.shape[0], dtype=np.uint8)
    mask[:n_prompt] = 0
    return ids, mask
