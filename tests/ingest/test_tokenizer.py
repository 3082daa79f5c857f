"""Tokenizers: the byte-level one, Hugging Face ``tokenizers`` files and folders, the lazy
``transformers`` path, and the picklable spec that worker processes rebuild them from.

Run: ``.venv/bin/python -m pytest tests/ingest/test_tokenizer.py -q``.
"""

from __future__ import annotations

import json
import pickle
import sys
import types

import numpy as np
import pytest
from _text_corpora import EOT, stdlib_texts, train_bpe

from mmpack._src.ingest.tokenizer import (
    BYTE_EOT_ID,
    HFTokenizer,
    TokenizerSpec,
    TransformersTokenizer,
)
from mmpack.ingest import ByteTokenizer, load_tokenizer

TEXTS = ["", "hello", "héllo wörld ✓ — 日本語 🙂", "tabs\tand\nnewlines\r\n", " lead space"]


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


# ----------------------------------------------------------------------------- byte level
def test_byte_tokenizer_ids_are_utf8_bytes():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eot_id, tok.token_dtype) == (257, 256, np.dtype(np.uint8))
    arrays = tok.encode_batch(TEXTS)
    for text, ids in zip(TEXTS, arrays):
        assert ids.dtype == np.uint8
        assert ids.tobytes() == text.encode("utf-8")
        assert tok.decode(ids) == text
    assert tok.encode("é").tolist() == [0xC3, 0xA9]


def test_byte_decode_shows_eot_and_replaces_cut_characters():
    tok = ByteTokenizer()
    assert tok.decode([104, 105, BYTE_EOT_ID, 111]) == "hi<|endoftext|>o"
    assert tok.decode([0xC3]) == "\ufffd"  # a window edge cut the two-byte é
    assert tok.decode(np.array([], dtype=np.int64)) == ""
    with pytest.raises(ValueError, match="257"):
        tok.decode([1, 257])
    with pytest.raises(ValueError, match="-1"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="1-D"):
        tok.decode([[1, 2]])


def test_byte_encode_refuses_lone_surrogates():
    with pytest.raises(UnicodeEncodeError):
        ByteTokenizer().encode_batch(["ok", "\ud800"])


def test_byte_tokenizer_pickles_by_spec():
    tok = ByteTokenizer()
    assert tok.spec == TokenizerSpec("byte")
    again = pickle.loads(pickle.dumps(tok))
    assert isinstance(again, ByteTokenizer)
    assert load_tokenizer(pickle.loads(pickle.dumps(tok.spec))).encode("ab").tolist() == [97, 98]


@pytest.mark.parametrize("spec", [None, "byte", "bytes", TokenizerSpec("byte")])
def test_load_byte_tokenizer(spec):
    assert isinstance(load_tokenizer(spec), ByteTokenizer)


# ----------------------------------------------------------------------------- tokenizers
def test_hf_tokenizer_round_trips_real_text(bpe_file):
    tok = load_tokenizer(bpe_file)
    assert isinstance(tok, HFTokenizer)
    assert tok.vocab_size == 2000
    assert tok.token_dtype == np.dtype(np.uint16)
    assert tok.eot_id == tok._tok.token_to_id(EOT)
    texts = stdlib_texts(60_000, skip=40) + TEXTS
    arrays = tok.encode_batch(texts)
    assert len(arrays) == len(texts)
    for text, ids in zip(texts, arrays):
        assert ids.dtype == np.uint16 and ids.ndim == 1
        assert tok.decode(ids) == text
    # Real compression: BPE ids are far fewer than bytes.
    assert sum(a.size for a in arrays) < 0.6 * sum(len(t.encode()) for t in texts)


def test_hf_tokenizer_adds_no_special_tokens(bpe_file):
    tok = load_tokenizer(bpe_file)
    assert tok.encode("").size == 0
    assert tok.eot_id not in tok.encode("def f(x):\n    return x\n").tolist()
    assert tok.decode([tok.eot_id]) == EOT


def test_hf_tokenizer_spec_rebuilds_the_same_tokenizer(bpe_file):
    tok = load_tokenizer(bpe_file)
    assert tok.spec.kind == "tokenizers"
    again = load_tokenizer(pickle.loads(pickle.dumps(tok.spec)))
    clone = pickle.loads(pickle.dumps(tok))
    text = stdlib_texts(1, skip=3)[0]
    for other in (again, clone):
        np.testing.assert_array_equal(other.encode(text), tok.encode(text))
        assert other.eot_id == tok.eot_id


def test_hf_decode_refuses_out_of_vocabulary_ids(bpe_file):
    with pytest.raises(ValueError, match=r"\[0, 1999\]"):
        load_tokenizer(bpe_file).decode([5, 2000])


def test_tokenizer_folder_with_config_names_the_eos(tmp_path, bpe_file):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(bpe_file.read_bytes())
    tok = load_tokenizer(folder)
    assert isinstance(tok, HFTokenizer) and tok.eot_id == tok._tok.token_to_id(EOT)
    # A config that names another (existing) token as eos wins over the built-in guesses.
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "def"}}))
    tok = load_tokenizer(folder)
    assert tok.eot_id == tok._tok.token_to_id("def")


def test_tokenizer_without_special_tokens_has_no_eot(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.save(str(tmp_path / "wl.json"))
    tok = load_tokenizer(tmp_path / "wl.json")
    assert tok.eot_id is None and tok.vocab_size == 3 and tok.token_dtype == np.uint8
    assert tok.encode("a b c").tolist() == [0, 1, 2]


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="cannot load the tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        load_tokenizer(TokenizerSpec("sentencepiece", "x"))
    with pytest.raises(TypeError, match="tokenizer must be"):
        load_tokenizer(42)


# ----------------------------------------------------------------------------- transformers
def test_transformers_folder_needs_transformers(tmp_path, monkeypatch):
    folder = tmp_path / "sp"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match="transformers"):
        load_tokenizer(folder)


def test_transformers_folder_is_loaded_offline(tmp_path, monkeypatch, bpe_file):
    """A duck-typed ``transformers`` stands in for the real package (not installed here)."""
    hf = load_tokenizer(bpe_file)
    calls = []

    class FakeAutoTokenizer:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls.append((path, kwargs))
            return FakeTok()

    class FakeTok:
        eos_token_id = hf.eot_id

        def __len__(self):
            return hf.vocab_size

        def __call__(self, texts, add_special_tokens=True):
            assert add_special_tokens is False
            return {"input_ids": [a.tolist() for a in hf.encode_batch(texts)]}

        def decode(self, ids, skip_special_tokens=True):
            return hf.decode(ids)

    monkeypatch.setitem(
        sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=FakeAutoTokenizer)
    )
    folder = tmp_path / "sp"
    folder.mkdir()
    tok = load_tokenizer(folder)
    assert isinstance(tok, TransformersTokenizer)
    assert calls == [(str(folder), {"local_files_only": True})]
    assert (tok.vocab_size, tok.eot_id, tok.token_dtype) == (2000, hf.eot_id, np.uint16)
    assert tok.spec == TokenizerSpec("transformers", str(folder.resolve()))
    ids = tok.encode_batch(TEXTS)
    assert [tok.decode(a) for a in ids] == TEXTS


# ----------------------------------------------------------------------------- sparse ids
def _sparse_word_level(path):
    """A word-level tokenizer whose ids are not contiguous: 4 tokens, the largest id 70000."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 70000, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens([EOT])
    raw.save(str(path))
    return path


def test_dtype_follows_the_largest_id_not_the_vocabulary_size(tmp_path):
    """Issue 13 item 15: the dtype came from vocab_size (4 -> uint8), so id 70000 overflowed and
    every document holding it was skipped as 'cannot tokenize'."""
    tok = load_tokenizer(_sparse_word_level(tmp_path / "sparse.json"))
    assert tok.vocab_size == 4 and tok.max_id == 70000
    assert tok.token_dtype == np.uint32
    ids = tok.encode_batch(["a b", f"b {EOT} a"])
    assert [a.tolist() for a in ids] == [[0, 70000], [70000, tok.eot_id, 0]]
    assert ids[0].dtype == np.uint32
    assert tok.decode([70000, 0]) == "b a"
    with pytest.raises(ValueError, match=r"\[0, 70000\]"):
        tok.decode([70001])


def test_ingest_stores_ids_beyond_the_vocabulary_size(tmp_path):
    from mmpack.ingest import ingest

    tok_path = _sparse_word_level(tmp_path / "sparse.json")
    (tmp_path / "d.txt").write_text("a b\nb b a\n")
    report = ingest(
        tmp_path / "d.txt",
        tmp_path / "s",
        tokenizer=tok_path,
        lines=True,
        progress=False,
        on_issue=lambda i: pytest.fail(str(i)),
    )
    assert report.docs_skipped == 0 and report.store.dtype == np.uint32
    assert [report.store[j].tolist() for j in range(2)] == [[0, 70000], [70000, 70000, 0]]


def test_an_id_outside_the_dtype_is_a_clear_error():
    from mmpack._src.ingest.tokenizer import _id_array

    class Tok:
        max_id = 255

    with pytest.raises(ValueError, match="produced id 256, outside 0..255"):
        _id_array([1, 256], np.dtype(np.uint8), Tok())


def test_real_transformers_tokenizer_counts_added_tokens(tmp_path, monkeypatch, bpe_file):
    """A real ``transformers`` tokenizer object (built from a local file, nothing downloaded) with
    an added token: ``max_id`` comes from its vocabulary and added tokens."""
    import transformers

    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(bpe_file), eos_token=EOT)
    fast.add_tokens(["<extra>"])
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda path, **kw: fast)
    )
    (tmp_path / "tf").mkdir()  # no tokenizer.json: the transformers path
    tok = load_tokenizer(tmp_path / "tf")
    assert isinstance(tok, TransformersTokenizer)
    assert (tok.vocab_size, tok.max_id, tok.token_dtype) == (2001, 2000, np.uint16)
    assert tok.encode("x <extra>").tolist()[-1] == 2000
