"""Chat stores against TRL itself: the labels of every packed row equal those TRL's SFT data
path computes for the same records (``SFTTrainer._prepare_dataset``: ``assistant_only_loss``,
``completion_only_loss``, or neither), built from JSON lines through the Python API and the
CLI, locally and on S3 (SeaweedFS).  TRL's labels are per record; its padding-free collator
sets the label of every packed sequence's first token to -100, which is the rule
``packed_rows_carry`` checks each row against."""

from __future__ import annotations

import json
import uuid

import datasets
import pytest
import transformers
from _chat import PAIRS, RECORDS, make_tokenizer, packed_rows_carry, write_jsonl
from _s3 import BUCKET, use_server_env

import mmpack
from mmpack.ingest import build_chat

CASES = {  # name: (records, loss_on, TRL's options)
    "assistant": (RECORDS, "assistant", {"assistant_only_loss": True}),
    "all": (RECORDS, "all", {}),
    "completion": (PAIRS[:2], "completion", {"completion_only_loss": True}),
    "completion-messages": (PAIRS[2:] * 2, "completion", {"completion_only_loss": True}),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tok"
    make_tokenizer().save_pretrained(path)
    return path


def trl_labels(folder, tmp_path, records, options) -> list[list[int]]:
    """The ``labels`` column TRL's SFT data path makes for ``records`` (no truncation, no
    packing: one list per record), with the tokenizer saved in ``folder``."""
    from trl import SFTConfig, SFTTrainer

    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    args = SFTConfig(
        output_dir=str(tmp_path / "trl"),
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
        **options,
    )
    trainer = SFTTrainer.__new__(SFTTrainer)  # the data path alone: no model, no training
    trainer._tokenizer, trainer.chat_template = tok, None
    trainer.completion_only_loss = bool(args.completion_only_loss)
    data = datasets.Dataset.from_list(records)
    prepared = trainer._prepare_dataset(data, tok, args, False, None, "train")
    return [list(row) for row in prepared["labels"]]


def _check(store, labels) -> None:
    assert len(store) == len(labels)
    for seqlen in (8, 24, 96):
        packed = mmpack.PackedDataset(store, seqlen, eot=None, label_shift="hf", cache=False)
        assert packed_rows_carry(packed, labels, seqlen) == len(packed) > 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_rows_equal_trls_labels_through_the_api_and_the_cli(folder, tmp_path, case):
    from mmpack.cli import main

    records, loss_on, options = CASES[case]
    labels = trl_labels(folder, tmp_path, records, options)
    write_jsonl(tmp_path / "chat.jsonl", records)
    _check(
        build_chat(tmp_path / "chat.jsonl", tmp_path / "api", folder, loss_on=loss_on).store, labels
    )
    argv = ["build", str(tmp_path / "chat.jsonl"), "-o", str(tmp_path / "cli")]
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", loss_on, "--workers", "2"]) == 0
    _check(mmpack.open(tmp_path / "cli"), labels)


def test_packed_rows_equal_trls_labels_on_s3(folder, tmp_path, s3_server, monkeypatch):
    """``mmpack build chat.jsonl -o s3://...`` and ``build_chat`` to a URL: the store opened
    from S3 packs into rows whose labels equal TRL's."""
    from mmpack.cli import main

    use_server_env(monkeypatch, s3_server)
    records, loss_on, options = CASES["assistant"]
    labels = trl_labels(folder, tmp_path, records, options)
    write_jsonl(tmp_path / "chat.jsonl", records)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/chat"
    argv = ["build", str(tmp_path / "chat.jsonl"), "-o", url, "--tokenizer", str(folder)]
    assert main([*argv, "--loss-on", loss_on]) == 0
    _check(mmpack.open(url), labels)
    api = build_chat(tmp_path / "chat.jsonl", url + "-api", folder, loss_on=loss_on).store
    assert api.location == url + "-api" and api.has_loss_mask
    _check(mmpack.open(url + "-api"), labels)


TOOL_TEMPLATE = (  # renders the tools, tool calls, and the template variable ``think``
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t['function']['name'] }}: "
    "{{ t['function']['description'] }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% if think %}<|im_start|>system\nthink<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>{% endgeneration %}\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "two plus two"}},
    {"type": "function", "function": {"name": "hello", "description": "hello there"}},
]
CALL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
TOOL_RECORDS = [
    {
        "messages": [
            {"role": "user", "content": "what is two plus two"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "four"},
            {"role": "assistant", "content": "it is four"},
        ],
        "tools": json.dumps(TOOLS),
        "chat_template_kwargs": {"think": True},
    },
    {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "fine"},
        ],
        "tools": json.dumps(TOOLS[1:]),
        "chat_template_kwargs": {"think": False},
    },
]


@pytest.mark.parametrize("loss_on", ["assistant", "all"])
def test_tools_and_template_variables_reach_the_template_as_in_trl(tmp_path, loss_on):
    """A record's ``tools`` (JSON text, as datasets store them) and ``chat_template_kwargs``
    reach the chat template as TRL passes them: the stores built from JSON lines (API and
    command), Parquet and a saved dataset pack into rows whose labels equal TRL's (they were
    ignored, so tool-calling stores held other ids than TRL's)."""
    from _chat import save_dataset, write_parquet

    from mmpack.cli import main
    from mmpack.ingest import chat_documents

    folder = tmp_path / "tok"
    tok = make_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    tok.save_pretrained(folder)
    options = {"assistant_only_loss": True} if loss_on == "assistant" else {}
    labels = trl_labels(folder, tmp_path, TOOL_RECORDS, options)
    bare = [{"messages": r["messages"]} for r in TOOL_RECORDS]
    plain = [len(d["input_ids"]) for d in chat_documents(bare, tok, loss_on=loss_on)]
    assert plain != [len(row) for row in labels]  # what ignoring tools and variables would give
    write_jsonl(tmp_path / "chat.jsonl", TOOL_RECORDS)
    write_parquet(tmp_path / "chat.parquet", TOOL_RECORDS)
    save_dataset(tmp_path / "saved", TOOL_RECORDS)
    for name in ("chat.jsonl", "chat.parquet", "saved"):
        store = build_chat(tmp_path / name, tmp_path / f"s-{name}", folder, loss_on=loss_on).store
        _check(store, labels)
    argv = ["build", str(tmp_path / "chat.jsonl"), "-o", str(tmp_path / "cli")]
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", loss_on]) == 0
    _check(mmpack.open(tmp_path / "cli"), labels)
    listed = [{**r, "tools": json.loads(r["tools"])} for r in TOOL_RECORDS]  # a list, not text
    for got, want in zip(chat_documents(listed, folder, loss_on=loss_on), labels):
        assert [t if m else -100 for t, m in zip(got["input_ids"], got["loss_mask"])] == want


def test_bad_tools_and_template_variables_are_refused(tmp_path):
    from mmpack.ingest import chat_documents

    tok = make_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    hi = [{"role": "user", "content": "hello"}]
    for bad, match in (
        ({"tools": "{oops"}, "tools is a string but not JSON"),
        ({"tools": {"name": "add"}}, "tools must be a list of tool schemas"),
        ({"chat_template_kwargs": ["think"]}, "chat_template_kwargs must be a dict"),
        (
            {"chat_template_kwargs": {"tokenize": False}},
            "chat_template_kwargs may not set tokenize",
        ),
    ):
        with pytest.raises(ValueError, match=f"record 0: {match}"):
            list(chat_documents([{"messages": hi, **bad}], tok))
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with 'role' and 'content'"):
        list(chat_documents([{"messages": [{"role": "assistant"}]}], tok))


def test_a_chat_stores_default_views_give_trls_labels(folder, tmp_path):
    """The default eot (``"store"``) of a store with a loss mask is none: the template ended
    each conversation with its own end-of-turn, and TRL's labels have no target after it.  A
    store built by the command (which records the tokenizer, eos included) and one built by
    ``mmpack.build(chat_documents(...))`` (which records none) agree, packed and windowed."""
    from mmpack.cli import main
    from mmpack.ingest import chat_documents

    records, loss_on, options = CASES["assistant"]
    labels = trl_labels(folder, tmp_path, records, options)
    write_jsonl(tmp_path / "chat.jsonl", records)
    argv = ["build", str(tmp_path / "chat.jsonl"), "-o", str(tmp_path / "cli")]
    assert main([*argv, "--tokenizer", str(folder), "--loss-on", loss_on]) == 0
    cli = mmpack.open(tmp_path / "cli")
    assert cli.meta["tokenizer"]["special_ids"]["eot"] is not None  # the tokenizer's eos
    api = mmpack.build(tmp_path / "api", chat_documents(records, folder, loss_on=loss_on))
    for store in (cli, api):
        for seqlen in (8, 24, 96):
            packed = mmpack.PackedDataset(store, seqlen, label_shift="hf", cache=False)
            assert packed_rows_carry(packed, labels, seqlen) == len(packed) > 0
            assert packed.eot is None
        assert mmpack.WindowDataset(store, 8).eot is None
