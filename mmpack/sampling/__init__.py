"""The sampling layer: which sample comes next, by arithmetic.

::

    permutation.py   Permutation: keyed O(1)-memory bijection of range(n) (Feistel network)
    mixture.py       Mixture: weighted, deterministic, random-access mixture of sources
    mixture_stats.py MixtureStats: what Mixture.stats() returns
"""

__all__: list[str] = []
