"""A Lightning project written the way a typical user writes one (not robusttrain's datamodules):
its own LightningModule on ``(image, mask)`` tuple batches with float (B,1,H,W) masks and a
``val_loss`` key, its own LightningDataModule with its own ``train_dataloader`` over a
``random_split`` Subset. ``make(namespace)`` builds the classes for ``lightning.pytorch`` or
``pytorch_lightning``. The only robustness line in it: the train loader reads ``mining.wrap(...)``."""

from __future__ import annotations

import importlib

import torch
from torch.utils.data import DataLoader, Dataset, random_split


class Squares(Dataset):
    """Bright squares on a dark background; (image (3,H,W), mask (1,H,W) float) tuples, no case ids."""

    def __init__(self, n=24, size=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = 0.1 + 0.1 * torch.rand(n, 3, size, size, generator=g)
        self.m = torch.zeros(n, 1, size, size)
        for i in range(n):
            r, c = 2 + (i * 5) % 14, 2 + (i * 3) % 14
            self.x[i, :, r : r + 12, c : c + 12] = 0.85
            self.m[i, 0, r : r + 12, c : c + 12] = 1.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.m[i]


def make(namespace: str = "lightning.pytorch"):
    L = importlib.import_module(namespace)

    class BrightNet(L.LightningModule):
        """Foreground where the image is bright: a fixed rule (lr 0) that low contrast breaks."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 1)
            with torch.no_grad():
                self.conv.weight.zero_()
                self.conv.weight[1] = 20.0
                self.conv.bias.copy_(torch.tensor([0.0, -25.0]))
            self.seen: dict[int, list[torch.Tensor]] = {}

        def forward(self, x):
            return self.conv(x)

        def training_step(self, batch, _):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).extend(x)
            return torch.nn.functional.cross_entropy(self(x), y[:, 0].round().long())

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y[:, 0].round().long()))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class UserData(L.LightningDataModule):
        def __init__(self, mining=None, batch_size=4):
            super().__init__()
            self.mining, self.batch_size = mining, batch_size

        def setup(self, stage=None):
            full = Squares()
            self.train_set, self.val_set = random_split(
                full, [16, 8], generator=torch.Generator().manual_seed(0)
            )

        def train_dataloader(self):
            ds = self.mining.wrap(self.train_set) if self.mining is not None else self.train_set
            return DataLoader(ds, batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_set, batch_size=self.batch_size)

    return L, BrightNet, UserData
