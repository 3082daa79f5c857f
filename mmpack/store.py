"""Stores: the streaming writer behind :func:`mmpack.build`, a store's per-document fields, the
batches views return, the epoch-tagged index and the key of a build's document order (``docs/guide/building.md``, ``docs/format.md``).
"""

from __future__ import annotations

from mmpack._src.core.constants import DOC_ORDER_STREAM
from mmpack._src.core.validation import EpochIndex
from mmpack._src.store.fields import Fields
from mmpack._src.store.writer import StoreWriter
from mmpack._src.views.batch import SampleBatch

__all__ = ["DOC_ORDER_STREAM", "EpochIndex", "Fields", "SampleBatch", "StoreWriter"]
