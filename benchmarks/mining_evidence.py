"""Does retraining on mined metamorphic failures help? Three runs, same seed and step budget:

(a) plain      — training set + ``n_slots`` clean duplicate samples per epoch
(b) random     — the slots hold a random perturbation x severity with random params
(c) mined      — the slots hold failures mined on a train probe (FailureMiningCallback)

All three see ``N + n_slots`` samples per epoch (slots = 20 % of an epoch), so only what fills
the slots differs. Afterwards the same seeded MR suite runs on the held-out validation split
(never trained on) and we report the overall EFR (errors / test cases over all perturbations x
severities) at t = 0.25 and 0.5 for Dice and IoU, and the clean Dice.

    python benchmarks/mining_evidence.py --data synthetic --epochs 8
    python benchmarks/mining_evidence.py --data kvasir --epochs 8
"""
from __future__ import annotations

import argparse
import sys
import json
import time
from pathlib import Path

import lightning.pytorch as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback  # noqa: E402
from robusttrain.datamodules.polyp import PolypDataModule # noqa: E402
from robusttrain.mining import RandomPerturbationDataset # noqa: E402
from robusttrain.models.segmentation import SegmentationModule # noqa: E402

PERTS = ["contrast", "saturation", "white_balance", "blur", "specularity"]
SEVS = (2, 4)
KVASIR = "/work/shared/data/kvasir_seg"


class _Module(SegmentationModule):
    # binary case: torchmetrics returns a 0-d per-class Dice, which SegmentationModule's
    # on_validation_epoch_end cannot iterate (reported to its owner); log it directly here
    def on_validation_epoch_end(self) -> None:
        d = self.val_dice.compute().reshape(-1)
        self.val_dice.reset()
        self.log("val/dice", d.mean())


def datamodule(args) -> PolypDataModule:
    kw = dict(image_size=args.size, batch_size=8, num_workers=args.workers, seed=args.seed)
    if args.data == "kvasir":
        return PolypDataModule(root=KVASIR, val_fraction=0.3, **kw)
    return PolypDataModule(n_train=args.n_train, n_val=args.n_val, **kw)


def run(cond: str, args, out: Path) -> dict:
    L.seed_everything(args.seed, workers=True)
    torch.set_num_threads(args.threads)
    run_dir = out / args.data / cond
    dm = datamodule(args)
    dm.setup("fit")
    mr = MetamorphicCallback(perturbations=PERTS, severities=SEVS, every_n_epochs=args.epochs,
                             seed=args.seed, dirpath=str(run_dir), verbose=False,
                             train_probe_size=args.probe if cond == "mined" else 0)
    cbs = [mr]
    if cond == "mined":
        cbs.append(FailureMiningCallback(replay_ratio=args.ratio, jitter=args.jitter))
    else:  # same slot layout as ReplayDataset; the datamodule's loader reads train_dataset
        dm.train_dataset = RandomPerturbationDataset(dm.train_dataset, PERTS if cond == "random" else [],
                                                     SEVS, ratio=args.ratio)
        mr.datasets["train"] = dm.train_dataset.base
    model = _Module(in_channels=3, num_classes=2, class_names=["polyp"], lr=args.lr)
    trainer = L.Trainer(max_epochs=args.epochs, callbacks=cbs, logger=False, default_root_dir=run_dir,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, accelerator="cpu", devices=1, deterministic=False)
    t0 = time.time()
    trainer.fit(model, datamodule=dm)
    efr = mr.efr[(mr.efr["split"] == "val") & (mr.efr["epoch"] == args.epochs - 1)
                 & (mr.efr["perturbation"] != "all")]  # "all" rows are the pooled totals
    res = {"condition": cond, "seconds": round(time.time() - t0, 1),
           "train_samples_per_epoch": len(dm.train_dataset) + (cbs[-1].replay.n_slots if cond == "mined" else 0),
           "held_out_cases": int(mr.history["case_id"].nunique())}
    for (metric, t), g in efr.groupby(["metric", "threshold"]):
        res[f"efr_{metric}@{t:g}"] = round(100 * g["errors"].sum() / g["cases"].sum(), 2)
    last = mr.history[mr.history["epoch"] == args.epochs - 1]
    res["clean_dice"] = round(100 * float(last["dice_polyp"].astype(float).mean()), 2)
    per = efr[(efr["metric"] == "dice") & (efr["threshold"] == 0.25)].groupby("perturbation")
    res["efr_dice@0.25_by_perturbation"] = {p: round(float(100 * g["errors"].sum() / g["cases"].sum()), 1)
                                            for p, g in per}
    if cond == "mined":
        res["bank_size"] = len(cbs[-1].bank)
        res["mining_log"] = cbs[-1].rows
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=["synthetic", "kvasir"], default="synthetic")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--n-train", type=int, default=96)
    ap.add_argument("--n-val", type=int, default=32)
    ap.add_argument("--probe", type=int, default=32, help="train-probe cases mined per epoch (c)")
    ap.add_argument("--ratio", type=float, default=0.2)
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--conditions", default="plain,random,mined")
    ap.add_argument("--out", default="runs/mining_evidence")
    args = ap.parse_args()
    out = Path(args.out)
    results = [run(c, args, out) for c in args.conditions.split(",")]
    (out / args.data).mkdir(parents=True, exist_ok=True)
    (out / args.data / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    cols = ["efr_dice@0.25", "efr_dice@0.5", "efr_iou@0.25", "efr_iou@0.5", "clean_dice", "seconds"]
    print(f"| {args.data} | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in results:
        print(f"| {r['condition']} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    for r in results:
        print(r["condition"], "EFR dice@0.25 by perturbation:", r["efr_dice@0.25_by_perturbation"])


if __name__ == "__main__":
    main()
