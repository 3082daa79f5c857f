"""Documents, packer arguments, batch taking and comparing for the streaming packer tests."""

from __future__ import annotations

import numpy as np
from reference import rows_of

from mmpack import StreamingPacker


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
