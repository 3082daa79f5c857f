"""A tiny Lightning recipe for tests/test_lightning.py (module level: the killed run imports it):
a LightningDataModule whose train loader is ``mmpack.torch.loader``, and a one-layer model that
records the samples of every batch it trains on.  Window ``i`` of the store holds the tokens
``4i .. 4i + 3``."""

from __future__ import annotations

import lightning as L
import torch

import mmpack
import mmpack.torch


class Windows(L.LightningDataModule):
    def __init__(self, path: str, num_workers: int) -> None:
        super().__init__()
        self.path, self.num_workers = path, num_workers

    def train_dataloader(self):
        view = mmpack.WindowDataset(mmpack.open(self.path), seqlen=4, stride=4)
        return mmpack.torch.loader(view, 4, seed=3, num_workers=self.num_workers)


class Recorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((batch["input_ids"][:, 0] // 4).tolist())
        return self.linear(batch["input_ids"].float()).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def trainer(root, **options) -> L.Trainer:
    """A CPU trainer that writes nothing but the checkpoints it is told to."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        use_distributed_sampler=False,  # the loader shards by torch.distributed itself
        **options,
    )
