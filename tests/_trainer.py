"""A tiny model and training arguments for the Hugging Face Trainer tests (nothing downloaded)."""

from __future__ import annotations

import torch
import transformers

VOCAB, SEQLEN, MASK_ID, EOT, B = 97, 32, 96, 95, 3


def _model(causal, attn):
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        attn_implementation=attn,
        initializer_range=0.5,
    )
    if causal:
        config = transformers.LlamaConfig(num_key_value_heads=2, **common)
        return transformers.LlamaForCausalLM(config).double()
    config = transformers.BertConfig(
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common
    )
    return transformers.BertForMaskedLM(config).double()


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=B,
        learning_rate=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        train_sampling_strategy="sequential",
    )
    base.update(kw)
    return transformers.TrainingArguments(**base)
