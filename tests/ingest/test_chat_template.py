"""The chat template call (mmpack._src.ingest.chat_template): bad records and templates refused,
each naming the record and the problem; a template needs a {% generation %} tag (looked for as a
tag, as transformers does) for the assistant's loss, in the API and the command."""

from __future__ import annotations

import pytest
import transformers
from _chat import RECORDS, write_jsonl

from mmpack.ingest import chat_documents


def test_bad_records_and_templates_are_refused(tok):
    with pytest.raises(ValueError, match="loss_on must be one of"):
        list(chat_documents([], tok, loss_on="prompt"))
    with pytest.raises(ValueError, match=r"record 1: the record has keys \['text'\]"):
        list(
            chat_documents([{"messages": [{"role": "user", "content": "hi"}]}, {"text": "x"}], tok)
        )
    with pytest.raises(ValueError, match=r"record 0: messages\[0\] must be a dict with 'role'"):
        list(chat_documents([{"messages": [{"content": "hi"}]}], tok))
    with pytest.raises(ValueError, match="record 0: messages must be a non-empty list"):
        list(chat_documents([{"messages": []}], tok))
    with pytest.raises(ValueError, match=r"messages\[0\] has the unknown role 'robot'"):
        list(chat_documents([{"messages": [{"role": "robot", "content": "hi"}]}], tok))
    with pytest.raises(ValueError, match=r"a pair is \{'prompt': ..., 'completion': ...\}"):
        list(chat_documents([{"messages": []}], tok, loss_on="completion"))
    with pytest.raises(ValueError, match="must both be strings or both lists of messages"):
        list(chat_documents([{"prompt": "a", "completion": []}], tok, loss_on="completion"))
    plain = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    with pytest.raises(ValueError, match="has no chat template"):
        list(chat_documents([], plain))
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"needs a chat template with \{% generation %\}"):
        list(chat_documents([], plain))
    assert list(
        chat_documents([{"messages": [{"role": "user", "content": "hi"}]}], plain, loss_on="all")
    )
    with pytest.raises(TypeError, match="must be a transformers tokenizer"):
        list(chat_documents([], object()))


def test_a_template_that_only_names_add_generation_prompt_is_refused(tok, tmp_path, capsys):
    """``{% generation %}`` is looked for as a tag, as transformers does: a template that only
    mentions ``add_generation_prompt`` has no assistant mask (every mask would be 0), so
    ``loss_on="assistant"`` refuses it, in the API and the command; a tag with whitespace
    control is one."""
    from mmpack.cli import main

    plain = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    plain.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match=r"needs a chat template with \{% generation %\}"):
        list(chat_documents([], plain))
    plain.save_pretrained(tmp_path / "plain")
    write_jsonl(tmp_path / "a.jsonl", RECORDS)
    argv = ["build", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "s")]
    assert main([*argv, "--tokenizer", str(tmp_path / "plain"), "--loss-on", "assistant"]) == 1
    err = capsys.readouterr().err
    assert "--loss-on assistant needs a chat template with {% generation %}" in err
    assert "Traceback" not in err and not (tmp_path / "s").exists()
    plain.chat_template = (
        "{% for m in messages %}{%- generation -%}{{ m['content'] }}{%- endgeneration -%}"
        "{% endfor %}"
    )
    (doc,) = chat_documents([RECORDS[3]], plain)
    assert doc["loss_mask"].all()
