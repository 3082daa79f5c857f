"""The sampling layer: which sample comes next, by arithmetic.

::

    permutation.py   Permutation: keyed O(1)-memory bijection of range(n) (Feistel network)
    mixture.py       Mixture: weighted, deterministic, random-access mixture of sources
"""

__all__: list[str] = []
