"""Chat stores against TRL itself: the labels of every packed row equal those TRL's SFT data
path computes for the same records (``SFTTrainer._prepare_dataset``: ``assistant_only_loss``,
``completion_only_loss``, or neither), built from JSON lines through the Python API and the
CLI, locally and on S3 (SeaweedFS).  TRL's labels are per record; its padding-free collator
sets the label of every packed sequence's first token to -100, which is the rule
``packed_rows_carry`` checks each row against."""

from __future__ import annotations

import uuid

import datasets
import pytest
import transformers
from _chat import PAIRS, RECORDS, make_tokenizer, packed_rows_carry, write_jsonl
from _s3 import BUCKET, use_server_env

import mmpack
from mmpack.ingest.chat import build_chat

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
    from mmpack.cli.commands import main

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
    from mmpack.cli.commands import main

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
