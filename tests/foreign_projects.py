"""Three Lightning segmentation projects written the way other people write them (issue 23), each
with the four robustness callbacks exactly as the README shows them and its glue marked ``# glue``:

* :func:`make_polyp` -- ``pytorch_lightning`` + MONAI dict samples (``MetaTensor`` s, a random flip),
  run under Hydra's logging by ``foreign_polyp_hydra.py``;
* :func:`make_lung` -- ``lightning`` + ``(image, mask)`` tuples from ``random_split``, one-channel
  BCE logits that lie in [0, 1] in the first epoch (a model "early in training");
* :func:`make_spleen` -- a 3-D MONAI project: ``RandCropByPosNegLabeld(num_samples=2)`` crop lists,
  ``monai.data.DataLoader`` and ``list_data_collate``.

Every model is a fixed "bright voxel" rule (lr 0) that low contrast breaks, so the training probe
fails in epoch 0 (1 for lung) and replay runs in the next epoch; ``seen[epoch]`` holds the training
images it got. Clean images hold only values in [0.1, 0.2] and 0.85 (:func:`n_perturbed` counts the others).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, random_split

FG = 0.85


def n_perturbed(images) -> int:
    """Training images holding values a clean image cannot hold (a replayed, perturbed failure)."""
    out = 0
    for x in images:
        x = torch.as_tensor(x).float()
        clean = ((x >= 0.1 - 0.01) & (x <= 0.2 + 0.01)) | ((x - FG).abs() <= 0.01)
        out += int(not bool(clean.all()))
    return out


def blobs(n, size, seed=0, dims=2, channels=3):
    """Images (n, C, *size) with a bright square/cube on a dark background and (n, 1, *size) masks."""
    g = torch.Generator().manual_seed(seed)
    shape = (size,) * dims
    x = 0.1 + 0.1 * torch.rand(n, channels, *shape, generator=g)
    m = torch.zeros(n, 1, *shape)
    w = size // 2
    for i in range(n):
        r = 1 + (i * 3) % (size - w - 1)
        sl = tuple(slice(r, r + w) for _ in range(dims))
        x[(i, slice(None), *sl)] = FG
        m[(i, 0, *sl)] = 1.0
    return x, m


class _Rule(torch.nn.Module):
    """logits = gain * (mean over channels - 0.5) (+ a bg channel): the bright-pixel rule."""

    def __init__(self, channels, out, dims=2):
        super().__init__()
        conv = torch.nn.Conv2d if dims == 2 else torch.nn.Conv3d
        self.conv = conv(channels, out, 1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[out - 1] = 20.0 / channels
            self.conv.bias.zero_()
            self.conv.bias[out - 1] = -10.0

    def forward(self, x):
        return self.conv(x)


def _monai_net(lightning, channels, dims=2):
    """The MONAI projects' model, a ``LightningModule`` of the ``lightning`` namespace: the bright-pixel
    rule on dict samples (``image``, ``label`` MetaTensors), cross-entropy on the label's first channel."""

    class Net(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.seen = _Rule(channels, 2, dims=dims), {}

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            self.seen.setdefault(self.current_epoch, []).extend(batch["image"].as_tensor())
            return torch.nn.functional.cross_entropy(self(batch["image"]), batch["label"][:, 0].long())

        def validation_step(self, batch, _):
            loss = torch.nn.functional.cross_entropy(self(batch["image"]), batch["label"][:, 0].long())
            self.log("val_loss", loss, batch_size=len(batch["image"]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Net


# ------------------------------------------------------------------ 1: pytorch_lightning + MONAI dicts
def make_polyp(mining=None):
    import monai.transforms as MT
    import pytorch_lightning as pl
    from monai.data import Dataset as MonaiDataset

    x, m = blobs(24, 32, seed=1)
    items = [{"image": x[i].numpy(), "label": m[i].numpy()} for i in range(len(x))]
    train_tf = MT.Compose(
        [
            MT.EnsureTyped(keys=["image", "label"]),
            MT.RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0),
        ]
    )
    val_tf = MT.Compose([MT.EnsureTyped(keys=["image", "label"])])

    PolypNet = _monai_net(pl, channels=3)

    class PolypData(pl.LightningDataModule):
        def setup(self, stage=None):
            self.train_ds = MonaiDataset(items[:16], train_tf)
            self.val_ds = MonaiDataset(items[16:], val_tf)

        def train_dataloader(self):
            ds = mining.wrap(self.train_ds) if mining is not None else self.train_ds  # glue
            return DataLoader(ds, batch_size=4, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_ds, batch_size=4)

    return pl, PolypNet, PolypData


# ------------------------------------------------------------------ 2: lightning + random_split tuples
class Lungs(Dataset):
    """Grey (1,H,W) images and float (1,H,W) masks as tuples, no case ids."""

    def __init__(self, n=24, size=32):
        self.x, self.m = blobs(n, size, seed=2, channels=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.m[i]


def make_lung(mining=None, namespace="lightning.pytorch"):
    L = importlib.import_module(namespace)

    class LungNet(L.LightningModule):
        """One-channel logits for BCE-with-logits; in epoch 0 they all lie in [0.3, 0.7] (as a
        BCE-trained conv's do early on), from epoch 1 the bright-pixel rule."""

        def __init__(self):
            super().__init__()
            self.net, self.seen = _Rule(1, 1), {}

        def forward(self, x):
            z = self.net(x)
            return 0.5 + 0.2 * torch.tanh(z) if self.current_epoch == 0 else z

        def training_step(self, batch, _):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).extend(x)
            return torch.nn.functional.binary_cross_entropy_with_logits(self(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.binary_cross_entropy_with_logits(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class LungData(L.LightningDataModule):
        def setup(self, stage=None):
            self.train_set, self.val_set = random_split(
                Lungs(), [16, 8], generator=torch.Generator().manual_seed(0)
            )

        def train_dataloader(self):
            ds = mining.wrap(self.train_set) if mining is not None else self.train_set  # glue
            return DataLoader(ds, batch_size=4, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_set, batch_size=4)

    return L, LungNet, LungData


# ------------------------------------------------------------------ 3: 3-D MONAI, crop lists
def make_spleen(mining=None, num_workers=0):
    import lightning.pytorch as L
    import monai.transforms as MT
    from monai.data import DataLoader as MonaiLoader
    from monai.data import Dataset as MonaiDataset
    from monai.data import list_data_collate

    x, m = blobs(10, 16, seed=3, dims=3, channels=1)
    items = [{"image": x[i].numpy(), "label": m[i].numpy()} for i in range(len(x))]
    train_tf = MT.Compose(
        [
            MT.EnsureTyped(keys=["image", "label"]),
            MT.RandCropByPosNegLabeld(
                keys=["image", "label"],
                label_key="label",
                spatial_size=(12, 12, 12),
                pos=1,
                neg=1,
                num_samples=2,
            ),
            MT.RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0),
        ]
    )
    val_tf = MT.Compose([MT.EnsureTyped(keys=["image", "label"])])

    SpleenNet = _monai_net(L, channels=1, dims=3)

    class SpleenData(L.LightningDataModule):
        def setup(self, stage=None):
            self.train_ds = MonaiDataset(items[:6], train_tf)
            self.val_ds = MonaiDataset(items[6:], val_tf)

        def train_dataloader(self):
            ds = mining.wrap(self.train_ds) if mining is not None else self.train_ds  # glue
            return MonaiLoader(
                ds, batch_size=2, shuffle=True, num_workers=num_workers, collate_fn=list_data_collate
            )

        def val_dataloader(self):
            return MonaiLoader(self.val_ds, batch_size=1)

    return L, SpleenNet, SpleenData


def as_numpy(images) -> np.ndarray:
    return torch.stack([torch.as_tensor(i).float() for i in images]).numpy()
