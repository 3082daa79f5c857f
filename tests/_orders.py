"""The sampler's epoch orders as plain Python lists, for the parametrized sampler suites.

``ORDERS`` names the shuffled orders every sampler test runs with: ``"global"`` (one keyed
permutation of all samples) and ``"blocks"`` (the block-window order).  :func:`naive_block_order`
is the block-window order written the obvious way, over lists: permute the blocks, deal them into
windows of ``W``, list each window's samples block after block, permute that list.
:class:`StreamModel` is a sampler's stream of global positions (``e * n + j``) as lists, with its
skips, replays and elastic resumes; :func:`served_samples` maps global positions to samples.
:func:`make_sampler` is a sampler of either order, ``orders`` parametrizes a test by the orders.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference import naive_deal

from mmpack import Permutation, ResumableSampler

ORDERS = ("global", "blocks")
TEST_WINDOW_BLOCKS = 3

orders = pytest.mark.parametrize("order", ORDERS)


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


def make_sampler(n, order="global", **kw):
    """A :class:`ResumableSampler` of ``n`` samples in ``order`` (its other arguments ``kw``)."""
    return ResumableSampler(n, **kw, **order_kwargs(order, n))


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


def served_samples(n, shuffle, seed, positions, cache={}):  # noqa: B006 - epoch orders, computed once
    """``(sample, epoch)`` at each global position (``p`` is position ``p % n`` of epoch ``p // n``)."""
    out = []
    for p in positions:
        key = (n, shuffle, seed, p // n)
        if key not in cache:
            cache[key] = epoch_order(n, seed=seed, epoch=p // n, shuffle=shuffle)
        out.append((cache[key][p % n], p // n))
    return out


class StreamModel:
    """A sampler's stream as lists: what each rank is dealt (global positions), where skips and
    replays go, and how an elastic resume deals the rest."""

    def __init__(self, n, world_size, drop_last):
        self.n, self.w, self.drop_last = n, world_size, drop_last
        self.skipped: set[int] = set()
        self.pending: dict[int, list[int]] = {}  # replays asked for at the end of an epoch
        self.epoch = -1
        self.next_epoch()

    def next_epoch(self):
        self.epoch += 1
        e, n = self.epoch, self.n
        own = [p for p in range(e * n, (e + 1) * n) if p not in self.skipped]
        ahead = self.pending.pop(e, [])
        self.stream, self.original = ahead + own, [False] * len(ahead) + [True] * len(own)
        self.base, self.drawn = 0, 0

    @property
    def g(self):
        return self.base + self.drawn * self.w

    def shares(self):
        return naive_deal(self.stream, self.base, self.w, self.drop_last)

    def left(self):
        return len(self.shares()[0]) - self.drawn

    def draw(self, k):
        k = min(k, self.left())
        out = [share[self.drawn : self.drawn + k] for share in self.shares()]
        self.drawn += k
        return out

    def frontier(self):
        served = [p for p, o in zip(self.stream[: self.g], self.original, strict=False) if o]
        return max(served) + 1 if served else self.epoch * self.n

    def skip(self, a, b):
        if a < self.frontier():
            raise ValueError
        self.skipped |= set(range(a, b))
        keep = [(p, o) for p, o in zip(self.stream, self.original, strict=True)]
        head, tail = keep[: self.g], [(p, o) for p, o in keep[self.g :] if p not in self.skipped]
        self.stream, self.original = [p for p, _ in head + tail], [o for _, o in head + tail]

    def replay(self, a, b):
        if b > self.frontier():
            raise ValueError
        again = [p for p in range(a, b) if p not in self.skipped]
        if self.left() <= 0:
            self.pending.setdefault(self.epoch + 1, []).extend(again)
            return
        at = self.g  # after every replay still to serve: they queue in the order asked
        while at < len(self.stream) and not self.original[at]:
            at += 1
        self.stream[at:at] = again
        self.original[at:at] = [False] * len(again)

    def resume(self, world_size):
        self.base, self.drawn, self.w = self.g, 0, world_size
