"""The streaming layer: sources that can't be indexed, packed on the fly.

::

    packer.py       StreamingPacker: stream of sequences -> fixed-shape packed batches
    sources.py      source formats and the buffer of held pieces
    schedules.py    batch-size warm-up, masking-ratio cool-down
    prefetch.py     background prefetch iterator
    microbatch.py   micro-batch splitting and token counts
"""

from __future__ import annotations

from mmpack.streaming.packer import StreamingPacker

__all__ = ["StreamingPacker"]
