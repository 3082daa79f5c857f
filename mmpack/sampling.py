"""Sample orders beyond the root's :class:`mmpack.Permutation`, :class:`mmpack.Mixture` and
:class:`mmpack.Schedule`: the block-window order and a mixture's statistics
(``docs/guide/sampler.md``, ``docs/guide/mixtures.md``).
"""

from __future__ import annotations

from mmpack._src.sampling.block_order import BlockOrder, uniform_bounds
from mmpack._src.sampling.mixture_stats import MixtureStats

__all__ = ["BlockOrder", "MixtureStats", "uniform_bounds"]
