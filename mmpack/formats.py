"""Other tools' formats: Megatron-LM's sample order over a store, its dataset served in place,
and exports to Megatron and flat EOS-separated files.

Their stores open in place through :func:`mmpack.open` (``format="megatron"`` is detected,
``format="eos-separated", eos=ID`` is named); see ``docs/formats.md``.
"""

from __future__ import annotations

from mmpack._src.formats.eos_separated import eos_offsets
from mmpack._src.formats.export import export_flat, export_megatron
from mmpack._src.formats.megatron_order import build_order
from mmpack._src.views.megatron_gpt import MegatronGPTDataset

__all__ = ["MegatronGPTDataset", "build_order", "eos_offsets", "export_flat", "export_megatron"]
