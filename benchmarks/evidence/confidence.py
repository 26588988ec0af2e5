"""How sure a grid run's model is, epoch by epoch: what tells a stalled run from a healthy one.

Evidence v3 found every ``consistency=1`` run of training seed 2 stalling at validation Dice ~0.6. This
reads the per-epoch weights a grid run kept (``<out>/polyp256/<cond>_s<seed>/epochs/epoch=NNN.pt``),
predicts one evaluation set of the protocol (default: the Kvasir validation split every checkpoint is
chosen on) and prints, per run and epoch, the mean per-case Dice at 0.5 and how the foreground
probabilities sit: the share of pixels the model is unsure of (0.2 < p < 0.8), the mean p on the lesion
and off it, and predicted / true lesion area. Nothing is trained; weights are loaded as tensors only.

usage::

    OMP_NUM_THREADS=1 python -m benchmarks.evidence.confidence --out ../evidence_runs \\
        mt_random_s2 consistency_only_s2 [--epochs 9,19,29] [--set val|kvasir_test|cvc_clinicdb]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def confidence_stats(
    p_fg: torch.Tensor, masks: torch.Tensor, unsure: tuple[float, float] = (0.2, 0.8)
) -> dict:
    """Summary of (N,H,W) foreground probabilities against (N,H,W) lesion masks.

    >>> p = torch.tensor([[[0.9, 0.5], [0.1, 0.1]]]); m = torch.tensor([[[1, 1], [0, 0]]])
    >>> s = confidence_stats(p, m)
    >>> round(s["dice"], 3), s["unsure"], round(s["p_lesion"], 2), round(s["p_background"], 2), s["area_ratio"]
    (0.667, 0.25, 0.7, 0.1, 0.5)
    """
    from robusttrain.metamorphic.scoring import dice_from_sums

    lesion = masks > 0
    pred = p_fg > 0.5
    dims = tuple(range(1, p_fg.ndim))
    sums = torch.stack([(pred & lesion).sum(dims), pred.sum(dims), lesion.sum(dims)], -1)
    lo, hi = unsure
    return {
        "dice": float(dice_from_sums(sums).mean()),  # the project's Dice (1.0 when nothing to find)
        "unsure": float(((p_fg > lo) & (p_fg < hi)).float().mean()),
        "p_lesion": float(p_fg[lesion].mean()) if lesion.any() else float("nan"),
        "p_background": float(p_fg[~lesion].mean()) if (~lesion).any() else float("nan"),
        "area_ratio": float(pred.sum()) / max(1.0, float(lesion.sum())),
    }


@torch.no_grad()
def foreground_probabilities(model, dataset, batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import DataLoader

    probs, masks = [], []
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        probs.append(torch.softmax(model(batch["image"]).float(), 1)[:, 1])
        masks.append(batch["mask"])
    return torch.cat(probs), torch.cat(masks)


def main(argv=None) -> list[dict]:
    from benchmarks.evidence.artifacts import load_weights
    from benchmarks.evidence.run.data import SPLIT_FRACTIONS, build_data
    from robusttrain.models.segmentation import SegmentationModule

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run names under <out>/polyp256, e.g. consistency_only_s2")
    ap.add_argument("--out", default="runs/evidence", help="the grid's --out")
    ap.add_argument("--epochs", default="9,19,29")
    ap.add_argument("--set", default="val", choices=["val", "kvasir_test", "cvc_clinicdb"])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--features", default="16,16,32,64,128,16")
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ns = argparse.Namespace(
        dataset="polyp256",
        size=args.size,
        batch_size=8,
        data_seed=0,
        test_fraction=SPLIT_FRACTIONS["polyp256"][0],
        val_fraction=SPLIT_FRACTIONS["polyp256"][1],
        data_root=args.data_root,
    )
    dm, held, _ = build_data(ns)
    dataset = dm.val_dataset if args.set == "val" else held[args.set]
    feats = tuple(int(f) for f in args.features.split(","))
    rows = []
    for run in args.runs:
        for epoch in (int(e) for e in args.epochs.split(",")):
            path = Path(args.out) / "polyp256" / run / "epochs" / f"epoch={epoch:03d}.pt"
            if not path.is_file():
                print(f"evidence_confidence: {path}: no such weights file (finished epochs only)")
                continue
            model = SegmentationModule(in_channels=3, num_classes=2, features=feats)
            model.load_state_dict(load_weights(path))
            model.eval()
            s = confidence_stats(*foreground_probabilities(model, dataset))
            rows.append({"run": run, "epoch": epoch, **s})
            print(
                f"{run:24s} epoch {epoch:2d}  Dice {s['dice']:.3f}  unsure {s['unsure']:.3f}  "
                f"p|lesion {s['p_lesion']:.2f}  p|background {s['p_background']:.3f}  "
                f"area ratio {s['area_ratio']:.2f}"
            )
    if not rows:
        raise SystemExit("evidence_confidence: no weights found; check --out and the run names")
    return rows


if __name__ == "__main__":
    main()
