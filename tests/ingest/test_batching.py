"""Ingest's batches (mmpack._src.ingest.batching): the input is read lazily, at most
2 * workers + 1 batches ahead of the writer."""

from __future__ import annotations

from _ingest import quiet_ingest

from mmpack.store import StoreWriter


def test_reading_is_bounded_by_the_batches_in_flight(tmp_path, monkeypatch):
    """The input is consumed lazily: when the first batch is written, at most
    ``2 * workers + 1`` batches have been read (never the whole corpus)."""
    read = [0]

    def gen():
        for i in range(5000):
            read[0] += 1
            yield f"document {i}"

    seen = []
    original = StoreWriter.add_batch

    def spy(self, tokens, lengths, loss_mask=None):
        seen.append(read[0])
        return original(self, tokens, lengths, loss_mask)

    monkeypatch.setattr(StoreWriter, "add_batch", spy)
    for run, workers in [("a", 1), ("b", 2)]:
        seen.clear()
        report, _ = quiet_ingest(gen(), tmp_path / run, workers=workers, batch_size=100)
        assert report.docs_written == 5000 and len(seen) == 50
        assert seen[0] <= (2 * workers + 1) * 100 + 1
        read[0] = 0
