"""Specification of :mod:`mmpack._src.streaming.config`: the packer's parameters are checked
(each bad one a ValueError naming it) and ModernBERT's micro-batch shape is converted to the
packer's, through :class:`mmpack.StreamingPacker`.

Run: ``.venv/bin/python -m pytest tests/streaming/test_config.py -q``.
"""

from __future__ import annotations

import pytest

from mmpack import StreamingPacker


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"buffer_size": 1}, "buffer_size"),
        ({"seqlen": 0}, "seqlen"),
        ({"batch_size": 0}, "batch_size"),
        ({"mode": "bert"}, "mode"),
        ({"mode": "mlm"}, "mask_id and vocab_size"),
        ({"mode": "mlm", "mask_id": 3, "vocab_size": 3}, "mask_id"),
        ({"mask_prob": 1.5}, "mask_prob"),
        ({"mask_prob": -0.1}, "mask_prob"),
        ({"long_docs": "wrap"}, "long_docs"),
        ({"source_format": "rows"}, "source_format"),
        ({"batch_size_warmup_min_size": 1}, "batch_size_warmup"),
        ({"masking_ratio_cooldown_tokens": 10, "final_masking_ratio": 0.1}, "mode='mlm'"),
        ({"seed": -1}, "seed"),
    ],
)
def test_validation(kw, match):
    args = dict(batch_size=2, seqlen=8, buffer_size=4)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        StreamingPacker([[1]], **args)


def test_from_micro_batches():
    p = StreamingPacker.from_micro_batches(
        [[1]],
        global_batch_size=512,
        micro_batch_size=32,
        max_seq_len=1024,
        batch_size_warmup_min_size=64,
        batch_size_warmup_tokens="1e6tok",
    )
    assert (p.batch_size, p.seqlen, p.buffer_size) == (16, 32768, 5120)
    assert p.batch_size_schedule.min_batch_size == 2
    with pytest.raises(ValueError, match="multiple"):
        StreamingPacker.from_micro_batches(
            [[1]],
            global_batch_size=512,
            micro_batch_size=32,
            max_seq_len=8,
            batch_size_warmup_min_size=48,
            batch_size_warmup_tokens=10,
        )
