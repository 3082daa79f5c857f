"""The tokenizer worker pool: batches tokenized in order, in this process or in a pool.

:func:`_tokenize` tokenizes in this process when there is one worker or one batch; otherwise it
forks (where the platform can) a pool of ``workers`` processes, each rebuilding the tokenizer
once from its picklable spec (a chat build's :class:`~mmpack._src.ingest.chat_template.ChatTokenizer` from its spec and
``loss_on``) and running it single-threaded, with at most ``2 * workers`` batches
in flight, consumed in submission order: the output is the same with one worker or many.  A batch
that fails to tokenize is retried text by text to find the texts that fail (:func:`_encode`).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from mmpack._src.ingest.batching import _Batch
from mmpack._src.ingest.chat_template import ChatTokenizer
from mmpack._src.ingest.records import _describe
from mmpack._src.ingest.tokenizer import Tokenizer, TokenizerSpec, load_tokenizer

__all__: list[str] = []

_worker_tokenizer: Tokenizer | None = None


def _init_worker(spec: TokenizerSpec, loss_on: str | None = None) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _worker_tokenizer = load_tokenizer(spec)
    if loss_on is not None:  # a chat build: the folder's template around it
        _worker_tokenizer = ChatTokenizer(_worker_tokenizer, loss_on)


def _worker_encode(texts: list[str]):
    assert _worker_tokenizer is not None  # set by _init_worker, the pool's initializer
    return _encode(_worker_tokenizer, texts)


def _encode(tok: Tokenizer, texts: list[Any]):
    """Tokenize a batch -> (flat tokens, lengths int64 (k',), failures [(index, reason)],
    flat loss mask uint8 or None).  A :class:`~mmpack._src.ingest.chat_template.ChatTokenizer`
    encodes chat records into ids and masks; any other tokenizer texts (no mask)."""
    masked = isinstance(tok, ChatTokenizer)
    encode: Any = tok.encode_masked if isinstance(tok, ChatTokenizer) else tok.encode_batch
    try:
        arrays = encode(texts)
        failures: list[tuple[int, str]] = []
    except Exception:  # find the texts that fail, one at a time
        arrays, failures = [], []
        for k, text in enumerate(texts):
            try:
                arrays.append(encode([text])[0])
            except Exception as exc:
                failures.append((k, f"cannot tokenize: {_describe(exc)}"))
    masks = None
    if masked:
        masks = np.concatenate([m for _, m in arrays]) if arrays else np.empty(0, np.uint8)
        arrays = [ids for ids, _ in arrays]
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=tok.token_dtype)
    return flat, lengths, failures, masks


def _tokenize(batches: Iterator[_Batch], tok: Tokenizer, workers: int):
    """Yield ``(batch, encoded)`` in input order; a pool only when it can help."""
    first = next(batches, None)
    if first is None:
        return
    second = next(batches, None) if workers > 1 else None
    if second is None:
        yield first, _encode(tok, first.texts)
        for batch in batches:
            yield batch, _encode(tok, batch.texts)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    loss_on = tok.loss_on if isinstance(tok, ChatTokenizer) else None
    pool = ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(tok.spec, loss_on)
    )
    try:
        pending: collections.deque = collections.deque()
        for n, batch in enumerate(_chain(first, second, batches)):
            with _quiet_tokenizers_fork() if n == 0 else contextlib.nullcontext():
                pending.append((batch, pool.submit(_worker_encode, batch.texts)))
            batch.texts = []  # the worker has them; keep only the locations
            if len(pending) >= 2 * workers:
                b, fut = pending.popleft()
                yield b, fut.result()
        while pending:
            b, fut = pending.popleft()
            yield b, fut.result()
    finally:  # also on an error downstream: drop the queued batches, stop the workers
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _quiet_tokenizers_fork():
    """Start the workers with ``TOKENIZERS_PARALLELISM=false``: a forked child then runs the Rust
    tokenizer single-threaded without warning that the parent's thread pool was in use."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def _chain(a, b, rest):
    yield a
    yield b
    yield from rest
