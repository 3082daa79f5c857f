"""Packing plans: the best-fit bins of a store built once, cached, built in parts, and read back;
each packed row's attention cost.

:class:`mmpack.PackedDataset` builds or reuses its plan by itself; these are for building plans
ahead of training (``docs/guide/views.md``, ``docs/distributed.md``).
"""

from __future__ import annotations

from mmpack._src.packing.options import PlanSpec
from mmpack._src.packing.plan import build_plan
from mmpack._src.packing.plan_file import load_plan, plan_cache_key, save_plan
from mmpack._src.packing.plan_regions import build_plan_in_parts, cached_plan
from mmpack._src.views.attention_cost import row_costs

__all__ = [
    "PlanSpec",
    "build_plan",
    "build_plan_in_parts",
    "cached_plan",
    "load_plan",
    "plan_cache_key",
    "row_costs",
    "save_plan",
]
