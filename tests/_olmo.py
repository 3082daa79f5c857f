"""OLMo-core / Dolma token files for the EOS-separated format tests: written the way its source
documents them (a headerless ``np.memmap`` of uint16 or uint32, EOS after each document)."""

from __future__ import annotations

import numpy as np


def write_olmo(path, docs, eos, dtype=np.uint16, tail=()):
    """What OLMo-core/Dolma write: the documents, each followed by eos, as a headerless memmap."""
    flat = np.concatenate([np.append(d, eos) for d in docs] + [np.asarray(tail, dtype=np.int64)])
    mm = np.memmap(path, dtype=dtype, mode="w+", shape=(flat.size,))
    mm[:] = flat
    mm.flush()
    del mm
    return flat.astype(dtype)


def olmo_docs(rng, n, vocab):
    """``n`` documents of 0 to 39 tokens in ``[1, vocab)``: never the EOS 0."""
    return [rng.integers(1, vocab, int(rng.integers(0, 40))) for _ in range(n)]
