"""Chat records through a tokenizer's own chat template: the record checks, the ids and loss
mask of one record, and :class:`ChatTokenizer`, the tokenizer :func:`~mmpack.ingest.ingest`
runs in its workers for ``loss_on=``.

A conversation is ``{"messages": [{"role": ..., "content": ...}, ...]}``; a prompt/completion
pair is ``{"prompt": ..., "completion": ...}``, both strings or both lists of messages.  The
mask follows TRL's SFT data path (``trl.SFTTrainer``) so that the labels equal its labels:

- ``"assistant"`` (``assistant_only_loss``): the template's assistant mask from
  ``apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`` (a template
  without ``{% generation %}`` blocks is refused: its mask would be all 0);
- ``"all"``: the same ids, every token a target;
- ``"completion"`` (``completion_only_loss``): the ids of prompt then completion (strings: the
  tokenizer on their concatenation, eos appended; messages: the template over both), the mask 0
  on their common prefix with the prompt's own ids and 1 after it.

Every template call gets ``tools=`` and the record's ``chat_template_kwargs``, as TRL gives them
(:func:`_template_options`; string pairs take neither).  A record is checked before it is
tokenized (:func:`record_problem`: the keys its ``loss_on`` reads, roles among
:data:`_CHAT_ROLES`, option types of :data:`CHAT_OPTIONS`).  Cost: one template rendering (two
for a completion) and tokenization per record, in transformers.  Nothing is ever downloaded (a
tokenizer folder is loaded with ``local_files_only=True``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from mmpack._src.ingest.tokenizer import Tokenizer, _id_array
from mmpack.errors import Param, with_params

__all__ = [
    "CHAT_OPTIONS",
    "ChatRecord",
    "ChatTokenizer",
    "chat_template_tokenizer",
    "checked_record",
    "encode_record",
    "record_problem",
]

_LOSS_ON = ("all", "assistant", "completion")
"""Accepted ``loss_on`` values."""
_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a message may have."""
CHAT_OPTIONS = ("chat_template_kwargs", "tools")
"""The optional keys of a record that reach the template (:func:`_template_options`)."""
_OWN_KEYWORDS = frozenset(
    ("add_generation_prompt", "chat_template", "conversation", "return_dict", "tokenize", "tools")
    + ("return_assistant_tokens_mask",)
)
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
"""A ``{% generation %}`` tag (transformers' own test for an assistant mask; a template that only
mentions the word, e.g. ``add_generation_prompt``, has none)."""


class ChatRecord:
    """A checked chat record as the readers pass it on: ``record`` (the dict), ``chars``
    (its contents' characters: what a batch's ``batch_chars`` counts) and ``field_values``
    (its values of the keys ``ingest(fields=...)`` names; None without).  Never empty."""

    __slots__ = ("chars", "field_values", "record")

    def __init__(
        self, record: dict[str, Any], chars: int, field_values: tuple[Any, ...] | None = None
    ) -> None:
        self.record, self.chars, self.field_values = record, chars, field_values

    def __len__(self) -> int:
        return self.chars

    def __bool__(self) -> bool:
        return True


def record_problem(record: Any, loss_on: str) -> str | None:
    """What is wrong with a chat record for ``loss_on`` (a phrase naming the key or message),
    or None."""
    keys = ("prompt", "completion") if loss_on == "completion" else ("messages",)
    if not isinstance(record, dict) or not set(keys) <= set(record):
        what = f"has keys {sorted(record)}" if isinstance(record, dict) else "is not a dict"
        shape = (
            "{'prompt': ..., 'completion': ...} (loss_on='completion')"
            if loss_on == "completion"
            else "{'messages': [messages]}"
        )
        return f"the record {what}; a {'pair' if loss_on == 'completion' else 'conversation'} is {shape}"
    problem = _options_problem(record)
    if problem is not None:
        return problem
    if loss_on == "completion":
        strings = [isinstance(record[k], str) for k in keys]
        if all(strings):
            return None
        if any(strings):
            return "prompt and completion must both be strings or both lists of messages"
    for key in keys:
        problem = _messages_problem(record[key], key)
        if problem is not None:
            return problem
    return None


def _options_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the record's ``tools`` or ``chat_template_kwargs``, or None."""
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as exc:
            return f"tools is a string but not JSON ({exc})"
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        return f"tools must be a list of tool schemas (dicts) or its JSON text, got {tools!r}"
    kwargs = record.get("chat_template_kwargs")
    if kwargs is not None and (
        not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)
    ):
        return f"chat_template_kwargs must be a dict of template variables, got {kwargs!r}"
    clash = sorted(set(kwargs or ()) & _OWN_KEYWORDS)
    if clash:
        return f"chat_template_kwargs may not set {', '.join(clash)} (mmpack sets it)"
    return None


def _template_options(record: dict[str, Any]) -> dict[str, Any]:
    """The keywords of a (checked) record's template calls, as TRL's SFT path makes them:
    ``tools=`` the record's ``tools`` (JSON text decoded; None without) and the record's
    ``chat_template_kwargs``."""
    tools = record.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools)
    return {"tools": tools, **(record.get("chat_template_kwargs") or {})}


def _messages_problem(messages: Any, key: str) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f"{key} must be a non-empty list of messages"
    for m, msg in enumerate(messages):
        calls = isinstance(msg, dict) and msg.get("tool_calls") is not None
        if not isinstance(msg, dict) or not ({"role"} if calls else {"role", "content"}) <= set(
            msg
        ):
            return f"{key}[{m}] must be a dict with 'role' and 'content', got {msg!r}"
        if msg["role"] not in _CHAT_ROLES:
            return (
                f"{key}[{m}] has the unknown role {msg['role']!r} (known: {', '.join(_CHAT_ROLES)})"
            )
        if not isinstance(msg.get("content"), (str, list)) and not (
            calls and msg.get("content") is None
        ):
            return (
                f"{key}[{m}]['content'] must be a string or a list of parts, got {msg['content']!r}"
            )
    return None


def checked_record(record: Any, loss_on: str) -> ChatRecord | str:
    """The record as a :class:`ChatRecord`, or its problem."""
    problem = record_problem(record, loss_on)
    if problem is not None:
        return problem
    chars = 0
    for value in record.values():
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, list):
            chars += sum(len(m.get("content") or ()) for m in value if isinstance(m, dict))
    return ChatRecord(record, chars)


def chat_template_tokenizer(tokenizer: Any, loss_on: str) -> Any:
    """The transformers tokenizer of ``tokenizer`` (a folder, loaded offline, or a tokenizer),
    checked for ``loss_on``: it has a chat template, with ``{% generation %}`` for
    ``"assistant"``."""
    if loss_on not in _LOSS_ON:
        raise ValueError(f"loss_on must be one of {list(_LOSS_ON)}, got {loss_on!r}")
    if isinstance(tokenizer, (str, os.PathLike)):
        import transformers  # imported only when a tokenizer is given by path

        tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    elif hasattr(tokenizer, "apply_chat_template"):
        tok = tokenizer
    else:
        raise TypeError(
            f"tokenizer must be a transformers tokenizer or a path to one, got "
            f"{type(tokenizer).__name__}"
        )
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("the tokenizer has no chat template (tokenizer.chat_template)")
    if loss_on == "assistant" and not _GENERATION_TAG.search(template):
        raise with_params(
            ValueError,
            Param("loss_on", "assistant"),
            " needs a chat template with {% generation %} ... {% endgeneration %} around the "
            "assistant's tokens (transformers' assistant mask); this template has none",
        )
    return tok


def encode_record(tok: Any, record: Any, loss_on: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64 (n,), mask uint8 (n,))`` of one record (see the module docstring);
    ``ValueError`` naming the problem of a bad one."""
    record = getattr(record, "record", record)
    problem = record_problem(record, loss_on)
    if problem is not None:
        raise ValueError(problem)
    if loss_on == "completion":
        return _completion(tok, record)
    out = tok.apply_chat_template(
        record["messages"],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=loss_on == "assistant",
        **_template_options(record),
    )
    ids = np.asarray(out["input_ids"], dtype=np.int64)
    if loss_on == "all":
        return ids, np.ones(ids.shape[0], dtype=np.uint8)
    mask = np.asarray(out.get("assistant_masks", np.zeros(ids.shape[0])), dtype=np.uint8)
    if mask.shape != ids.shape:  # never seen; the store would refuse it anyway
        raise ValueError("the template's assistant mask does not fit its tokens")
    return ids, mask


def _completion(tok: Any, record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        eos = getattr(tok, "eos_token", None)
        if eos and not completion.endswith(eos):
            completion += eos
        head = list(tok(prompt)["input_ids"])
        full = list(tok(prompt + completion)["input_ids"])
    else:
        options = _template_options(record)
        head = _ids(
            tok.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, **options)
        )
        full = _ids(tok.apply_chat_template(prompt + completion, tokenize=True, **options))
    n_prompt = 0
    for a, b in zip(head, full):  # the common prefix: the completion starts where they differ
        if a != b:
            break
        n_prompt += 1
    mask = np.ones(len(full), dtype=np.uint8)
    mask[:n_prompt] = 0
    return np.asarray(full, dtype=np.int64), mask


def _ids(out: Any) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


class ChatTokenizer(Tokenizer):
    """The tokenizer of a chat build: ``base`` (the folder's tokenizer: its spec, ids, dtype and
    eot) and its chat template (the folder's transformers tokenizer).  :meth:`encode_masked`
    encodes records into ids and masks; workers rebuild it from ``(spec, loss_on)``.

    Raises
    ------
    ValueError
        ``loss_on`` unknown, a base with a special-token template or not loaded from a
        tokenizer folder, or (from
        :func:`chat_template_tokenizer`) a template missing or without ``{% generation %}``.
    """

    def __init__(self, base: Tokenizer, loss_on: str) -> None:
        if loss_on not in _LOSS_ON:
            raise ValueError(f"loss_on must be one of {list(_LOSS_ON)}, got {loss_on!r}")
        path = base.spec.path
        if getattr(base, "template", None) is not None:
            raise with_params(
                ValueError,
                Param("loss_on", loss_on),
                " takes no ",
                Param("template"),
                ": the chat template places the special tokens",
            )
        if path is None or not os.path.isdir(path):
            raise with_params(
                ValueError,
                Param("loss_on", loss_on),
                " needs a tokenizer folder holding a chat template (its "
                f"tokenizer_config.json), got {base.spec}",
            )
        self.base, self.loss_on = base, loss_on
        self.spec = base.spec
        self.eot_id, self.vocab_size, self.max_id = base.eot_id, base.vocab_size, base.max_id
        self._tok = chat_template_tokenizer(path, loss_on)

    @property
    def token_dtype(self) -> np.dtype:
        return self.base.token_dtype

    def encode_masked(self, records: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(ids, mask)`` of each record (:class:`ChatRecord` or dict): ids of ``token_dtype``,
        mask uint8; raises on the first record it cannot encode."""
        dtype = self.token_dtype
        out = []
        for record in records:
            ids, mask = encode_record(self._tok, record, self.loss_on)
            out.append((_id_array(ids.tolist(), dtype, self), mask))
        return out

    def encode_batch(self, texts: list[Any]) -> list[np.ndarray]:
        return [ids for ids, _ in self.encode_masked(texts)]

    def decode(self, ids: Any) -> str:
        return self.base.decode(ids)

    def __reduce__(self):
        return (ChatTokenizer, (self.base, self.loss_on))
