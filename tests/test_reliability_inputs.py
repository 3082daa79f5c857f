"""Bad input everywhere: every public entry point refuses it with a clear exception of the right
type whose message names the value, and leaves nothing behind.

``TABLE`` is the specification *and* the source of the table in ``docs/reliability.md``:
``test_docs_table_in_sync`` fails if the markdown lists other rows (regenerate it with
``python tests/test_reliability_inputs.py``).  Besides the table: hypothesis drives ``build`` and
``WindowDataset`` with arbitrary junk and asserts that only the documented exception types
occur; a subprocess with ``NUMBA_BOUNDSCHECK=1`` reads every window of edge-case stores to prove
the kernels never index out of bounds.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import Mixture, PackedDataset, ResumableSampler, StreamingPacker, WindowDataset
from mmpack.errors import (
    FormatError,
    IngestError,
    MmpackError,
    StateMismatchError,
    StoreExistsError,
    StoreNotFoundError,
)
from mmpack.ingest import ingest
from mmpack.store import StoreWriter

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"


class Env:
    """What a row's call gets: a fresh folder, a small store in it, a window view of it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = mmpack.build(tmp / "store", [[1, 2, 3], [4, 5], []], fsync=False)
        self.ds = WindowDataset(self.store, 2)
        (tmp / "file").write_text("not a store")
        (tmp / "empty").mkdir()
        os.symlink(tmp / "store", tmp / "link")

    def build(self, docs: Any, **kwargs) -> Any:
        return mmpack.build(self.tmp / "new", docs, fsync=False, **kwargs)


@dataclass(frozen=True)
class Row:
    entry: str
    input: str
    exc: type[BaseException]
    message: str  # a fragment the message must contain
    call: Callable[[Env], Any]


def _loader(view: Any, **kw: Any) -> Any:
    import mmpack.torch

    return mmpack.torch.loader(view, 1, **kw)


def _scheduled(env: Env) -> Mixture:
    schedule = mmpack.Schedule([(0, [1, 0]), (10, [0, 1])], interpolate="linear")
    return Mixture([env.ds, env.ds], schedule, num_samples=10)


def _loader_state_at(loader: Any, batches: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def _stream(source, **kw):
    params = dict(batch_size=1, seqlen=4, buffer_size=4)
    params.update(kw)
    return StreamingPacker(source, **params)


def _packer_state(_into=None, **changes):
    """A StreamingPacker state taken after one batch, with ``changes`` applied, loaded into a
    fresh packer of the same source (made with the extra arguments ``_into``)."""
    docs = [[1, 2, 3]] * 20
    packer = _stream(docs, buffer_size=2, readahead=2)
    next(iter(packer))
    state = {**packer.state_dict(), **changes}
    return _stream(docs, buffer_size=2, readahead=2, **(_into or {})).load_state_dict(state)


def _sampler_state_after(n_drawn, consumed):
    sampler = ResumableSampler(10)
    it = iter(sampler)
    for _ in range(n_drawn):
        next(it)
    return sampler.state_dict(consumed=consumed)


def _sampler_drawn(k):
    sampler = ResumableSampler(10, shuffle=False)
    it = iter(sampler)
    for _ in range(k):
        next(it)
    return sampler


def _sampler_state(**changes):
    """A ResumableSampler state with ``changes`` (``KeyError``: the field removed)."""
    state = {**ResumableSampler(10).state_dict(), **changes}
    return {k: v for k, v in state.items() if v is not KeyError}


def _stages_over_stage_0(env: Env) -> Any:
    """Two stages of one step each, the first served."""
    stages = mmpack.Stages([(2, env.ds, 2), (2, env.ds, 2)])
    next(iter(stages))
    return stages


class _Split:
    """A datasets-like split (``.iter(batch_size)`` of column dicts)."""

    def iter(self, batch_size):
        yield {"text": ["a document"]}


def _build_over_store_with(env: Env, name: str) -> Any:
    (env.tmp / "store" / name).write_text("a user's file")
    try:
        return mmpack.build(env.tmp / "store", [[1]], overwrite=True, fsync=False)
    finally:
        (env.tmp / "store" / name).unlink()


def _elsewhere(call: Callable[[Path], Any]) -> Any:
    """``call(folder)`` in a temporary folder of its own, removed afterwards (a row's own
    folder must hold nothing new)."""
    with tempfile.TemporaryDirectory() as tmp:
        return call(Path(tmp))


def _open_negative_npy(tmp: Path) -> Any:
    np.save(tmp / "t.npy", np.array([5, -1, 0], dtype=np.int32))
    return mmpack.open(tmp / "t.npy", eos=0, cache_dir=tmp / "cache")


def _join_into_a_part(tmp: Path) -> Any:
    mmpack.build(tmp / "p", [[1, 2]], fsync=False)
    mmpack.join([tmp / "p"], tmp / "A", fsync=False)
    mmpack.join([tmp / "A"], tmp / "B", fsync=False)
    return mmpack.join([tmp / "B"], tmp / "A", overwrite=True, fsync=False)


def _open_cyclic_join(tmp: Path) -> Any:
    import json

    mmpack.build(tmp / "p", [[1, 2]], fsync=False)
    mmpack.join([tmp / "p"], tmp / "A", fsync=False)
    mmpack.join([tmp / "A"], tmp / "B", fsync=False)
    manifest = tmp / "A" / "mmpack-join.json"
    raw = json.loads(manifest.read_text())
    raw["parts"][0]["location"] = "../B"
    manifest.write_text(json.dumps(raw))
    return mmpack.open(tmp / "B")


def _add_batch(env: Env, tokens: Any, lengths: Any) -> None:
    with StoreWriter(env.tmp / "new", fsync=False) as w:
        w.add_batch(np.asarray(tokens), lengths)


@functools.cache
def _chat_tokenizer() -> Any:
    from _chat import make_tokenizer

    return make_tokenizer()


def _chat_build(env: Env, records: list[Any], template: Any = "chat", **kw: Any) -> Any:
    """``ingest`` of chat ``records`` into ``env``'s folder with a tokenizer folder saved
    elsewhere (its chat template replaced by ``template``, None: removed)."""
    tok = _chat_tokenizer()

    def run(tmp: Path) -> Any:
        saved = tok.chat_template
        try:
            tok.chat_template = saved if template == "chat" else template
            tok.save_pretrained(tmp / "tok")
        finally:
            tok.chat_template = saved
        return ingest(iter(records), env.tmp / "new", tokenizer=tmp / "tok", on_error="fail", **kw)

    return _elsewhere(run)


def _fields_build(env: Env, records: list[Any], kind: str, **kw: Any) -> Any:
    """``ingest(fields=["source", "lang"])`` of ``records`` written elsewhere as ``kind``
    (``"parquet"``, a saved ``"dataset"``, ``"jsonl"``) into ``env``'s folder."""

    def run(tmp: Path) -> Any:
        from _chat import save_dataset, write_jsonl, write_parquet

        path = tmp / {"parquet": "in.parquet", "dataset": "saved", "jsonl": "in.jsonl"}[kind]
        {"parquet": write_parquet, "dataset": save_dataset, "jsonl": write_jsonl}[kind](
            path, records
        )
        kw.setdefault("fields", ["source", "lang"])
        return ingest(path, env.tmp / "new", on_error="fail", on_issue=lambda i: None, **kw)

    return _elsewhere(run)


_FIELD_ROWS = [{"text": "a", "source": 1, "lang": "en"}, {"text": "b", "source": 2, "lang": "fr"}]


_HI = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]


TABLE: list[Row] = [
    # ------------------------------------------------------------------ mmpack.build: documents
    Row("mmpack.build", "docs=None", TypeError, "got NoneType", lambda e: e.build(None)),
    Row(
        "mmpack.build",
        "a loss mask of another length than its tokens",
        ValueError,
        "document 0: loss_mask has 2 values but input_ids has 3 tokens",
        lambda e: e.build([{"input_ids": [1, 2, 3], "loss_mask": [1, 0]}]),
    ),
    Row(
        "mmpack.build",
        "a loss mask holding a value other than 0/1",
        ValueError,
        "document 0: loss_mask[1] is 2; a loss mask holds 0 (not a target) or 1",
        lambda e: e.build([{"input_ids": [1, 2], "loss_mask": [0, 2]}]),
    ),
    Row(
        "ingest(loss_on=)",
        "a chat record without messages",
        IngestError,
        "list_iterator[0]: the record has keys ['text']; a conversation is {'messages'",
        lambda e: _chat_build(e, [{"text": "hi"}], loss_on="assistant"),
    ),
    Row(
        "ingest(loss_on=)",
        "a chat message of an unknown role",
        IngestError,
        "list_iterator[1]: messages[0] has the unknown role 'robot'",
        lambda e: _chat_build(
            e, [{"messages": _HI}, {"messages": [{"role": "robot", "content": "x"}]}], loss_on="all"
        ),
    ),
    Row(
        "ingest(loss_on=)",
        "a tokenizer without a chat template",
        ValueError,
        "the tokenizer has no chat template",
        lambda e: _chat_build(e, [{"messages": _HI}], template=None, loss_on="all"),
    ),
    Row(
        "ingest(loss_on=)",
        "loss_on='assistant', a template without {% generation %}",
        ValueError,
        "loss_on='assistant' needs a chat template with {% generation %}",
        lambda e: _chat_build(
            e, [{"messages": _HI}], template="{{ messages[0]['content'] }}", loss_on="assistant"
        ),
    ),
    Row(
        "ingest(loss_on=)",
        "loss_on='assistant', a template naming add_generation_prompt but no {% generation %}",
        ValueError,
        "loss_on='assistant' needs a chat template with {% generation %}",
        lambda e: _chat_build(
            e,
            [{"messages": _HI}],
            template="{{ messages[0]['content'] }}{% if add_generation_prompt %}>{% endif %}",
            loss_on="assistant",
        ),
    ),
    Row("mmpack.build", "docs is a str", TypeError, "not a string", lambda e: e.build("text")),
    Row("mmpack.build", "docs is an int", TypeError, "got int", lambda e: e.build(5)),
    Row(
        "mmpack.build",
        "a document is a str",
        TypeError,
        "document 1 is a str",
        lambda e: e.build([[1], "hello"]),
    ),
    Row(
        "mmpack.build",
        "a document is bytes",
        TypeError,
        "document 0 is a bytes",
        lambda e: e.build([b"ab"]),
    ),
    Row(
        "mmpack.build",
        "a document is 2-D",
        TypeError,
        "document 0 has shape (2, 2)",
        lambda e: e.build([[[1, 2], [3, 4]]]),
    ),
    Row(
        "mmpack.build",
        "a document is a scalar",
        TypeError,
        "document 0 is int 5",
        lambda e: e.build([5]),
    ),
    Row(
        "mmpack.build",
        "a document is None",
        TypeError,
        "document 1 is NoneType None",
        lambda e: e.build([[1], None]),
    ),
    Row(
        "mmpack.build",
        "a ragged nested document",
        ValueError,
        "document 0: cannot read it",
        lambda e: e.build([[[1], [2, 3]]]),
    ),
    Row(
        "mmpack.build",
        "a negative token",
        ValueError,
        "document 1 has a negative token -1 at position 2",
        lambda e: e.build([[1], [2, 3, -1]]),
    ),
    Row(
        "mmpack.build",
        "a negative token (torch)",
        ValueError,
        "document 0 has a negative token -7",
        lambda e: e.build([torch.tensor([1, -7])]),
    ),
    Row(
        "mmpack.build",
        "a tensor on the meta device (list or generator)",
        ValueError,
        "document 1 is a tensor on the 'meta' device",
        lambda e: e.build([[1], torch.empty(3, dtype=torch.int64, device="meta")]),
    ),
    Row(
        "mmpack.build",
        "a token >= 2**64",
        ValueError,
        "token 18446744073709551616 at position 1 that does not fit in int64",
        lambda e: e.build([[1, 2**64]]),
    ),
    Row(
        "mmpack.build",
        "a token == 2**63",
        ValueError,
        "document 1 has a token 9223372036854775808 at position 0 that does not fit in int64",
        lambda e: e.build([[1], [2**63]]),
    ),
    Row(
        "mmpack.build",
        "a uint64 array holding 2**63",
        ValueError,
        "document 0 has a token 9223372036854775808 at position 2 that does not fit in int64",
        lambda e: e.build([np.array([1, 2, 2**63], dtype=np.uint64)]),
    ),
    Row(
        "mmpack.build",
        "a float token >= 2**63",
        ValueError,
        "too large token 9.223372036854776e+18",
        lambda e: e.build([np.array([2.0**63])]),
    ),
    Row(
        "mmpack.build",
        "a token too large for the given dtype",
        ValueError,
        "document 0 has token 256 at position 0, which does not fit dtype=uint8 (max 255)",
        lambda e: e.build([[256]], dtype=np.uint8),
    ),
    Row(
        "mmpack.build",
        "shuffle_docs=-1",
        ValueError,
        "shuffle_docs must be made of ints in [0, 2**64), got -1",
        lambda e: e.build([[1]], shuffle_docs=-1),
    ),
    Row(
        "mmpack.build",
        "shuffle_docs='7'",
        TypeError,
        "shuffle_docs must be an integer, got str '7'",
        lambda e: e.build([[1]], shuffle_docs="7"),
    ),
    Row(
        "mmpack.build",
        "a non-integer float token",
        ValueError,
        "non-integer token 1.5 at position 0",
        lambda e: e.build([[1.5]]),
    ),
    Row(
        "mmpack.build",
        "a NaN token",
        ValueError,
        "non-integer token nan",
        lambda e: e.build([[1.0, float("nan")]]),
    ),
    Row(
        "mmpack.build",
        "an infinite token",
        ValueError,
        "non-integer token inf",
        lambda e: e.build([[float("inf")]]),
    ),
    Row(
        "mmpack.build",
        "a bool token",
        ValueError,
        "non-integer token True (bool) at position 1",
        lambda e: e.build([[1, True]]),
    ),
    Row(
        "mmpack.build",
        "a bool array",
        ValueError,
        "holds bool values",
        lambda e: e.build([np.array([True])]),
    ),
    Row(
        "mmpack.build",
        "a None token",
        ValueError,
        "non-integer token None (NoneType) at position 1",
        lambda e: e.build([[1, None]]),
    ),
    Row(
        "mmpack.build",
        "a str token",
        ValueError,
        "holds <U1 values (e.g. 'a')",
        lambda e: e.build([["a"]]),
    ),
    Row(
        "mmpack.build",
        "a complex token",
        ValueError,
        "holds complex128 values",
        lambda e: e.build([[1j]]),
    ),
    # ------------------------------------------------------------------ mmpack.build: arguments
    Row(
        "mmpack.build",
        "dtype=np.int32",
        ValueError,
        "dtype=<class 'numpy.int32'> is not supported",
        lambda e: e.build([[1]], dtype=np.int32),
    ),
    Row(
        "mmpack.build",
        "dtype='float32'",
        ValueError,
        "dtype='float32' is not supported",
        lambda e: e.build([[1]], dtype="float32"),
    ),
    Row(
        "mmpack.build",
        "dtype='junk'",
        TypeError,
        "dtype='junk' is not a numpy dtype",
        lambda e: e.build([[1]], dtype="junk"),
    ),
    Row(
        "mmpack.build",
        "backend='s3'",
        ValueError,
        "backend='s3' is not one of ['memmap', 'zarr']",
        lambda e: e.build([[1]], backend="s3"),
    ),
    Row(
        "mmpack.build",
        "buffer_tokens=0",
        ValueError,
        "buffer_tokens must be a positive integer, got 0",
        lambda e: e.build([[1]], buffer_tokens=0),
    ),
    Row(
        "mmpack.build",
        "buffer_tokens=1.5",
        ValueError,
        "buffer_tokens must be a positive integer, got 1.5",
        lambda e: e.build([[1]], buffer_tokens=1.5),
    ),
    Row(
        "mmpack.build",
        "path=3",
        TypeError,
        "path must be a str or os.PathLike, got int",
        lambda e: mmpack.build(3, [[1]]),
    ),
    Row(
        "mmpack.build",
        "path exists (no overwrite)",
        StoreExistsError,
        "exists; pass overwrite=True",
        lambda e: mmpack.build(e.tmp / "store", [[1]]),
    ),
    Row(
        "mmpack.build",
        "path is a file, overwrite=True",
        FileExistsError,
        "is a file, not a store",
        lambda e: mmpack.build(e.tmp / "file", [[1]], overwrite=True, fsync=False),
    ),
    Row(
        "mmpack.build",
        "path is a folder of other files, overwrite=True",
        FileExistsError,
        "is not an mmpack store (it holds empty, file, link, store); refusing to replace it",
        lambda e: mmpack.build(e.tmp, [[1]], overwrite=True, fsync=False),
    ),
    Row(
        "mmpack.build",
        "path is a store holding a file it does not list, overwrite=True",
        FileExistsError,
        "is an mmpack store with other files (it holds notes.txt); refusing to replace it",
        lambda e: _build_over_store_with(e, "notes.txt"),
    ),
    Row(
        "mmpack.build",
        "path is a symlink, overwrite=True",
        FileExistsError,
        "is a symbolic link; refusing",
        lambda e: mmpack.build(e.tmp / "link", [[1]], overwrite=True, fsync=False),
    ),
    Row(
        "StoreWriter.add_batch",
        "uint64 lengths whose sum wraps",
        ValueError,
        "lengths[0] is 18446744073709551615 but tokens holds only 1 items",
        lambda e: _add_batch(e, [5], np.array([2**64 - 1, 2], dtype=np.uint64)),
    ),
    Row(
        "StoreWriter.add_batch",
        "int64 lengths summing past 2**63",
        ValueError,
        "lengths[0] is 9223372036854775807 but tokens holds only 3 items",
        lambda e: _add_batch(e, [1, 2, 3], np.array([2**63 - 1, 2**63 - 1, 5], dtype=np.int64)),
    ),
    Row(
        "StoreWriter.add_batch",
        "lengths not summing to the tokens",
        ValueError,
        "tokens holds 3 items but lengths sum to 2",
        lambda e: _add_batch(e, [1, 2, 3], [1, 1]),
    ),
    Row(
        "mmpack.build",
        "parent folder missing",
        FileNotFoundError,
        "parent folder",
        lambda e: mmpack.build(e.tmp / "no" / "s", [[1]]),
    ),
    Row(
        "mmpack.build",
        "parent is a file",
        NotADirectoryError,
        "is a file, not a folder",
        lambda e: mmpack.build(e.tmp / "file" / "s", [[1]]),
    ),
    # ------------------------------------------------------------------ mmpack.open
    Row(
        "mmpack.open",
        "missing path",
        StoreNotFoundError,
        "the path does not exist",
        lambda e: mmpack.open(e.tmp / "absent"),
    ),
    Row(
        "mmpack.open",
        "path is a file",
        FormatError,
        "is a file; an mmpack store is a folder",
        lambda e: mmpack.open(e.tmp / "file"),
    ),
    Row(
        "mmpack.open",
        "an empty folder",
        FormatError,
        "is not an mmpack store",
        lambda e: mmpack.open(e.tmp / "empty"),
    ),
    Row(
        "mmpack.open",
        "path=None",
        TypeError,
        "path must be a str or os.PathLike, got NoneType",
        lambda e: mmpack.open(None),
    ),
    Row(
        "mmpack.open",
        "an int32 .npy holding -1 (eos=0)",
        FormatError,
        "1 negative token ids (the first at token 1: -1; the file's dtype is int32)",
        lambda e: _elsewhere(_open_negative_npy),
    ),
    Row(
        "mmpack.open",
        "a join whose manifest names a join holding it",
        FormatError,
        "the join contains itself",
        lambda e: _elsewhere(_open_cyclic_join),
    ),
    Row(
        "mmpack.join",
        "a part holding the join (overwrite=True)",
        ValueError,
        "contains the join",
        lambda e: _elsewhere(_join_into_a_part),
    ),
    # ------------------------------------------------------------------ TokenStore
    Row(
        "TokenStore[j]",
        "j out of range",
        IndexError,
        "document index 3 is out of range for 3 documents",
        lambda e: e.store[3],
    ),
    Row(
        "TokenStore[j]",
        "j = -4",
        IndexError,
        "document index -4 is out of range",
        lambda e: e.store[-4],
    ),
    Row(
        "TokenStore[j]",
        "j float",
        TypeError,
        "document index must be an integer, got float 1.0",
        lambda e: e.store[1.0],
    ),
    Row("TokenStore[j]", "j bool", TypeError, "got bool True", lambda e: e.store[True]),
    Row("TokenStore[j]", "j str", TypeError, "got str '0'", lambda e: e.store["0"]),
    Row("TokenStore[j]", "j None", TypeError, "got NoneType None", lambda e: e.store[None]),
    Row(
        "TokenStore.read_range",
        "start < 0",
        IndexError,
        "token range [-1, 2) is outside [0, 5]",
        lambda e: e.store.read_range(-1, 2),
    ),
    Row(
        "TokenStore.read_range",
        "stop > num_tokens",
        IndexError,
        "token range [0, 6) is outside",
        lambda e: e.store.read_range(0, 6),
    ),
    Row(
        "TokenStore.read_range",
        "stop < start",
        IndexError,
        "token range [3, 2)",
        lambda e: e.store.read_range(3, 2),
    ),
    Row(
        "TokenStore.read_range",
        "float bounds",
        TypeError,
        "start and stop must be integers, got 0.5 and 1",
        lambda e: e.store.read_range(0.5, 1),
    ),
    # ------------------------------------------------------------------ WindowDataset
    Row(
        "WindowDataset",
        "store is neither a store nor a path",
        TypeError,
        "store must be a TokenStore or a path to one, got list",
        lambda e: WindowDataset([[1, 2]], 2),
    ),
    Row(
        "WindowDataset",
        "a path to no store",
        FileNotFoundError,
        "no mmpack store",
        lambda e: WindowDataset(str(e.tmp / "nowhere"), 2),
    ),
    Row(
        "WindowDataset",
        "seqlen=0",
        ValueError,
        "seqlen must be >= 1, got 0",
        lambda e: WindowDataset(e.store, 0),
    ),
    Row(
        "WindowDataset",
        "seqlen=-3",
        ValueError,
        "seqlen must be >= 1, got -3",
        lambda e: WindowDataset(e.store, -3),
    ),
    Row(
        "WindowDataset",
        "seqlen=2.5",
        TypeError,
        "seqlen must be an integer, got float 2.5",
        lambda e: WindowDataset(e.store, 2.5),
    ),
    Row(
        "WindowDataset",
        "seqlen=True",
        TypeError,
        "seqlen must be an integer, got bool True",
        lambda e: WindowDataset(e.store, True),
    ),
    Row(
        "WindowDataset",
        "seqlen=2**31",
        ValueError,
        "seqlen=2147483648 does not fit the int32 cu_seqlens",
        lambda e: WindowDataset(e.store, 2**31),
    ),
    Row(
        "WindowDataset",
        "stride=0",
        ValueError,
        "stride must be >= 1, got 0",
        lambda e: WindowDataset(e.store, 2, 0),
    ),
    Row(
        "WindowDataset",
        "stride=-1",
        ValueError,
        "stride must be >= 1, got -1",
        lambda e: WindowDataset(e.store, 2, -1),
    ),
    Row(
        "WindowDataset",
        "eot='x'",
        TypeError,
        "eot must be an integer token id, got str 'x'",
        lambda e: WindowDataset(e.store, 2, eot="x"),
    ),
    Row(
        "WindowDataset",
        "eot=2**63",
        ValueError,
        "eot=9223372036854775808 does not fit in int64",
        lambda e: WindowDataset(e.store, 2, eot=2**63),
    ),
    Row(
        "WindowDataset[i]",
        "i out of range",
        IndexError,
        "sample index 2 is out of range for 2 samples",
        lambda e: e.ds[2],
    ),
    Row(
        "WindowDataset[i]",
        "i = 2**70",
        IndexError,
        "sample index 1180591620717411303424 is out of range",
        lambda e: e.ds[2**70],
    ),
    Row(
        "WindowDataset[i]",
        "i float",
        TypeError,
        "sample index must be an integer, got float 0.0",
        lambda e: e.ds[0.0],
    ),
    Row("WindowDataset[i]", "i None", TypeError, "got NoneType None", lambda e: e.ds[None]),
    Row("WindowDataset[i]", "i bool", TypeError, "got bool False", lambda e: e.ds[False]),
    Row(
        "WindowDataset.__getitems__",
        "2-D indices",
        TypeError,
        "indices must be a 1-D sequence of integers, got shape (2, 1)",
        lambda e: e.ds.__getitems__(np.zeros((2, 1), dtype=np.int64)),
    ),
    Row(
        "WindowDataset.__getitems__",
        "float indices",
        TypeError,
        "indices must be integers, got dtype float64",
        lambda e: e.ds.__getitems__([0.0, 1.0]),
    ),
    Row(
        "WindowDataset.__getitems__",
        "a bool array of indices",
        TypeError,
        "got dtype bool",
        lambda e: e.ds.__getitems__(np.array([True])),
    ),
    Row(
        "WindowDataset.__getitems__",
        "str indices",
        TypeError,
        "got dtype <U1",
        lambda e: e.ds.__getitems__(["0"]),
    ),
    Row(
        "WindowDataset.__getitems__",
        "None",
        TypeError,
        "got shape ()",
        lambda e: e.ds.__getitems__(None),
    ),
    Row(
        "WindowDataset.__getitems__",
        "an index out of range",
        IndexError,
        "index -3 is out of range for 2 samples",
        lambda e: e.ds.__getitems__(np.array([0, -3], dtype=np.int32)),
    ),
    Row(
        "WindowDataset.locate",
        "i out of range",
        IndexError,
        "sample index 9 is out of range",
        lambda e: e.ds.locate(9),
    ),
    # ------------------------------------------------------------------ PackedDataset
    Row(
        "PackedDataset",
        "store=5",
        TypeError,
        "store must be a TokenStore or a path to one, got int",
        lambda e: PackedDataset(5, 4),
    ),
    Row(
        "PackedDataset",
        "missing store path",
        StoreNotFoundError,
        "the path does not exist",
        lambda e: PackedDataset(e.tmp / "absent", 4),
    ),
    Row(
        "PackedDataset",
        "seqlen=0",
        ValueError,
        "seqlen must be in [1, 2147483647), got 0",
        lambda e: PackedDataset(e.store, 0),
    ),
    Row(
        "PackedDataset",
        "seqlen=2.5",
        TypeError,
        "seqlen must be an integer, got float 2.5",
        lambda e: PackedDataset(e.store, 2.5),
    ),
    Row(
        "PackedDataset",
        "mode='x'",
        ValueError,
        "mode must be one of ('causal', 'mlm'), got 'x'",
        lambda e: PackedDataset(e.store, 4, mode="x"),
    ),
    Row(
        "PackedDataset",
        "region_tokens=0",
        ValueError,
        "region_tokens must be >= 1, got 0",
        lambda e: PackedDataset(e.store, 4, region_tokens=0),
    ),
    Row(
        "PackedDataset",
        "region_tokens='big'",
        ValueError,
        "region_tokens must be an integer >= 1, 'auto' or None, got 'big'",
        lambda e: PackedDataset(e.store, 4, region_tokens="big"),
    ),
    Row(
        "PackedDataset.block_bounds",
        "block_bytes=0",
        ValueError,
        "block_bytes must be >= 1, got 0",
        lambda e: PackedDataset(e.store, 4).block_bounds(0),
    ),
    Row(
        "PackedDataset[i]",
        "i out of range",
        IndexError,
        "sample index 100 is out of range",
        lambda e: PackedDataset(e.store, 4)[100],
    ),
    Row(
        "PackedDataset[i]",
        "i float",
        TypeError,
        "sample index must be an integer, got float 1.0",
        lambda e: PackedDataset(e.store, 4)[1.0],
    ),
    # ------------------------------------------------------------------ ResumableSampler
    Row(
        "ResumableSampler",
        "world_size=0",
        ValueError,
        "world_size must be >= 1, got world_size=0",
        lambda e: ResumableSampler(10, world_size=0),
    ),
    Row(
        "ResumableSampler",
        "rank >= world_size",
        ValueError,
        "got rank=2, world_size=2",
        lambda e: ResumableSampler(10, rank=2, world_size=2),
    ),
    Row(
        "ResumableSampler",
        "rank=-1",
        ValueError,
        "got rank=-1",
        lambda e: ResumableSampler(10, rank=-1),
    ),
    Row(
        "ResumableSampler",
        "n=-1",
        ValueError,
        "n must be in [0, 2**62], got n=-1",
        lambda e: ResumableSampler(-1),
    ),
    Row(
        "ResumableSampler",
        "n=1.5",
        TypeError,
        "n must be an integer, got float 1.5",
        lambda e: ResumableSampler(1.5),
    ),
    Row(
        "ResumableSampler",
        "seed=-1",
        ValueError,
        "seed must be in [0, 2**64), got seed=-1",
        lambda e: ResumableSampler(3, seed=-1),
    ),
    Row(
        "ResumableSampler",
        "shuffle='yes'",
        TypeError,
        "shuffle must be a bool or 'blocks', got str 'yes'",
        lambda e: ResumableSampler(3, shuffle="yes"),
    ),
    Row(
        "ResumableSampler",
        "shuffle='blocks' without block_bounds",
        ValueError,
        "shuffle='blocks' needs block_bounds",
        lambda e: ResumableSampler(3, shuffle="blocks"),
    ),
    Row(
        "ResumableSampler",
        "block_bounds not ending at n",
        ValueError,
        "block_bounds must end at n=10 (the number of samples), got block_bounds[-1]=9",
        lambda e: ResumableSampler(10, shuffle="blocks", block_bounds=[0, 4, 9]),
    ),
    Row(
        "ResumableSampler",
        "block_bounds not increasing",
        ValueError,
        "block_bounds must be strictly increasing, got block_bounds[2]=4 after block_bounds[1]=4",
        lambda e: ResumableSampler(10, shuffle="blocks", block_bounds=[0, 4, 4, 10]),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "a global-order state into a block-order sampler",
        StateMismatchError,
        "sampler state was saved with shuffle=True but this sampler has shuffle='blocks'",
        lambda e: ResumableSampler(10, shuffle="blocks", block_bounds=[0, 5, 10]).load_state_dict(
            ResumableSampler(10).state_dict()
        ),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "a block-order state of other block bounds",
        StateMismatchError,
        "sampler state was saved with other block_bounds",
        lambda e: ResumableSampler(10, shuffle="blocks", block_bounds=[0, 5, 10]).load_state_dict(
            ResumableSampler(10, shuffle="blocks", block_bounds=[0, 4, 10]).state_dict()
        ),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "state=None",
        FormatError,
        "sampler state must be a dict, got NoneType",
        lambda e: ResumableSampler(3).load_state_dict(None),
    ),
    Row(
        "ResumableSampler.state_dict",
        "consumed > indices handed out",
        ValueError,
        "consumed=5, but the sampler's current iterator has handed out 4 indices",
        lambda e: _sampler_state_after(4, 5),
    ),
    Row(
        "ResumableSampler.state_dict",
        "consumed=2.0",
        TypeError,
        "consumed must be an integer, got float 2.0",
        lambda e: _sampler_state_after(4, 2.0),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "a state without world_size",
        FormatError,
        "sampler state lacks the fields ['world_size']",
        lambda e: ResumableSampler(10).load_state_dict(_sampler_state(world_size=KeyError)),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "n=10.0 in the state",
        FormatError,
        "sampler state field n must be an int, got 10.0",
        lambda e: ResumableSampler(10).load_state_dict(_sampler_state(n=10.0)),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "shuffle=1 in the state",
        FormatError,
        "sampler state field shuffle must be a bool or 'blocks', got 1",
        lambda e: ResumableSampler(10).load_state_dict(_sampler_state(shuffle=1)),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "rank=2 in a state of world_size=2",
        FormatError,
        "sampler state has rank=2, expected 0 <= rank < world_size=2",
        lambda e: ResumableSampler(10).load_state_dict(_sampler_state(world_size=2, rank=2)),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "a state of another fingerprint",
        StateMismatchError,
        "sampler state was saved with fingerprint='a' but this sampler has fingerprint='b'",
        lambda e: ResumableSampler(10, fingerprint="b").load_state_dict(
            ResumableSampler(10, fingerprint="a").state_dict()
        ),
    ),
    Row(
        "mmpack.torch.loader",
        "shuffle=True over a mixture whose weights follow a schedule",
        ValueError,
        "read it in its own order with shuffle=False",
        lambda e: _loader(_scheduled(e), shuffle=True),
    ),
    Row(
        "ResumableLoader.load_state_dict",
        "a state of a view of the same length with labels=True",
        StateMismatchError,
        "sampler state was saved with fingerprint=",
        lambda e: _loader(WindowDataset(e.store, 2, labels=True)).load_state_dict(
            _loader(e.ds).state_dict()
        ),
    ),
    Row(
        "ResumableLoader.load_state_dict",
        "a state of the mixture with_schedule(from_position=1) changed, taken at 2",
        StateMismatchError,
        "stands at position 2, past the change",
        lambda e: _loader(_scheduled(e).with_schedule([1, 0], from_position=1)).load_state_dict(
            _loader_state_at(_loader(_scheduled(e)), 2)
        ),
    ),
    Row(
        "ResumableSampler.load_state_dict",
        "unsorted skips in the state",
        FormatError,
        "sampler state field skips must hold sorted, disjoint ranges",
        lambda e: ResumableSampler(10).load_state_dict(_sampler_state(skips=[[5, 6], [1, 2]])),
    ),
    Row(
        "ResumableSampler.skip",
        "a consumed range",
        ValueError,
        "cannot skip [0, 2): global positions below 3 are already consumed",
        lambda e: _sampler_drawn(3).skip(0, 2),
    ),
    Row(
        "ResumableSampler.skip",
        "start >= stop",
        ValueError,
        "skip needs 0 <= start < stop <= 2**64 * n, got start=4, stop=4",
        lambda e: ResumableSampler(10).skip(4, 4),
    ),
    Row(
        "ResumableSampler.replay",
        "a range not consumed yet",
        ValueError,
        "cannot replay [0, 5): only consumed positions can be replayed",
        lambda e: _sampler_drawn(3).replay(0, 5),
    ),
    Row(
        "Stages",
        "unit='steps'",
        ValueError,
        "unit must be 'samples' or 'tokens', got unit='steps'",
        lambda e: mmpack.Stages([(10, e.ds, 2)], unit="steps"),
    ),
    Row(
        "Stages",
        "batch_size=0",
        ValueError,
        "stages[0] batch_size must be >= 1, got 0",
        lambda e: mmpack.Stages([(10, e.ds, 0)]),
    ),
    Row(
        "Stages",
        "shuffle='blocks' over a view without block_bounds",
        TypeError,
        "shuffle='blocks' needs views with block_bounds, got stages[0] view list",
        lambda e: mmpack.Stages([(10, list(range(10)), 2)], shuffle="blocks"),
    ),
    Row(
        "Stages.skip",
        "a stage that is over",
        ValueError,
        "cannot skip [0, 4) in stage 0: stage 0 is over (the run is in stage 1)",
        lambda e: _stages_over_stage_0(e).skip(0, 4, stage=0),
    ),
    Row(
        "Stages.replay",
        "a later stage (nothing of it consumed)",
        ValueError,
        "in stage 1: cannot replay [0, 2): only consumed positions can be replayed",
        lambda e: mmpack.Stages([(2, e.ds, 2), (2, e.ds, 2)]).replay(0, 2, stage=1),
    ),
    Row(
        "Stages.positions_of",
        "a step already served",
        ValueError,
        "cannot find the positions of steps [0, 1): the run is at step 1",
        lambda e: _stages_over_stage_0(e).positions_of(0, 1),
    ),
    # ------------------------------------------------------------------ mmpack.ingest
    Row(
        "mmpack.ingest.ingest",
        "an input inside the output, overwrite=True",
        ValueError,
        "lies inside output=",
        lambda e: ingest([e.tmp / "store" / "tokens.bin"], e.tmp / "store", overwrite=True),
    ),
    Row(
        "mmpack.ingest.ingest",
        "a glob matching only the output, overwrite=True",
        FileNotFoundError,
        "matches only the store being built",
        lambda e: ingest(str(e.tmp / "store" / "*"), e.tmp / "store", overwrite=True),
    ),
    Row(
        "mmpack.ingest.ingest",
        "a DatasetDict of two splits, no split",
        ValueError,
        "dict holds several splits (test, train); build one split per store: choose it with "
        "split='test'",
        lambda e: ingest({"train": _Split(), "test": _Split()}, e.tmp / "new"),
    ),
    Row(
        "mmpack.ingest.ingest",
        "split= not among the DatasetDict's",
        ValueError,
        "split='dev' is not a split of dict (its splits: test, train)",
        lambda e: ingest({"train": _Split(), "test": _Split()}, e.tmp / "new", split="dev"),
    ),
    # ------------------------------------------------------------------ Mixture
    Row(
        "Mixture",
        "no sources",
        ValueError,
        "sources must hold at least one dataset",
        lambda e: Mixture([], []),
    ),
    Row(
        "Mixture",
        "a negative weight",
        ValueError,
        "weights must be finite and non-negative, got [1.0, -1.0]",
        lambda e: Mixture([e.ds, e.ds], [1, -1]),
    ),
    Row(
        "Mixture",
        "a NaN weight",
        ValueError,
        "got [1.0, nan]",
        lambda e: Mixture([e.ds, e.ds], [1, float("nan")]),
    ),
    Row(
        "WindowDataset.block_bounds",
        "block_bytes=0",
        ValueError,
        "block_bytes must be >= 1, got 0",
        lambda e: e.ds.block_bounds(0),
    ),
    Row(
        "Mixture.block_bounds",
        "a mixture built without block_bytes",
        ValueError,
        "block_bounds(4096) needs a mixture built with Mixture(..., block_bytes=4096)",
        lambda e: Mixture([e.ds], [1.0]).block_bounds(4096),
    ),
    Row(
        "Mixture",
        "block_bytes with a source without block_bounds",
        TypeError,
        "Mixture(block_bytes=4096) needs sources with block_bounds(); source 0 (list) has none",
        lambda e: Mixture([[{"x": np.zeros(2)}] * 3], [1.0], block_bytes=4096),
    ),
    Row(
        "Mixture",
        "all weights zero",
        ValueError,
        "weights must not all be zero",
        lambda e: Mixture([e.ds, e.ds], [0, 0]),
    ),
    Row(
        "Mixture",
        "weights/sources length mismatch",
        ValueError,
        "weights has 1 entries but there are 2 sources",
        lambda e: Mixture([e.ds, e.ds], [1]),
    ),
    Row(
        "Mixture",
        "num_samples=-1",
        ValueError,
        "num_samples must be in [0, 2**62], got num_samples=-1",
        lambda e: Mixture([e.ds], [1], num_samples=-1),
    ),
    Row(
        "Mixture[i]",
        "i float",
        TypeError,
        "sample index must be an integer, got float 0.5",
        lambda e: Mixture([e.ds], [1])[0.5],
    ),
    Row(
        "Mixture[i]",
        "i = torch.tensor(True)",
        TypeError,
        "sample index must be an integer, got bool tensor(True)",
        lambda e: Mixture([e.ds], [1])[torch.tensor(True)],
    ),
    Row(
        "Mixture.__getitems__",
        "[0, True]",
        TypeError,
        "sample indices must be integers, got bool True in [0, True]",
        lambda e: Mixture([e.ds], [1]).__getitems__([0, True]),
    ),
    Row(
        "Mixture.counts",
        "n=2.7",
        TypeError,
        "n must be an integer, got float 2.7",
        lambda e: Mixture([e.ds], [1]).counts(2.7),
    ),
    Row(
        "WindowDataset.__getitems__",
        "[0, True]",
        TypeError,
        "got bool True in [0, True]",
        lambda e: e.ds.__getitems__([0, True]),
    ),
    Row(
        "PackedDataset[i]",
        "i = torch.tensor(True)",
        TypeError,
        "got bool tensor(True)",
        lambda e: PackedDataset(e.store, 4)[torch.tensor(True)],
    ),
    # ------------------------------------------------------------------ StreamingPacker
    Row(
        "StreamingPacker",
        "source=None",
        TypeError,
        "source must be iterable, got NoneType",
        lambda e: _stream(None),
    ),
    Row(
        "StreamingPacker",
        "batch_size=0",
        ValueError,
        "batch_size must be >= 1, got 0",
        lambda e: _stream([[1]], batch_size=0),
    ),
    Row(
        "StreamingPacker",
        "seqlen=0",
        ValueError,
        "seqlen must be in [1, 2147483647), got 0",
        lambda e: _stream([[1]], seqlen=0),
    ),
    Row(
        "StreamingPacker",
        "rank=2, world_size=2",
        ValueError,
        "rank must satisfy 0 <= rank < world_size, got rank=2, world_size=2",
        lambda e: _stream([[1]], rank=2, world_size=2),
    ),
    Row(
        "StreamingPacker",
        "eot=-1",
        ValueError,
        "eot must be a token id >= 0",
        lambda e: _stream([[1]], eot=-1),
    ),
    Row(
        "StreamingPacker",
        "buffer_size=-1",
        ValueError,
        "buffer_size must be >= 1, got -1",
        lambda e: _stream([[1]], buffer_size=-1),
    ),
    Row(
        "StreamingPacker",
        "a text document",
        TypeError,
        "the source yielded text (str)",
        lambda e: list(_stream(["abc"])),
    ),
    Row(
        "StreamingPacker",
        "a bool array document",
        ValueError,
        "document 1 holds bool values",
        lambda e: list(_stream([[1], np.array([True, False])])),
    ),
    Row(
        "StreamingPacker",
        "a bool token in a list",
        ValueError,
        "document 0 has a non-integer token True (bool)",
        lambda e: list(_stream([[1, True]])),
    ),
    Row(
        "StreamingPacker",
        "a fractional float token",
        ValueError,
        "document 0 has a non-integer token 1.5",
        lambda e: list(_stream([[1.5, 2.0]])),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "next_index=-40",
        FormatError,
        "next_index=-40 is out of range",
        lambda e: _packer_state(next_index=-40),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "next_index=2.5",
        FormatError,
        "next_index must be an int, got float 2.5",
        lambda e: _packer_state(next_index=2.5),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "next_index=10**9",
        FormatError,
        "next_index=1000000000 is out of range",
        lambda e: _packer_state(next_index=10**9),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "exhausted=True mid-source",
        FormatError,
        "says the source is exhausted at sequence",
        lambda e: _packer_state(exhausted=True),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "epoch=-1 inside an epoch",
        FormatError,
        "the state is inside epoch -1",
        lambda e: _packer_state(epoch=-1),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "config=None",
        FormatError,
        "config must be a dict, got NoneType",
        lambda e: _packer_state(config=None),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "a state of another shard",
        StateMismatchError,
        "the state was saved by shard 0 of 1; this packer is shard 1 of 2",
        lambda e: _packer_state(_into={"rank": 1, "world_size": 2}),
    ),
    Row(
        "StreamingPacker.load_state_dict",
        "pending_len as a list",
        FormatError,
        "pending_len must be a 1-D integer numpy array",
        lambda e: _packer_state(pending_len=[1]),
    ),
    Row(
        "StreamingPacker",
        "a uint64 token 2**63",
        ValueError,
        "must hold token ids < 2**63 (they are returned as int64), got 9223372036854775808",
        lambda e: list(_stream([np.array([1, 2**63], dtype=np.uint64)])),
    ),
    Row(
        "StreamingPacker",
        "documents with and without a loss mask",
        ValueError,
        "document 1 has no loss_mask but the documents before it have one",
        lambda e: list(_stream([{"input_ids": [1], "loss_mask": [1]}, {"input_ids": [2]}])),
    ),
    Row(
        "StreamingPacker",
        "a loss mask of another length than its tokens",
        ValueError,
        "document 0: loss_mask has 1 values but input_ids has 2 tokens",
        lambda e: list(_stream([{"input_ids": [1, 2], "loss_mask": [1]}])),
    ),
    Row(
        "StreamingPacker",
        "seqlen=2**70",
        ValueError,
        "seqlen must be in [1, 2147483647), got 1180591620717411303424",
        lambda e: _stream([[1]], seqlen=2**70),
    ),
    # ------------------------------------------------------------------ fields and subsets
    Row(
        "mmpack.build",
        "a field with fewer values than documents",
        ValueError,
        "field 'source' has 1 values but the store has 2 documents",
        lambda e: e.build([[1], [2]], fields={"source": [3]}),
    ),
    Row(
        "mmpack.build",
        "a field value that is None",
        TypeError,
        "field 'source': value 1 is None",
        lambda e: e.build([[1], [2]], fields={"source": [3, None]}),
    ),
    Row(
        "mmpack.build",
        "a field mixing strings and numbers",
        TypeError,
        "field 'lang': value 1 is 3",
        lambda e: e.build([[1], [2]], fields={"lang": ["en", 3]}),
    ),
    Row(
        "mmpack.build",
        "a field name with a slash",
        ValueError,
        "field name 'a/b' is not allowed",
        lambda e: e.build([[1]], fields={"a/b": [1]}),
    ),
    Row(
        "mmpack.build",
        "fields is a list",
        TypeError,
        "fields must be a dict",
        lambda e: e.build([[1]], fields=[1]),
    ),
    Row(
        "ingest(fields=)",
        "a Parquet file without a column fields= names",
        ValueError,
        "in.parquet has no column 'lang' (named by fields=); its columns: text, source",
        lambda e: _fields_build(e, [{"text": "a", "source": 1}], "parquet"),
    ),
    Row(
        "ingest(fields=)",
        "a saved dataset without a column fields= names",
        ValueError,
        "saved has no column 'lang' (named by fields=); its columns: text, source",
        lambda e: _fields_build(e, [{"text": "a", "source": 1}], "dataset"),
    ),
    Row(
        "ingest(fields=)",
        "a null in a Parquet column fields= names",
        IngestError,
        "in.parquet row 1: column 'lang' (named by fields=) is null",
        lambda e: _fields_build(e, [_FIELD_ROWS[0], {**_FIELD_ROWS[1], "lang": None}], "parquet"),
    ),
    Row(
        "ingest(fields=)",
        "a null in a saved dataset's column fields= names",
        IngestError,
        "saved[1]: column 'lang' (named by fields=) is null",
        lambda e: _fields_build(e, [_FIELD_ROWS[0], {**_FIELD_ROWS[1], "lang": None}], "dataset"),
    ),
    Row(
        "ingest(fields=)",
        "a nested (list) Parquet column fields= names",
        TypeError,
        "column 'lang' (named by fields=) has type list<element: string>; a field holds numbers",
        lambda e: _fields_build(e, [{**r, "lang": [r["lang"]]} for r in _FIELD_ROWS], "parquet"),
    ),
    Row(
        "ingest(fields=)",
        "a nested (struct) column of a saved dataset fields= names",
        TypeError,
        "column 'lang' (named by fields=) has type struct<",
        lambda e: _fields_build(
            e, [{**r, "lang": {"v": r["lang"]}} for r in _FIELD_ROWS], "dataset"
        ),
    ),
    Row(
        "ingest(fields=)",
        "a nested value under a key of JSON lines fields= names",
        IngestError,
        "in.jsonl:2: field 'lang' (named by fields=) holds a list, not a number or a string",
        lambda e: _fields_build(e, [_FIELD_ROWS[0], {**_FIELD_ROWS[1], "lang": ["fr"]}], "jsonl"),
    ),
    Row(
        "ingest(fields=)",
        "a text file with fields=",
        ValueError,
        "is read as text, which holds no fields; fields= reads the keys of JSON records",
        lambda e: _elsewhere(
            lambda tmp: (
                (tmp / "a.txt").write_text("hello"),
                ingest(tmp / "a.txt", e.tmp / "new", fields=["source"]),
            )
        ),
    ),
    Row(
        "ingest(loss_on=, fields=)",
        "a chat record lacking a key fields= names",
        IngestError,
        "list_iterator[1]: field 'lang' (named by fields=) is missing",
        lambda e: _chat_build(
            e,
            [{"messages": _HI, "lang": "en"}, {"messages": _HI}],
            loss_on="all",
            fields=["lang"],
        ),
    ),
    Row(
        "ingest(loss_on=, fields=)",
        "fields= naming a key of the chat records",
        ValueError,
        "names a key twice, or a key of the chat records",
        lambda e: _chat_build(e, [{"messages": _HI}], loss_on="all", fields=["messages"]),
    ),
    Row(
        "TokenStore.select",
        "an id out of range",
        IndexError,
        "document id 7 is out of range for a store of 3 documents",
        lambda e: e.store.select([0, 7]),
    ),
    Row(
        "TokenStore.select",
        "a repeated id",
        ValueError,
        "id 1 at position 2 is repeated",
        lambda e: e.store.select([0, 1, 1]),
    ),
    Row(
        "TokenStore.select",
        "unsorted ids",
        ValueError,
        "id 0 at position 1 is out of order",
        lambda e: e.store.select([2, 0]),
    ),
    Row(
        "TokenStore.select",
        "float ids",
        TypeError,
        "integer document ids, got dtype float64",
        lambda e: e.store.select([0.0, 1.0]),
    ),
    Row(
        "TokenStore.where",
        "an unknown field",
        ValueError,
        "the store has no field 'source'",
        lambda e: e.store.where(source=3),
    ),
    Row(
        "TokenStore.where",
        "a mask of another length",
        ValueError,
        "a boolean mask of shape (3,)",
        lambda e: e.store.where(np.ones(2, dtype=bool)),
    ),
    Row(
        "TokenStore.split",
        "fractions summing to 1.1",
        ValueError,
        "sum to 1.1, not 1",
        lambda e: e.store.split({"train": 0.5, "validation": 0.6}),
    ),
    Row(
        "TokenStore.split",
        "a negative fraction",
        ValueError,
        "fraction of 'validation' is -0.1",
        lambda e: e.store.split({"train": 1.0, "validation": -0.1}),
    ),
    Row(
        "TokenStore.split",
        "a list of fractions",
        TypeError,
        "takes a dict of part names to fractions",
        lambda e: e.store.split([0.5, 0.5]),
    ),
    # ------------------------------------------------------------------ huge integers anywhere
    Row(
        "WindowDataset",
        "stride=2**70",
        ValueError,
        "stride must be <= 2**62, got 1180591620717411303424",
        lambda e: WindowDataset(e.store, 2, 2**70),
    ),
    Row(
        "PackedDataset",
        "lookahead=2**70",
        ValueError,
        "lookahead must be <= 2**62",
        lambda e: PackedDataset(e.store, 4, algorithm="online", lookahead=2**70),
    ),
    Row(
        "ResumableSampler",
        "world_size=2**64",
        ValueError,
        "world_size must be <= 2**62, got 18446744073709551616",
        lambda e: ResumableSampler(10, world_size=2**64),
    ),
]


def _ids(rows):
    return [f"{r.entry}: {r.input}" for r in rows]


@pytest.mark.parametrize("row", TABLE, ids=_ids(TABLE))
def test_bad_input(row, tmp_path):
    env = Env(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(row.exc) as info:
        row.call(env)
    assert row.message in str(info.value), f"message {str(info.value)!r} lacks {row.message!r}"
    # nothing left behind: no store, no temporary folder, and the existing store is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert mmpack.open(tmp_path / "store").fingerprint == env.store.fingerprint


# Defects found by this suite and since fixed.
def test_streaming_refuses_negative_tokens():
    with pytest.raises(ValueError, match="-5"):
        list(_stream([[1, -5]]))


def test_mixture_names_a_bad_source():
    with pytest.raises(TypeError, match="source 0"):
        Mixture([5], [1])


# ============================================================================ the docs table
def render_table() -> str:
    lines = ["| Entry point | Input | Exception | Message contains |", "|---|---|---|---|"]
    for r in TABLE:
        msg = r.message.replace("|", "\\|")
        lines.append(f"| `{r.entry}` | {r.input} | `{r.exc.__name__}` | `{msg}` |")
    return "\n".join(lines)


_MARKERS = re.compile(r"(<!-- table:begin -->\n)(.*?)(<!-- table:end -->)", re.S)


def test_docs_table_in_sync():
    found = _MARKERS.search(DOC.read_text())
    assert found, f"{DOC} lacks the table markers"
    assert found.group(2) == render_table() + "\n", (
        "docs/reliability.md is stale: run python tests/test_reliability_inputs.py"
    )


def test_documented_types_are_builtin_catchable():
    for r in TABLE:
        assert issubclass(r.exc, (TypeError, ValueError, IndexError, OSError)), r


# ============================================================================ hypothesis junk
junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.complex_numbers(max_magnitude=10),
)
junk_doc = st.one_of(
    junk_scalar,
    st.lists(junk_scalar, max_size=4),
    st.lists(st.integers(-5, 2**64 + 5), max_size=5),
    st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2),
    st.builds(np.array, st.lists(st.integers(0, 2**64 - 1), max_size=4), dtype=st.just(np.uint64)),
    st.builds(np.array, st.lists(st.floats(-3, 3), max_size=4)),
    st.builds(
        lambda xs: torch.tensor(xs, dtype=torch.int64), st.lists(st.integers(-3, 1000), max_size=4)
    ),
)
junk_docs = st.one_of(
    junk_scalar,
    st.lists(junk_doc, max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
junk_arg = st.one_of(
    junk_scalar, st.integers(-3, 12), st.sampled_from([np.int32(3), np.uint8(2), np.float32(2)])
)
BUILD_ERRORS = (TypeError, ValueError)


@settings(max_examples=60)
@given(
    docs=junk_docs,
    dtype=st.sampled_from([None, np.uint8, np.uint16, "uint64", "int8", "junk"]),
    buffer_tokens=st.sampled_from([1, 2, 1 << 20]),
)
def test_build_with_junk(docs, dtype, buffer_tokens):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            store = mmpack.build(
                Path(tmp) / "s", docs, dtype=dtype, buffer_tokens=buffer_tokens, fsync=False
            )
        except BUILD_ERRORS as exc:
            assert str(exc)
            assert os.listdir(tmp) == [], "a refused build left something behind"
            return
        store.verify()
        assert [d.tolist() for d in store] == [[int(v) for v in _values(d)] for d in docs]


def _values(doc: Any) -> list:
    return doc.tolist() if isinstance(doc, (np.ndarray, torch.Tensor)) else list(doc)


@settings(max_examples=80)
@given(
    docs=st.lists(st.lists(st.integers(0, 70000), max_size=6), max_size=5),
    seqlen=junk_arg,
    stride=st.one_of(st.none(), junk_arg),
    eot=st.one_of(st.none(), junk_arg),
    labels=st.booleans(),
    drop_last=st.booleans(),
    indices=st.one_of(
        junk_arg,
        st.lists(junk_arg, max_size=4),
        st.builds(np.zeros, st.sampled_from([(2, 2), (0,), (3,)]), dtype=st.just(np.int64)),
    ),
)
def test_window_dataset_with_junk(docs, seqlen, stride, eot, labels, drop_last, indices):
    with tempfile.TemporaryDirectory() as tmp:
        store = mmpack.build(Path(tmp) / "s", docs, fsync=False)
        try:
            ds = WindowDataset(store, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last)
        except (TypeError, ValueError) as exc:
            assert str(exc)
            return
        n = len(ds)
        try:
            if isinstance(indices, list) or isinstance(indices, np.ndarray):
                out = ds.__getitems__(indices)
                assert len(out) == len(indices)
            else:
                out = ds[indices]
                assert out["input_ids"].shape == (ds.seqlen,)
        except (TypeError, IndexError) as exc:
            assert str(exc)
        for i in range(n):  # every valid window reads
            assert ds[i]["input_ids"].shape == (ds.seqlen,)


# ============================================================================ bounds checking
_BOUNDSCHECK_SCRIPT = textwrap.dedent(
    """
    import itertools, sys, tempfile
    from pathlib import Path
    import numpy as np
    import mmpack
    from mmpack import WindowDataset

    corpora = [[], [[]], [[], []], [[5]], [[1, 2, 3], [], [4]], [[], [7, 8], []],
               [list(range(j)) for j in range(7)]]
    rng = np.random.default_rng(0)
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for c, docs in enumerate(corpora):
            for backend in ("memmap", "zarr"):
                store = mmpack.build(Path(tmp) / f"{c}{backend}", docs, backend=backend, fsync=False)
                for seqlen, stride, eot, labels, drop_last in itertools.product(
                        (1, 2, 5, 30), (None, 1, 3, 40), (None, 9), (False, True), (True, False)):
                    ds = WindowDataset(store, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last)
                    n = len(ds)
                    for i in range(-n, n):
                        ds[i]
                        ds.locate(i)
                    if n:
                        ds.__getitems__(rng.integers(-n, n, 17))
                    ds.__getitems__([])
                    checked += 1
    print("checked", checked)
    """
)


@pytest.mark.slow
def test_no_out_of_bounds_read_under_numba_boundscheck(tmp_path):
    env = {
        **os.environ,
        "NUMBA_BOUNDSCHECK": "1",
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", _BOUNDSCHECK_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"checked (\d+)", out.stdout) and int(out.stdout.split()[-1]) == 7 * 2 * 128


def test_mmpack_errors_are_catchable_as_builtins():
    assert issubclass(FormatError, ValueError) and issubclass(FormatError, MmpackError)
    assert issubclass(StoreNotFoundError, FileNotFoundError)
    assert issubclass(StoreExistsError, FileExistsError)


if __name__ == "__main__":  # regenerate the table of docs/reliability.md
    text = _MARKERS.sub(lambda m: m.group(1) + render_table() + "\n" + m.group(3), DOC.read_text())
    DOC.write_text(text)
    print(f"wrote {len(TABLE)} rows to {DOC}")
