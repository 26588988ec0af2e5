"""Evidence for issue 5: planted corner cases found by ECOD, and least-loss vs balanced epoch.

Trains a small MONAI BasicUNet on ACDC — the synthetic set with
planted Patient057-like cases (``--root`` omitted) or real HDF5 volumes (``--root``, split by patient)
— with BalancedCheckpoint computing volume-level per-case Dice itself, then prints recall of the
planted cases, the corner-case and cohort Dice at both epochs, and the ``corners`` report.

    python -m benchmarks.evidence.corner_cases --epochs 10 --out runs/evidence_synth
    python -m benchmarks.evidence.corner_cases --root ../shared/data/acdc/volumes --epochs 15 \
        --image-size 96 --val-fraction 0.3 --out runs/evidence_acdc
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from robusttrain.callbacks.balanced_checkpoint import BalancedCheckpoint
from robusttrain.cornercases import POLICIES, corners_report, find_corner_cases, select_balanced_epoch
from robusttrain.datamodules import ACDCDataModule


class UNet(pl.LightningModule):
    """Small MONAI BasicUNet, Dice+CE loss, AdamW; logs ``val/loss`` (the least-loss monitor)."""

    def __init__(self, lr: float):
        super().__init__()
        from monai.losses import DiceCELoss
        from monai.networks.nets import BasicUNet

        self.net = BasicUNet(spatial_dims=2, in_channels=1, out_channels=4, features=(8, 8, 16, 32, 64, 8))
        self.loss = DiceCELoss(to_onehot_y=True, softmax=True, include_background=False)
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, b, _):
        return self.loss(self(b["image"]), b["mask"][:, None])

    def validation_step(self, b, _):
        self.log("val/loss", self.loss(self(b["image"]), b["mask"][:, None]), batch_size=len(b["mask"]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=None, help="ACDC folder; omit for the synthetic set")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--n-train", type=int, default=16, help="synthetic training patients")
    ap.add_argument("--n-val", type=int, default=10, help="synthetic validation patients")
    ap.add_argument("--val-fraction", type=float, default=0.3, help="real data: share of patients held out")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--contamination", type=float, default=0.1)
    ap.add_argument("--policy", default="last_inlier")
    ap.add_argument("--min-epoch", type=int, default=0, help="warm-up epochs excluded from the analysis")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the CPU is shared)")
    ap.add_argument("--out", default="runs/corner_cases_evidence")
    a = ap.parse_args(argv)

    pl.seed_everything(a.seed, workers=True)
    torch.set_num_threads(a.threads)
    dm = ACDCDataModule(
        root=a.root,
        image_size=a.image_size,
        batch_size=a.batch_size,
        n_train=a.n_train,
        n_val=a.n_val,
        val_fraction=a.val_fraction,
        seed=a.seed,
    )
    model = UNet(a.lr)
    out = Path(a.out)
    cb = BalancedCheckpoint(
        dirpath=out, policy=a.policy, contamination=a.contamination, min_epoch=a.min_epoch, retention="all"
    )
    logger = pl.loggers.CSVLogger(out, name="", version="")
    trainer = pl.Trainer(
        max_epochs=a.epochs,
        callbacks=[cb],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        deterministic=True,
        num_sanity_val_steps=0,
        default_root_dir=out,
    )
    t0 = time.time()
    trainer.fit(model, datamodule=dm)
    rep = json.loads((out / "corner_cases.json").read_text())
    hist = cb.case_history
    # the datamodule lists planted cases of both splits; only validation cases can be flagged
    planted = sorted(set(getattr(dm, "planted_hard_cases", []) or []) & set(hist["case_id"]))
    flagged = [c["case_id"] for c in rep["corner_cases"]]
    summary = {
        "train_seconds": round(time.time() - t0, 1),
        "val_cases": int(hist["case_id"].nunique()),
        "epochs": a.epochs,
        "least_loss_epoch": rep["least_loss_epoch"],
        "balanced_epoch": rep["balanced_epoch"],
        "status": rep["status"],
        "flagged": flagged,
        "outlier_epochs": rep["outlier_epochs"],
        "planted": planted,
    }
    if planted:
        hit = set(planted) & set(flagged)
        summary["recall"] = len(hit) / len(planted)
        summary["precision"] = len(hit) / len(flagged) if flagged else None
        # recall at every epoch shows whether detection depends on the epoch picked
        summary["recall_by_epoch"] = {
            int(e): len(
                set(planted)
                & set(find_corner_cases(hist, epoch=int(e), contamination=a.contamination).case_ids)
            )
            / len(planted)
            for e in sorted(hist["epoch"].unique())
        }
    for key in ("least_loss", "balanced"):
        d = rep["dice"].get(key)
        if d:
            summary[f"cohort_mean_dice@{key}"] = round(d["cohort"]["mean"], 4)
            summary[f"corner_mean_dice@{key}"] = {c: round(d["per_case"][c]["mean"], 4) for c in flagged}
            if planted:
                summary[f"planted_mean_dice@{key}"] = {
                    c: round(d["per_case"][c]["mean"], 4) for c in planted if c in d["per_case"]
                }
    # every policy on the same history, least-loss epoch as reference, for comparison
    h = hist.assign(mean=hist[[c for c in hist.columns if c.startswith("dice_")]].mean(axis=1))
    summary["policies"] = {}
    for pol in POLICIES:
        s = select_balanced_epoch(
            hist,
            pol,
            reference_epoch=rep["least_loss_epoch"],
            min_epoch=a.min_epoch,
            contamination=a.contamination,
        )
        at = h[h["epoch"] == s.epoch].set_index("case_id")["mean"]
        summary["policies"][pol] = {
            "epoch": s.epoch,
            "cohort": round(float(at.mean()), 4),
            "corner": {c: round(float(at[c]), 4) for c in s.corner_cases.case_ids},
        }
    print(json.dumps(summary, indent=2))
    print(corners_report(out, policy=a.policy, contamination=a.contamination))
    return summary


if __name__ == "__main__":
    main()
