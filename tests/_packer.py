"""Documents, packer arguments, batch taking and comparing for the streaming packer tests."""

from __future__ import annotations

import numpy as np
from reference import rows_of

from mmpack import StreamingPacker


def make_docs(lengths, base=1):
    return [list(range(base + 1000 * i, base + 1000 * i + n)) for i, n in enumerate(lengths)]


def distinct_docs(n=61, seed=0, seqlen=24):
    """``n`` documents of 1 to ``seqlen - 2`` tokens, every token id distinct (1 up), so a
    packed row's segments name the documents they came from."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, seqlen - 1, size=n)
    starts = 1 + np.concatenate([[0], np.cumsum(lens)[:-1]])
    return [np.arange(s, s + k, dtype=np.int64) for s, k in zip(starts, lens)]


def packed_batch(return_tensors="np", mode="causal", **kw):
    """The one batch (3 rows of 8) of four small documents, as numpy arrays or (``"pt"``) the
    torch tensors of ``as_tensors``; ``kw`` overrides the packer's arguments."""
    docs = [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37], [40]]
    args = dict(
        batch_size=3,
        seqlen=8,
        buffer_size=4,
        mode=mode,
        drop_last=False,
    )
    args.update(kw)
    (batch,) = list(StreamingPacker(docs, **args))
    if return_tensors == "pt":
        from mmpack._src.torch.streaming import as_tensors

        return as_tensors(batch)
    return batch


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


def expected_rows(docs, **kw):
    """The rows of every batch a packer of ``kw`` gives over ``docs``."""
    return [rows_of(b) for b in StreamingPacker(docs, **kw)]


def assert_same_batch(a, b):
    """Two batches hold the same fields with equal values."""
    assert a.keys() == b.keys()
    for k in a:
        if k == "cu_seqlens":
            assert [x.tolist() for x in a[k]] == [x.tolist() for x in b[k]]
        elif a[k] is None or isinstance(a[k], list):
            assert a[k] == b[k]
        else:
            assert np.array_equal(a[k], b[k]), k
