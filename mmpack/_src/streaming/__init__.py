"""The streaming layer: sources that can't be indexed, packed on the fly.

::

    packer.py       StreamingPacker: stream of sequences -> fixed-shape packed batches
    config.py         its parameters, checked once
    admission.py      its reading of the source and the pieces it holds
    placement.py      its best-fit rows and the batch writer (labels.py: the labels)
    checkpoint.py     its state schema
    stats.py          what it counts (StreamingStats)
    shards.py       the share of a source a consumer (rank, DataLoader worker) packs
    sources.py      source formats, sequences to pieces (incoming.py: the token rule, joined)
    pieces.py       the held pieces and the token chunks they point into
    schedules.py    batch-size warm-up, masking-ratio cool-down
    microbatch.py   micro-batch splitting and token counts (numpy)
"""

from __future__ import annotations

__all__: list[str] = []  # StreamingPacker is public at the root
