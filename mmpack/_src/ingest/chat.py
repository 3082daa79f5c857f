"""Chat and prompt/completion records tokenized with a tokenizer's own chat template, into
documents with loss masks (``{"input_ids": ..., "loss_mask": ...}``) for :func:`mmpack.build`,
or built into a store by :func:`mmpack.ingest.ingest` with ``loss_on=``.

:func:`chat_documents` turns each record of an iterable into one document in this process;
:func:`build_chat` (what ``mmpack build --loss-on`` runs) builds a store from JSON lines,
JSON, Parquet files or a saved Hugging Face dataset of such records through
:func:`~mmpack.ingest.ingest`: its tokenizer processes, its report, its ``on_error``
policy (a bad record is an issue naming its file and line or row), and with
``engine="dask"``/``"serial"`` :func:`~mmpack.ingest.build_distributed`'s parts.
The records, the masks of ``loss_on`` (``"assistant"``, ``"all"``, ``"completion"``: TRL's
``assistant_only_loss``, no mask, ``completion_only_loss``) and their checks are those of
:mod:`mmpack._src.ingest.chat_template`.  Cost: one template rendering and tokenization per record
(transformers); the documents stream, so memory holds one batch of records.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mmpack._src.ingest.chat_template import chat_template_tokenizer, encode_record
from mmpack._src.ingest.report import IngestReport

__all__ = ["build_chat", "chat_documents"]


def chat_documents(
    records: Iterable[Any], tokenizer: Any, *, loss_on: str = "assistant"
) -> Iterator[dict[str, np.ndarray]]:
    """Documents with loss masks from chat records (see :mod:`mmpack._src.ingest.chat_template`).

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
        without ``{% generation %}`` markers), or a bad record (``record K: ...``).
    """
    tok = chat_template_tokenizer(tokenizer, loss_on)  # refused now, before any record is read
    return (_document(tok, record, k, loss_on) for k, record in enumerate(records))


def _document(tok: Any, record: Any, k: int, loss_on: str) -> dict[str, np.ndarray]:
    try:
        ids, mask = encode_record(tok, record, loss_on)
    except ValueError as exc:
        raise ValueError(f"record {k}: {exc}") from None
    return {"input_ids": ids, "loss_mask": mask}


def build_chat(
    inputs: Any,
    output: str | os.PathLike[str],
    tokenizer: str | os.PathLike[str],
    *,
    loss_on: str = "assistant",
    engine: str = "local",
    **options: Any,
) -> IngestReport:
    """Build the store ``output`` from chat records with a loss mask; returns the report (its
    ``store`` opened).

    Parameters
    ----------
    inputs : path, glob, list of them, dataset or iterable of dicts
        JSON lines / JSON / Parquet files (a ``messages`` column, or ``prompt`` and
        ``completion``), a folder saved by ``datasets`` (``save_to_disk``), a dataset or an
        iterable of records (see :func:`~mmpack.ingest.ingest`).
    output : str or os.PathLike
        The store (a local folder or, with ``engine="local"``, an ``s3://`` / ``file://`` URL).
    tokenizer : str or os.PathLike
        A tokenizer folder holding a chat template (loaded offline).
    loss_on : {"assistant", "all", "completion"}
    engine : {"local", "dask", "serial"}
        ``"local"``: :func:`~mmpack.ingest.ingest` (``workers`` processes); else
        :func:`~mmpack.ingest.build_distributed` (one part per task, joined).
    **options
        More ``ingest`` (or ``build_distributed``) keywords: ``on_error`` (a bad record is
        skipped and reported, ``"skip-some"``'s limits apply; ``"fail"`` refuses the build at
        the first one, nothing written), ``fields`` (keys or columns of each record stored as
        its conversation's per-document fields), ``workers`` (``n_workers`` for an engine),
        ``batch_size``, ``split``, ``backend``, ``overwrite``, ``progress``, ``on_issue``, ...

    Raises
    ------
    IngestError
        Bad records (their file and line, or row, named) beyond ``on_error``'s policy.
    ValueError
        ``loss_on`` unknown, or the tokenizer has no chat template (or, for ``"assistant"``,
        none with ``{% generation %}``).
    """
    if engine == "local":
        from mmpack._src.ingest.pipeline import ingest

        return ingest(inputs, output, tokenizer=tokenizer, loss_on=loss_on, **options)
    from mmpack._src.ingest.distributed import build_distributed

    return build_distributed(
        inputs,
        output,
        engine=engine,
        tokenizer=tokenizer,
        loss_on=loss_on,
        **options,
    )
