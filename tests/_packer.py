"""Documents, packer arguments and batch taking for the streaming packer tests."""

from __future__ import annotations


def make_docs(lengths, base=1):
    return [list(range(base + 1000 * i, base + 1000 * i + n)) for i, n in enumerate(lengths)]


KW = dict(batch_size=2, seqlen=12, buffer_size=4, drop_last=False)

STATE_KW = {
    "batch_size": 3,
    "seqlen": 40,
    "buffer_size": 6,
    "mode": "mlm",
    "mask_id": 3,
    "vocab_size": 100,
}


def take(it, n):
    """The first ``n`` items of the iterator ``it`` (fewer if it ends)."""
    return [b for _, b in zip(range(n), it)]
