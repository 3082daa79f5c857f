"""The sampler's epoch orders as plain Python lists, for the parametrized sampler suites.

``ORDERS`` names the shuffled orders every sampler test runs with: ``"global"`` (one keyed
permutation of all samples) and ``"blocks"`` (the block-window order).  :func:`naive_block_order`
is the block-window order written the obvious way, over lists: permute the blocks, deal them into
windows of ``W``, list each window's samples block after block, permute that list.
"""

from __future__ import annotations

import numpy as np

from mmpack.sampling.permutation import Permutation

ORDERS = ("global", "blocks")
TEST_WINDOW_BLOCKS = 3


def bounds_of(n):
    """Blocks of uneven sizes (1 to about 2n/1000 samples, at least 1 to 6) covering range(n)."""
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    rng = np.random.default_rng(n)
    top = max(6, 2 * n // 1000)
    sizes = rng.integers(1, top + 1, size=n)
    cuts = np.cumsum(sizes)
    cuts = cuts[cuts < n]
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


def order_kwargs(order, n, window_blocks=TEST_WINDOW_BLOCKS):
    """The ResumableSampler keyword arguments of an order over ``range(n)``."""
    if order == "global":
        return {}
    assert order == "blocks", order
    return {"shuffle": "blocks", "block_bounds": bounds_of(n), "window_blocks": window_blocks}


def naive_block_order(bounds, window_blocks, seed, epoch):
    """The block-window order of one epoch, as a list of sample ids."""
    bounds = [int(b) for b in bounds]
    n_blocks = len(bounds) - 1
    blocks = list(Permutation(n_blocks, seed=(seed, 1), epoch=epoch)) if n_blocks else []
    order = []
    for w, lo in enumerate(range(0, n_blocks, window_blocks)):
        samples = []
        for b in blocks[lo : lo + window_blocks]:
            samples += list(range(bounds[b], bounds[b + 1]))
        inner = list(Permutation(len(samples), seed=(seed, 2, epoch), epoch=w))
        order += [samples[q] for q in inner]
    return order


def epoch_order(n, *, seed, epoch, shuffle=True, order="global"):
    """Epoch ``epoch``'s order of ``range(n)``: the list a sampler deals to its ranks."""
    if shuffle == "blocks":
        order, shuffle = "blocks", True
    if not shuffle:
        return list(range(n))
    if order == "global":
        return list(Permutation(n, seed=seed, epoch=epoch))
    return naive_block_order(bounds_of(n), TEST_WINDOW_BLOCKS, seed, epoch)


def sampler_kwargs(n, shuffle):
    """Keyword arguments for a sampler of ``shuffle`` in ``(False, True, "blocks")``."""
    if shuffle == "blocks":
        return order_kwargs("blocks", n)
    return {"shuffle": shuffle}
