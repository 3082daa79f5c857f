"""Chat fixtures shared by the chat tests: a byte-level BPE tokenizer trained here on a few
words (nothing is downloaded), a ChatML-like chat template written here whose
``{% generation %}`` blocks mark the assistant's tokens, record writers (JSON lines, Parquet, a
saved Hugging Face dataset) and the check that packed rows carry given per-document labels."""

from __future__ import annotations

import json

import numpy as np

IGNORE = -100
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ["hello", "there", "how", "are", "you", "fine", "two", "plus", "four", "is", "what"]


def make_tokenizer():
    """A ``transformers`` fast tokenizer with :data:`TEMPLATE` (eos ``<|endoftext|>``)."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = tokenizers.Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    raw.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    return fast


def conversation(*turns):
    """``{"messages": [...]}`` of ``(role, content)`` turns."""
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


RECORDS = [
    conversation(("system", "you are fine"), ("user", "what is two plus two"), ("assistant", "four")),
    conversation(("user", "hello"), ("assistant", "hello there"), ("user", "how are you"),
                 ("assistant", "fine")),
    conversation(("user", "what is four"), ("assistant", "two plus two is four")),
    conversation(("user", "how are you there"), ("assistant", "fine fine")),
]  # fmt: skip
PAIRS = [
    {"prompt": "what is two plus two", "completion": " four"},
    {"prompt": "hello", "completion": " there how are you"},
    {"prompt": [{"role": "user", "content": "what is four"}],
     "completion": [{"role": "assistant", "content": "two plus two"}]},
]  # fmt: skip


def write_jsonl(path, records) -> None:
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def write_parquet(path, records) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)


def save_dataset(path, records) -> None:
    import datasets

    datasets.Dataset.from_list(records).save_to_disk(str(path))


def packed_rows_carry(packed, labels_of_doc, seqlen) -> int:
    """Check that every row of ``packed`` (a ``PackedDataset`` with ``label_shift="hf"``) holds,
    for each of its pieces, the piece's slice of its document's labels with the piece's first
    label -100 (no prediction across packed sequences: TRL's padding-free collator sets the
    label of every position 0 to -100), and -100 on the padding.  Returns the rows checked."""
    for i in range(len(packed)):
        want: list[int] = []
        for p in packed.locate(i):
            seg = list(labels_of_doc[p["doc"]][p["start"] : p["stop"]])
            want += [IGNORE] + [int(x) for x in seg[1:]]
        want += [IGNORE] * (seqlen - len(want))
        np.testing.assert_array_equal(packed[i]["labels"], want, err_msg=f"row {i}")
    return len(packed)
