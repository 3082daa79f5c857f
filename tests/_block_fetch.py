"""Block-window epochs for the block-fetch and span tests: the stores they read (a remote
memmap store of 4 KiB check pages beside its local twin, the same documents as a remote sharded
Zarr store), two epochs of a loader, and the check that every block of the store was fetched
once within the bound."""

from __future__ import annotations

import pytest
from _remote_stores import _build_with_page, _corpus, _url

import mmpack
from mmpack._src.torch.block_fetch import WindowFetcher

CHECK = 4096  # the store's check pages


def block_stores(s3_server, tmp_path_factory):
    """``(remote, local)``: 3000 documents as a remote memmap store of ``CHECK``-byte check
    pages on ``s3_server`` and as a local store."""
    docs = _corpus(n_docs=3000, seed=3)
    remote = _build_with_page(_url(), docs, s3_server.options, CHECK)
    local = mmpack.build(tmp_path_factory.mktemp("local") / "s", docs)
    return remote, local


def zarr_block_store(s3_server):
    """The stores' documents as a remote sharded Zarr store: one 4 KiB inner chunk per check
    block of the memmap store, 16 chunks per shard."""
    from _zarr_stores import _small

    with pytest.MonkeyPatch.context() as mp:
        _small(mp, inner=CHECK, shard=16 * CHECK)
        docs = _corpus(n_docs=3000, seed=3)
        return mmpack.build(_url(), docs, backend="zarr", storage_options=s3_server.options)


def open_cached(remote, options, cache_dir):
    """``remote`` opened with a node cache of 1 GiB in ``cache_dir``."""
    return mmpack.open(
        remote.location, storage_options=options, cache_dir=cache_dir, cache_limit=1 << 30
    )


def _two_epochs(view, sampler):
    """``(sizer, sizes, bound)``: a fetcher giving the windows' spans of ``sampler``'s order
    (it fetches nothing itself), the bytes of each window of epochs 0, 1 and 2, and the most
    two consecutive windows of the two epochs (and the next one's first) hold."""
    sizer = WindowFetcher(view, sampler)
    sizes = [_window_bytes(sizer, e) for e in range(3)]
    seq = sizes[0] + sizes[1] + sizes[2][:1]
    return sizer, sizes, max(a + b for a, b in zip(seq, seq[1:]))


def assert_each_block_once(store, proxy, before, sizer, sizes, bound, peak, opens=0):
    """Two epochs read in the block order through the fetcher of ``sizer``'s order (and the
    proxy's ``(requests, bytes_down)`` before them): the node cache held two windows at most (``peak``,
    sampled in the loop), each block was fetched once per epoch in whole parts, and readers
    fetched (almost) nothing of their own (``opens``: requests a spawned worker's open of the
    store takes)."""
    spans = store.span_fetcher
    stats = spans.stats
    page = spans.fetcher.page
    assert 0 < peak <= bound + 2 * sizer.order.window_blocks * page  # a boundary page each end
    # each block once per epoch (a block at a span's edge once per window using it), and
    # the next epoch's first window fetched ahead
    assert stats["bytes_fetched"] <= sum(sizes[0]) + sum(sizes[1]) + sizes[2][0]
    parts = sum(
        _parts(sizer, sizer.window_spans(e, w))
        for e in (0, 1)
        for w in range(sizer.order.n_windows)
    )
    assert stats["requests"] <= parts + _parts(sizer, sizer.window_spans(2, 0))
    # readers waited for the parts (a few requests of the readers' own at most)
    assert proxy.requests - before[0] <= stats["requests"] + 4 + opens
    # and their bytes: the parts' (with each response's headers) and a few pages besides
    requests, down = proxy.requests - before[0], proxy.bytes_down - before[1]
    assert down <= stats["bytes_fetched"] + 1024 * requests + (4 + opens) * page
    assert stats["pages_dropped"] > 0


def _parts(fetcher, spans):
    """Range requests the spans of a window take (parts of ``part_pages`` check pages inside
    each span)."""
    n = 0
    for a, b in spans:
        b0, b1 = fetcher.spans.page_range(a, b)
        n += -(-(b1 - b0) // fetcher.spans.part_pages)
    return n


def _window_bytes(fetcher, epoch):
    """Bytes of the check pages each window of ``epoch`` reads."""
    out = []
    for w in range(fetcher.order.n_windows):
        ranges = [fetcher.spans.page_range(a, b) for a, b in fetcher.window_spans(epoch, w)]
        out.append(sum(b1 - b0 for b0, b1 in ranges) * fetcher.spans.fetcher.page)
    return out
