"""Chat records to packed rows (``mmpack._src.ingest.chat``): conversations in JSON lines tokenized
with a chat template written here (``{% generation %}`` marks the assistant's tokens) by a
tokenizer trained here (nothing is downloaded), stored with their masks, and packed into rows
whose labels equal a naive reference written from TRL's documented rule (``assistant_only_loss``
/ ``completion_only_loss``: a token takes a loss only where its mask is 1; packed sequences
never predict across their boundaries)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers
from _chat import (
    IGNORE,
    PAIRS,
    RECORDS,
    WORDS,
    packed_rows_carry,
    save_dataset,
    write_jsonl,
    write_parquet,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack.errors import IngestError
from mmpack.ingest import build_chat, chat_documents

sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
conversations = st.lists(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), sentences),
        min_size=1,
        max_size=5,
    ),
    min_size=1,
    max_size=8,
)


def _jsonl(path, convs):
    with open(path, "w") as f:
        for conv in convs:
            f.write(json.dumps({"messages": [{"role": r, "content": c} for r, c in conv]}) + "\n")
    with open(path) as f:
        return [json.loads(line) for line in f]


def trl_rule_labels(ids, mask, pieces, seqlen):
    """Labels of one packed row by the documented rule, for models that shift inside
    (``label_shift="hf"``): a token's label is itself where its mask is 1, else -100, and the
    first token of every packed sequence is -100 (no prediction across sequences)."""
    out = []
    for p in pieces:
        seg = list(range(p["start"], p["stop"]))
        d = p["doc"]
        out += [IGNORE] + [int(ids[d][t]) if mask[d][t] else IGNORE for t in seg[1:]]
    return out + [IGNORE] * (seqlen - len(out))


@settings(max_examples=15, deadline=None)
@given(convs=conversations, seqlen=st.integers(8, 64))
def test_packed_rows_take_the_loss_on_assistant_tokens_only(tok, tmp_path_factory, convs, seqlen):
    tmp = tmp_path_factory.mktemp("chat")
    records = _jsonl(tmp / "chat.jsonl", convs)
    docs = list(chat_documents(records, tok))
    store = mmpack.build(tmp / "s", iter(docs), fsync=False)
    ids = [d["input_ids"] for d in docs]
    mask = [d["loss_mask"] for d in docs]
    for j, conv in enumerate(convs):  # the targets are the assistant turns, <|im_end|> included
        said = "".join(c + "<|im_end|>" for r, c in conv if r == "assistant")
        assert tok.decode(ids[j][mask[j] == 1]) == said
        np.testing.assert_array_equal(store.loss_mask[j], mask[j])
    packed = mmpack.PackedDataset(store, seqlen, eot=None, label_shift="hf", cache=False)
    for i in range(len(packed)):
        want = trl_rule_labels(ids, mask, packed.locate(i), seqlen)
        np.testing.assert_array_equal(packed[i]["labels"], want)


def test_loss_on_all_and_completion(tok, tmp_path):
    conv = {
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "fine"}]
    }
    (doc,) = chat_documents([conv], tok, loss_on="all")
    assert doc["loss_mask"].tolist() == [1] * len(doc["input_ids"])
    (plain,) = chat_documents(
        [{"prompt": "what is two", "completion": " four"}], tok, loss_on="completion"
    )  # TRL's rule: the eos ends the completion, the prompt is the common prefix
    head = tok("what is two")["input_ids"]
    whole = tok("what is two four<|endoftext|>")["input_ids"]
    assert plain["input_ids"].tolist() == whole and whole[: len(head)] == head
    assert plain["loss_mask"].tolist() == [0] * len(head) + [1] * (len(whole) - len(head))
    pair = {
        "prompt": [{"role": "user", "content": "what is two plus two"}],
        "completion": [{"role": "assistant", "content": "four"}],
    }
    (chat,) = chat_documents([pair], tok, loss_on="completion")
    assert tok.decode(chat["input_ids"][chat["loss_mask"] == 1]) == "four<|im_end|>"
    store = mmpack.build(tmp_path / "s", chat_documents([pair, pair], tok, loss_on="completion"))
    assert store.has_loss_mask and len(store) == 2


def test_the_cli_builds_a_chat_store(tok, tmp_path, capsys):
    from mmpack.cli import main

    folder = tmp_path / "tok"
    tok.save_pretrained(folder)
    convs = [[("user", "what is two plus two"), ("assistant", "four")], [("user", "hello")]]
    records = _jsonl(tmp_path / "chat.jsonl", convs)
    argv = ["build", str(tmp_path / "chat.jsonl"), "-o", str(tmp_path / "s")]
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", "assistant"]) == 0, (
        capsys.readouterr().err
    )
    assert "2 conversations" in capsys.readouterr().out
    store = mmpack.open(tmp_path / "s")
    for j, doc in enumerate(chat_documents(records, folder)):
        np.testing.assert_array_equal(store[j], doc["input_ids"])
        np.testing.assert_array_equal(store.loss_mask[j], doc["loss_mask"])
    (tmp_path / "bad.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}]}\n{oops\n'
    )
    bad = [
        "build",
        str(tmp_path / "bad.jsonl"),
        "-o",
        str(tmp_path / "b"),
        "--tokenizer",
        str(folder),
    ]
    assert main([*bad, "--loss-on", "all", "--on-error", "fail"]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl:2: invalid JSON" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()
    assert main([*bad, "--loss-on", "all"]) == 0  # skip-some: one bad record of two, reported
    out = capsys.readouterr()
    assert "skipped: " in out.err and "bad.jsonl:2: invalid JSON" in out.err
    assert "1 conversations" in out.out and mmpack.open(tmp_path / "b").has_loss_mask
    engine = ["--engine", "serial", "--overwrite"]
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", "all", *engine]) == 0
    assert "(1 part, engine serial)" in capsys.readouterr().out
    rebuilt = mmpack.open(tmp_path / "s")
    assert rebuilt.loss_mask[0].tolist() == [1] * len(rebuilt[0])
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", "all", "--template", "<s> $A"])
    assert "--loss-on reads chat records (messages, or prompt and completion); drop --template" in (
        capsys.readouterr().err
    )
    bad[3] += "2"
    assert main([*bad, "--loss-on", "all", "--lines"]) == 1
    assert "--loss-on reads chat records (messages, or prompt and completion); drop --lines" in (
        capsys.readouterr().err
    )
    assert main(bad[:4] + ["--loss-on", "all"]) == 1
    assert "--loss-on needs --tokenizer" in capsys.readouterr().err
    plain = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    plain.save_pretrained(tmp_path / "plain")
    assert main(bad[:4] + ["--tokenizer", str(tmp_path / "plain"), "--loss-on", "assistant"]) == 1
    assert "--loss-on assistant needs a chat template with {% generation %}" in (
        capsys.readouterr().err
    )


def _same_documents(store, docs) -> None:
    assert len(store) == len(docs) and store.has_loss_mask
    for j, doc in enumerate(docs):
        np.testing.assert_array_equal(store[j], doc["input_ids"])
        np.testing.assert_array_equal(store.loss_mask[j], doc["loss_mask"])


@pytest.fixture(scope="module")
def folder(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tok"
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("loss_on", ["assistant", "completion"])
def test_parquet_saved_datasets_and_workers_build_the_same_store(folder, tmp_path, loss_on):
    """JSON lines, Parquet and a saved Hugging Face dataset of the same records, with one
    worker, two workers and the serial engine (two parts joined): the same documents and masks
    as chat_documents, and the report counts them."""
    records = (RECORDS if loss_on == "assistant" else PAIRS[:2]) * 3
    want = list(chat_documents(records, folder, loss_on=loss_on))
    write_jsonl(tmp_path / "a.jsonl", records)
    write_parquet(tmp_path / "a.parquet", records)
    save_dataset(tmp_path / "saved", records)
    for k, (src, opts) in enumerate(
        [
            ("a.jsonl", {"workers": 2, "batch_size": 2}),
            ("a.parquet", {"workers": 1}),
            ("saved", {"workers": 2, "batch_size": 5}),
        ]
    ):
        report = build_chat(tmp_path / src, tmp_path / f"s{k}", folder, loss_on=loss_on, **opts)
        assert (report.docs_read, report.docs_written, report.docs_skipped) == (
            len(records),
        ) * 2 + (0,)
        _same_documents(report.store, want)
    (tmp_path / "b.jsonl").write_text("".join(open(tmp_path / "a.jsonl").readlines()[:5]))
    (tmp_path / "c.jsonl").write_text("".join(open(tmp_path / "a.jsonl").readlines()[5:]))
    parts = build_chat(
        [tmp_path / "b.jsonl", tmp_path / "c.jsonl"],
        tmp_path / "joined",
        folder,
        loss_on=loss_on,
        engine="serial",
        part_bytes=1,
    )
    assert len(parts.store.parts) == 2 and parts.docs_written == len(records)
    _same_documents(mmpack.open(tmp_path / "joined"), want)


def test_bad_chat_records_are_issues_named_by_file_and_line(folder, tmp_path):
    """In a file, a bad record is an issue naming its line (or Parquet row): skipped and
    reported under skip-some, the build refused with nothing written under fail."""
    bad = [RECORDS[0], {"text": "x"}, {"messages": [{"role": "robot", "content": "hi"}]}]
    write_jsonl(tmp_path / "bad.jsonl", bad + RECORDS * 2)
    issues = []
    report = build_chat(tmp_path / "bad.jsonl", tmp_path / "s", folder, on_issue=issues.append)
    assert report.docs_written == 9 and report.docs_skipped == 2
    assert [str(i) for i in issues] == [
        f"{tmp_path / 'bad.jsonl'}:2: the record has keys ['text']; a conversation is "
        "{'messages': [messages]}",
        f"{tmp_path / 'bad.jsonl'}:3: messages[0] has the unknown role 'robot' (known: system, "
        "developer, user, assistant, tool)",
    ]
    write_parquet(tmp_path / "bad.parquet", [{"messages": m["messages"]} for m in RECORDS] + [
        {"messages": [{"role": "robot", "content": "hi"}]}
    ])  # fmt: skip
    with pytest.raises(IngestError, match=r"bad.parquet row 4: messages\[0\] has the unknown role"):
        build_chat(tmp_path / "bad.parquet", tmp_path / "p", folder, on_error="fail")
    assert not (tmp_path / "p").exists()
    write_parquet(tmp_path / "text.parquet", [{"text": "hello"}] * 3)
    with pytest.raises(IngestError, match="holds no 'messages' column of chat records"):
        build_chat(tmp_path / "text.parquet", tmp_path / "t", folder, on_issue=issues.append)
    (tmp_path / "a.txt").write_text("hello\n")
    with pytest.raises(ValueError, match="is read as text, but loss_on='all' reads chat records"):
        build_chat(tmp_path / "a.txt", tmp_path / "t", folder, loss_on="all")
    assert not (tmp_path / "t").exists()


def test_chat_packed_rows_carry_the_masks_of_every_input(folder, tmp_path):
    """The packed rows of a chat store built from a saved dataset: every row's labels are the
    documents' masked ids (hf shift), whatever the row boundaries."""
    save_dataset(tmp_path / "saved", RECORDS * 4)
    store = build_chat(tmp_path / "saved", tmp_path / "s", folder).store
    docs = list(chat_documents(RECORDS * 4, folder))
    labels = [np.where(d["loss_mask"] == 1, d["input_ids"], IGNORE) for d in docs]
    for seqlen in (16, 64):
        packed = mmpack.PackedDataset(store, seqlen, eot=None, label_shift="hf", cache=False)
        assert packed_rows_carry(packed, labels, seqlen) == len(packed) > 0


def test_a_chat_build_takes_no_special_token_template(folder, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", RECORDS)
    with pytest.raises(ValueError, match="loss_on='all' takes no template="):
        build_chat(
            tmp_path / "a.jsonl", tmp_path / "s", folder, loss_on="all", template="<|im_start|> $A"
        )
    assert not (tmp_path / "s").exists()


def test_a_chat_build_that_stores_nothing_is_an_empty_masked_store(folder, tmp_path, capsys):
    """``--on-error skip`` with every record bad: an empty store that has a (empty) loss mask,
    as every chat store has, and the command's summary (it died on a bare AssertionError); a
    part that stores nothing joins the others."""
    from mmpack.cli import main

    write_jsonl(tmp_path / "bad.jsonl", [{"text": "x"}, {"text": "y"}])
    argv = ["build", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "s")]
    assert (
        main([*argv, "--tokenizer", str(folder), "--loss-on", "assistant", "--on-error", "skip"])
        == 0
    )
    out = capsys.readouterr()
    assert "0 conversations, 0 tokens, 0 of them targets" in out.out and "Traceback" not in out.err
    store = mmpack.open(tmp_path / "s")
    assert len(store) == 0 and store.has_loss_mask and len(store.loss_mask) == 0
    write_jsonl(tmp_path / "good.jsonl", RECORDS)
    report = build_chat(
        [tmp_path / "good.jsonl", tmp_path / "bad.jsonl"],
        tmp_path / "joined",
        folder,
        engine="serial",
        part_bytes=1,
        on_error="skip",
        on_issue=[].append,
    )
    assert len(report.store.parts) == 2 and report.store.has_loss_mask
    _same_documents(report.store, list(chat_documents(RECORDS, folder)))
