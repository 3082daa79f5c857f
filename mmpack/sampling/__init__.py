"""The sampling layer: which sample comes next, by arithmetic.

::

    permutation.py   Permutation: keyed O(1)-memory bijection of range(n) (Feistel network)
    block_order.py   BlockOrder: blocks permuted, samples permuted inside windows of blocks
    mixture.py       Mixture: weighted, deterministic, random-access mixture of sources
    mixture_blocks.py Mixture(block_bytes=): passes over source blocks, the mixture's blocks
    mixture_stats.py MixtureStats: what Mixture.stats() returns
"""

__all__: list[str] = []
