"""The sampling layer: which sample comes next, by arithmetic.

::

    permutation.py   Permutation: keyed O(1)-memory bijection of range(n) (Feistel network)
    block_order.py   BlockOrder: blocks permuted, samples permuted inside windows of blocks
    dealing.py       Dealing: an epoch's order (and its edits) dealt to ranks, the sampler's arithmetic
    sampler_edits.py skips and replays: the edited stream of global positions an epoch deals
    sampler_state.py the sampler state's schema: fields validated one by one, configurations compared
    mixture.py       Mixture: weighted, deterministic, random-access mixture of sources
    mixture_blocks.py Mixture(block_bytes=): passes over source blocks, the mixture's blocks
    mixture_stats.py MixtureStats: what Mixture.stats() returns
"""

__all__: list[str] = []
