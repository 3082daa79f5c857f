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
``ValueError`` naming its index.  :func:`build_chat` (``mmpack build --loss-on``) builds a store
from JSON lines files of such records, naming a bad one by its file and line.  Cost: one template rendering and tokenization per record
(transformers, in this process); the documents stream, so memory holds one record.  Nothing is
ever downloaded: a tokenizer given as a path is loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mmpack.errors import Param, with_params

__all__ = ["LOSS_ON", "build_chat", "chat_documents"]

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

    Returns
    -------
    iterator of dict
        One ``{"input_ids": int64 (n,), "loss_mask": uint8 (n,)}`` per record, made as it is
        taken (the tokenizer and ``loss_on`` are checked at the call).

    Raises
    ------
    ValueError
        A bad ``loss_on``, a tokenizer without a chat template (or, for ``"assistant"``,
        without ``{% generation %}`` markers), or a bad record (its index named).
    """
    tok = _checked_tokenizer(tokenizer, loss_on)  # refused now, before any record is read
    return (_document(tok, record, f"record {k}", loss_on) for k, record in enumerate(records))


def _checked_tokenizer(tokenizer: Any, loss_on: str) -> Any:
    """The tokenizer (loaded offline when given as a path), checked for ``loss_on``."""
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {list(LOSS_ON)}, got {loss_on!r}")
    tok = _tokenizer(tokenizer)
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("the tokenizer has no chat template (tokenizer.chat_template)")
    if loss_on == "assistant" and "generation" not in template:
        raise with_params(
            ValueError,
            Param("loss_on", "assistant"),
            " needs a chat template with {% generation %} ... {% endgeneration %} around the "
            "assistant's tokens (transformers' assistant mask); this template has none",
        )
    return tok


def _document(tok: Any, record: Any, k: str, loss_on: str) -> dict[str, np.ndarray]:
    """The document of one record (``k`` names it in errors: ``record 3``, ``FILE:LINE``)."""
    if loss_on == "completion":
        ids, mask = _completion(tok, record, k)
    else:
        ids, mask = _conversation(tok, _messages(record, "messages", k), k)
        if loss_on == "all":
            mask = np.ones_like(mask)
    return {"input_ids": ids, "loss_mask": mask}


def build_chat(
    inputs: Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    tokenizer: Any,
    *,
    loss_on: str = "assistant",
    backend: str = "memmap",
    overwrite: bool = False,
) -> Any:
    """Build the store ``output`` from JSON lines files of chat records (one record a line,
    blank lines skipped; files or globs, in order) with :func:`chat_documents`; returns it
    opened.  A line that is not JSON, or a bad record, raises ``ValueError`` naming its file
    and line, and nothing is written."""
    from mmpack.store.writer import build

    tok = _checked_tokenizer(tokenizer, loss_on)

    def documents() -> Iterator[dict[str, np.ndarray]]:
        for path in _paths(inputs):
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{line_no}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{where}: not a JSON record ({exc.msg})") from None
                    yield _document(tok, record, where, loss_on)

    return build(output, documents(), backend=backend, overwrite=overwrite)


def _paths(inputs: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files ``inputs`` name, globs expanded (sorted); ``FileNotFoundError`` for one that
    names nothing."""
    out: list[str] = []
    for item in inputs:
        text = os.fspath(item)
        if glob.has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise FileNotFoundError(f"no file matches {text!r}")
            out += found
        elif os.path.isfile(text):
            out.append(text)
        else:
            raise FileNotFoundError(f"{text!r} is not a file")
    return out


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


def _messages(record: Any, key: str, k: str) -> list[dict[str, Any]]:
    """``record[key]``, checked to be a non-empty list of ``{"role", "content"}`` dicts."""
    if not isinstance(record, dict) or key not in record:
        what = f"has keys {sorted(record)}" if isinstance(record, dict) else "is not a dict"
        raise ValueError(f"{k} {what}; a conversation is {{{key!r}: [messages]}}")
    messages = record[key]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{k}: {key} must be a non-empty list of messages")
    for m, msg in enumerate(messages):
        if not isinstance(msg, dict) or not {"role", "content"} <= set(msg):
            raise ValueError(
                f"{k}: {key}[{m}] must be a dict with 'role' and 'content', got {msg!r}"
            )
    return messages


def _conversation(tok: Any, messages: list[dict[str, Any]], k: str) -> tuple[np.ndarray, ...]:
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = np.asarray(out["input_ids"], dtype=np.int64)
    mask = np.asarray(out.get("assistant_masks", np.zeros(ids.shape[0])), dtype=np.uint8)
    if mask.shape != ids.shape:  # never seen; the store would refuse it anyway
        raise ValueError(f"{k}: the template's assistant mask does not fit its tokens")
    return ids, mask


def _completion(tok: Any, record: Any, k: str) -> tuple[np.ndarray, ...]:
    if not isinstance(record, dict) or not {"prompt", "completion"} <= set(record):
        what = f"has keys {sorted(record)}" if isinstance(record, dict) else "is not a dict"
        raise with_params(
            ValueError,
            f"{k} {what}; ",
            Param("loss_on", "completion"),
            " takes {'prompt': ..., 'completion': ...}",
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
                f"{k}: the template renders the prompt differently alone and followed by "
                "the completion, so the prompt's tokens cannot be told apart"
            )
        ids = np.asarray(full, dtype=np.int64)
        n_prompt = len(head)
    mask = np.ones(ids.shape[0], dtype=np.uint8)
    mask[:n_prompt] = 0
    return ids, mask
