"""Shared toy data and models for the callback tests: real Lightning modules, tiny synthetic data.

Extend here instead of copying a ``Tiny`` / ``Blobs`` into a new test file:

* :class:`Blobs` -- cases of ``slices`` slices, 3-channel images with a bright (red) rectangle as the
  foreground; dict batches (``image, mask, case_id, slice_index``) or ``(image, mask)`` tuples.
* :class:`Tiny` -- one 3x3 conv starting as a "red > 0.6" detector (good clean Dice, colour-fragile);
  ``out=1`` for a one-channel sigmoid head; ``head="dict"`` returns ``{"aux": ..., "out": logits}``
  (the main output under a key other than ``logits``, behind an auxiliary head).
* :class:`Classes` / :class:`ClassNet` -- 1-channel 16x16 slices with three foreground classes
  (class k where the image is about k/3; ``size``, ``box``, ``slices``, ``clamp`` for other shapes) and a
  4-class conv that learns them; logs ``val/loss``.
* :class:`LevelCases` / :class:`TinyBN` -- 1-channel 16x16 slices of six cases at different intensity
  levels, the mask where the image is bright, and a conv + BatchNorm 2-class net (:class:`ClassNet`'s
  steps): the weight-averaging tests (BatchNorm statistics to recompute).
* :func:`cube_volumes` / :class:`MonaiVol` -- 3-D (1,16,16,8) volumes with a bright cube, and MONAI's
  3-D UNet behind a LightningModule (each test writes its own ``training_step``).
* :class:`Snapshots` -- records the weights at every fitting validation.
* :func:`quiet_trainer` -- a Lightning trainer without logger, checkpoints, progress bar or summary, on one CPU.
* :func:`fit` -- a quiet deterministic CPU trainer on :class:`Blobs`.
* :func:`square_batch` -- one (images, masks) batch: noisy mid-grey images, a square lesion in each.
* :func:`run_ddp_shards` -- MetamorphicTraining in a two-process CPU DDP fit of :class:`Tiny`, each rank on
  its own shard of :class:`Blobs` (in a subprocess).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

COLOUR = ["saturation", "contrast", "white_balance"]


def square_batch(n=8, size=32, seed=0):
    """(B,3,H,W) images in [0.2, 0.7] and (B,H,W) masks with the same square lesion in every image."""
    g = torch.Generator().manual_seed(seed)
    x = 0.2 + 0.5 * torch.rand(n, 3, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    m[:, size // 4 : size // 2, size // 4 : size // 2] = 1
    return x, m


class Blobs(Dataset):
    """Cases of ``slices`` slices: a bright rectangle (foreground) on a dark noisy background."""

    def __init__(self, n=8, slices=2, size=24, seed=0, tuples=False):
        g = torch.Generator().manual_seed(seed)
        self.x = 0.15 + 0.2 * torch.rand(n, 3, size, size, generator=g)
        self.m = torch.zeros(n, size, size, dtype=torch.long)
        for i in range(n):
            r, c = 3 + i % 5, 2 + (i * 3) % 9
            self.x[i, :, r : r + 6 + i % 4, c : c + 8] = torch.tensor([0.8, 0.5, 0.4]).view(3, 1, 1)
            self.m[i, r : r + 6 + i % 4, c : c + 8] = 1
        self.slices, self.tuples = slices, tuples

    def __len__(self):
        return len(self.x)

    def case_ids(self):
        return [f"p{i // self.slices}" for i in range(len(self))]

    def __getitem__(self, i):
        if self.tuples:
            return self.x[i], self.m[i]
        return {
            "image": self.x[i],
            "mask": self.m[i],
            "case_id": f"p{i // self.slices}",
            "slice_index": i % self.slices,
        }


class Tiny(L.LightningModule):
    def __init__(self, lr=0.05, out=2, head="tensor"):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Conv2d(3, out, 3, padding=1)
        with torch.no_grad():  # start as a "red > 0.6" detector: good clean Dice, colour-fragile
            self.net.weight.mul_(0.05)
            self.net.weight[out - 1, 0, 1, 1] += 10.0
            self.net.bias.zero_()
            self.net.bias[out - 1] = -6.0
        self.lr, self.out, self.head = lr, out, head

    def forward(self, x):
        z = self.net(x)
        if self.head == "dict":  # an auxiliary head first: whoever reads "the first value" reads it
            return {"aux": -z, "out": z}
        return z

    def _xy(self, b):
        return (b["image"], b["mask"]) if isinstance(b, dict) else b

    def training_step(self, b, i):
        x, y = self._xy(b)
        z = self(x)  # through forward: hooks on the module (the MR check's validation reuse) see it
        z = z["out"] if isinstance(z, dict) else z
        if self.out == 1:
            return torch.nn.functional.binary_cross_entropy_with_logits(z[:, 0], y.float())
        return torch.nn.functional.cross_entropy(z, y)

    def validation_step(self, b, i):
        self.log("val/loss", self.training_step(b, i))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def quiet_trainer(lightning=L, **overrides) -> L.Trainer:
    """A Lightning trainer for tests, quiet by default: ``logger=False``, ``enable_checkpointing=False``,
    ``enable_progress_bar=False``, ``enable_model_summary=False``, on ``accelerator="cpu"``, ``devices=1``.

    Every keyword goes to the trainer and wins over these defaults (``max_epochs``, ``callbacks``,
    ``default_root_dir`` ..., or ``enable_checkpointing=True`` where a test needs Lightning's checkpoints).
    ``lightning``: the namespace whose ``Trainer`` it is (a user project's ``pytorch_lightning``).
    """
    quiet = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    return lightning.Trainer(**(quiet | overrides))


def fit(tmp_path, cb, epochs=2, model=None, ds=None, **kw):
    """:func:`quiet_trainer` with a CSV logger, deterministic, fitted on :class:`Blobs` (``extra``: more
    callbacks after ``cb``)."""
    ds = ds or Blobs()
    trainer = quiet_trainer(
        max_epochs=epochs,
        callbacks=[cb] + kw.pop("extra", []),
        logger=CSVLogger(tmp_path),
        deterministic=True,
        **kw,
    )
    trainer.fit(model or Tiny(), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4))
    return trainer


class SliceItems(Dataset):
    """A dataset of prepared dict samples (``self.items``)."""

    items: list[dict]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Classes(SliceItems):
    """n_cases × ``slices`` slices of size×size; class k (1..3) is a box×box square where the image is
    ≈ k/3 (``clamp``: the image clipped to [0, 1])."""

    def __init__(self, n_cases=6, seed=0, size=16, box=4, slices=2, clamp=False):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for c in range(n_cases):
            for s in range(slices):
                mask = torch.zeros(size, size, dtype=torch.long)
                for k in (1, 2, 3):
                    y, x = torch.randint(0, size - box, (2,), generator=g).tolist()
                    mask[y : y + box, x : x + box] = k
                img = mask.float()[None] / 3 + 0.05 * torch.randn(1, size, size, generator=g)
                img = img.clamp(0, 1) if clamp else img
                self.items.append({"image": img, "mask": mask, "case_id": f"case{c}", "slice_index": s})

    def case_ids(self):
        return [it["case_id"] for it in self.items]


class ClassNet(L.LightningModule):
    """Cross-entropy on dict batches; a 4-class conv for :class:`Classes` unless ``net`` is given."""

    def __init__(self, net: nn.Module | None = None, lr: float = 0.5):
        super().__init__()
        self.net = net if net is not None else nn.Conv2d(1, 4, 3, padding=1)
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, b, _):
        return nn.functional.cross_entropy(self(b["image"]), b["mask"])

    def validation_step(self, b, _):
        self.log(
            "val/loss", nn.functional.cross_entropy(self(b["image"]), b["mask"]), batch_size=len(b["mask"])
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LevelCases(SliceItems):
    """12 samples of 16×16 (6 cases × 2 slices); the mask is where the image is bright."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for c in range(6):
            for s in range(2):
                mask = torch.zeros(16, 16, dtype=torch.long)
                y, x = torch.randint(0, 10, (2,), generator=g).tolist()
                mask[y : y + 6, x : x + 6] = 1
                img = (
                    mask.float()[None] + 0.3 * torch.randn(1, 16, 16, generator=g) + c
                )  # cases differ in level
                self.items.append({"image": img, "mask": mask, "case_id": f"case{c}", "slice_index": s})


class TinyBN(ClassNet):
    """Conv + BatchNorm + ReLU + conv, two classes, SGD at 0.1: for :class:`LevelCases`."""

    def __init__(self):
        net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
        super().__init__(net, lr=0.1)


def cube_volumes(n=4, seed=0):
    """``n`` dict samples of a (1,16,16,8) volume in [0.2, 0.5] with a brighter cube, the cube as the mask."""
    g = torch.Generator().manual_seed(seed)
    vols = [
        {
            "image": 0.2 + 0.3 * torch.rand(1, 16, 16, 8, generator=g),
            "mask": torch.zeros(16, 16, 8, dtype=torch.long),
        }
        for _ in range(n)
    ]
    for v in vols:
        v["image"][:, 4:10, 4:10, 2:6] += 0.4
        v["mask"][4:10, 4:10, 2:6] = 1
    return vols


class MonaiVol(L.LightningModule):
    """MONAI's 3-D UNet (one channel in, two classes, two levels), Adam 1e-2; a test adds its
    ``training_step`` (the volumes' tests each train through a different metamorphic helper)."""

    def __init__(self):
        from monai.networks.nets import UNet

        super().__init__()
        torch.manual_seed(0)
        self.net = UNet(3, 1, 2, channels=(4, 8), strides=(2,), num_res_units=0)

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), 1e-2)


class Snapshots(L.Callback):
    """Records the weights at every fitting validation, to check a saved checkpoint against."""

    def __init__(self):
        self.weights = {}

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.weights[trainer.current_epoch] = {
                k: v.detach().clone() for k, v in pl_module.state_dict().items()
            }


def ddp_shards_fit(out, forward=False, **training):
    """One rank of a two-process CPU DDP fit of :class:`Tiny` with ``MetamorphicTraining(**training,
    dirpath=out)``: rank r trains on samples r, r+2, ... of ``Blobs(8, slices=1, size=32)`` in order
    (``DistributedSampler`` without shuffle), two a step; ``forward``: the loss through
    ``metamorphic_forward``. Started by :func:`run_ddp_shards` (DDP starts rank 1 by running the script again).
    """
    from torch.utils.data import DistributedSampler

    from robusttrain.callbacks import MetamorphicTraining, metamorphic_forward

    class Shards(Tiny):
        def training_step(self, b, i):
            if not forward:
                return super().training_step(b, i)
            x, y = self._xy(b)
            logits, mr = metamorphic_forward(self, x)
            return nn.functional.cross_entropy(logits, y) + mr

        def train_dataloader(self):
            ds = Blobs(8, slices=1, size=32)
            return DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, shuffle=False))

    mt = MetamorphicTraining(**training, dirpath=out)
    trainer = quiet_trainer(
        max_epochs=1,
        callbacks=[mt],
        enable_checkpointing=True,
        devices=2,
        strategy="ddp",
        use_distributed_sampler=False,
        default_root_dir=out,
    )
    trainer.fit(Shards())


def run_ddp_shards(out, forward=False, **training):
    """Runs :func:`ddp_shards_fit` in a fresh Python process (a script beside ``out``); fails the test,
    with the end of its stderr, if the fit fails."""
    out = Path(out)
    script = out.parent / "ddp.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom toys import ddp_shards_fit\n"
        f"ddp_shards_fit({str(out)!r}, forward={forward!r}, **{training!r})\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def fit_volumes(make_model, dirpath, **training):
    """One epoch on :func:`cube_volumes` (batches of 2) with ``MetamorphicTraining(perturbations=["blur",
    "contrast", "gamma"], record_every=1, dirpath=dirpath, **training)``, by :func:`quiet_trainer` (with
    Lightning's checkpoints); ``make_model()`` builds the model after the trainer. Returns (model, volumes).
    """
    from robusttrain.callbacks import MetamorphicTraining

    vols = cube_volumes()
    mt = MetamorphicTraining(
        perturbations=["blur", "contrast", "gamma"], record_every=1, dirpath=dirpath, **training
    )
    trainer = quiet_trainer(max_epochs=1, callbacks=[mt], default_root_dir=dirpath, enable_checkpointing=True)
    model = make_model()
    trainer.fit(model, DataLoader(vols, batch_size=2))
    return model, vols
