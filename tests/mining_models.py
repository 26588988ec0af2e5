"""Shared by the failure-mining tests (in-process and the DDP subprocess script): a fixed model that
under-exposure reliably breaks, and a check of whether a training sample is a replayed perturbation."""

from __future__ import annotations

import itertools

import lightning.pytorch as L
import torch


class BrightnessModel(L.LightningModule):
    """Foreground where the image is bright: fixed rule (lr 0), so under-exposure breaks it."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[1] = 20.0
            self.conv.bias.copy_(torch.tensor([0.0, -30.0]))
        self.seen: dict[int, list[tuple[str, torch.Tensor]]] = {}

    def forward(self, x):
        return self.conv(x)

    def training_step(self, batch, _):
        self.seen.setdefault(self.current_epoch, []).extend(zip(batch["case_id"], batch["image"]))
        return torch.nn.functional.cross_entropy(self(batch["image"]), batch["mask"])

    def validation_step(self, batch, _):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def dihedral(img):
    """The 8 flips/rotations the polyp datamodule's augmentations can produce."""
    out = []
    for k, h in itertools.product(range(4), (False, True)):
        x = torch.rot90(img, k, (1, 2))
        out.append(torch.flip(x, (2,)) if h else x)
    return out


def n_perturbed(seen, clean_by_case):
    # a sample is perturbed when it matches no flip/rotation of its clean image
    return sum(
        not any(torch.allclose(img, d, atol=1e-6) for d in dihedral(clean_by_case[c])) for c, img in seen
    )
