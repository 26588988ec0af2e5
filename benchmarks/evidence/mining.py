"""Does retraining on mined metamorphic failures help? (a)/(b)/(c) with the same budget, several seeds.

(a) plain      — training set with ``ratio`` of each epoch's samples replaced by clean random ones
(b) random     — the slots hold a random perturbation x severity with random params
(c) mined      — the slots hold failures mined on a train probe (FailureMiningCallback)

All three see ``N`` samples per epoch (same optimiser steps), so only what fills the
slots differs. The data split and the MR suite's params are fixed by ``--data-seed`` (so the
held-out follow-ups are identical across conditions and training seeds); ``--seeds`` vary only
the training (weights init, shuffling, augmentation, slot draws). After the last epoch the seeded
MR suite runs on the held-out validation split (never trained on) and we report the overall EFR
(errors / test cases over all perturbations x severities) at t = 0.25 and 0.5 for Dice and IoU,
and the clean Dice; ``results.json`` holds per-seed rows and mean / std over seeds.

    python -m benchmarks.evidence.mining --data synthetic --epochs 15 --seeds 0,1,2
    python -m benchmarks.evidence.mining --data kvasir --epochs 15 --seeds 0,1,2

Mining v2 (issue 44): ``--conditions random_probed,steered`` compares metamorphic training's random
augmentation (q=0.5) with the same augmentation of which ``--steer`` is steered by the failure conditions
(``conditions.STEER_CONDITIONS``; both probe ``--probe`` training cases every epoch), and records each
run's per-epoch mining log (conditions, repaired, new failures on cases that passed before, steered share).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as L
import torch

from benchmarks.evidence.conditions import STEER_CONDITIONS, mean_std, training_callbacks
from benchmarks.paths import DATA_ROOT
from robusttrain.datamodules.polyp import PolypDataModule
from robusttrain.models.segmentation import SegmentationModule

PERTS = ["contrast", "saturation", "white_balance", "blur", "specularity"]
SEVS = (2, 4)
KVASIR = str(DATA_ROOT / "kvasir_seg")  # $DATA_ROOT, else <repo>/../shared/data
KVASIR256 = str(DATA_ROOT / "polyp_256" / "kvasir_seg")  # all 998 Kvasir-SEG pairs at 256 px (PROVENANCE.md)


def datamodule(args) -> PolypDataModule:
    # the split depends on the data seed only, never on the training seed
    kw = dict(image_size=args.size, batch_size=args.batch_size, num_workers=args.workers, seed=args.data_seed)
    if args.data in ("kvasir", "kvasir256"):
        root = KVASIR if args.data == "kvasir" else KVASIR256
        return PolypDataModule(root=root, val_fraction=args.val_fraction, **kw)
    return PolypDataModule(n_train=args.n_train, n_val=args.n_val, **kw)


def run(cond: str, seed: int, args, out: Path) -> dict:
    L.seed_everything(seed, workers=True)
    torch.set_num_threads(args.threads)
    run_dir = out / args.data / f"{cond}_s{seed}"
    if run_dir.exists():  # a fresh failure bank per run
        import shutil

        shutil.rmtree(run_dir)
    dm = datamodule(args)
    dm.setup("fit")
    # MR suite seeded by the data seed: identical held-out follow-ups for every condition and seed
    cbs, mr = training_callbacks(
        cond,
        dm,
        args.perturbations.split(",") if args.perturbations else PERTS,
        SEVS,
        seed=args.data_seed,
        ratio=args.ratio,
        probe=args.probe,
        val_every=args.epochs,
        run_dir=str(run_dir),
        mining=(
            {"steer": args.steer}
            if cond in STEER_CONDITIONS
            else {"jitter": args.jitter, "clean_mix": args.clean_mix, "fresh_image": args.fresh_image}
        ),
        train_seed=seed,
    )
    feats = tuple(int(f) for f in args.features.split(",")) if args.features else None
    model = SegmentationModule(
        in_channels=3, num_classes=2, class_names=["polyp"], lr=args.lr, features=feats
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        callbacks=cbs,
        logger=False,
        default_root_dir=run_dir,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
        deterministic=False,
    )
    t0 = time.time()
    trainer.fit(model, datamodule=dm)
    efr = mr.efr[
        (mr.efr["split"] == "val")
        & (mr.efr["epoch"] == args.epochs - 1)
        & (mr.efr["perturbation"] != "all")  # "all" rows are the pooled totals,
        & (mr.efr["severity"].astype(int) != 0)
    ]  # severity-0 rows pool each perturbation
    res = {
        "condition": cond,
        "seed": seed,
        "seconds": round(time.time() - t0, 1),
        "optimizer_steps": int(trainer.global_step),
        "train_samples_per_epoch": len(dm.train_dataset),  # type: ignore[arg-type]  # built by fit
        "held_out_cases": int(mr.history["case_id"].nunique()),
        "test_cases": int(efr[(efr["metric"] == "dice") & (efr["threshold"] == 0.25)]["cases"].sum()),
    }
    for (metric, t), g in efr.groupby(["metric", "threshold"]):
        res[f"efr_{metric}@{t:g}"] = round(100 * g["errors"].sum() / g["cases"].sum(), 2)
    last = mr.history[mr.history["epoch"] == args.epochs - 1]
    res["clean_dice"] = round(100 * float(last["dice_polyp"].astype(float).mean()), 2)
    per = efr[(efr["metric"] == "dice") & (efr["threshold"] == 0.25)].groupby("perturbation")
    res["efr_dice@0.25_by_perturbation"] = {
        p: round(float(100 * g["errors"].sum() / g["cases"].sum()), 1) for p, g in per
    }
    if cond in STEER_CONDITIONS:
        mining = next(c for c in cbs if hasattr(c, "conditions"))
        res["conditions"] = len(mining.conditions)
        res["new_failures"] = int(sum(r.get("new_failures", 0) for r in mining.rows))
        res["repaired"] = int(sum(r.get("repaired", 0) for r in mining.rows))
        res["steered_share"] = round(
            sum(r.get("steered", 0) for r in mining.rows)
            / max(1, sum(r.get("perturbed", 0) for r in mining.rows)),
            4,
        )
        res["mining_log"] = mining.rows
    if cond == "mined":
        res["bank_size"] = len(cbs[-1].bank)
        res["trainable"] = len(cbs[-1].bank.trainable())
        res["distinct_cases"] = len({r.case_id for r in cbs[-1].bank.trainable()})
        res["mining_log"] = cbs[-1].rows
    print(json.dumps({k: v for k, v in res.items() if k != "mining_log"}), flush=True)
    return res


COLS = ["efr_dice@0.25", "efr_dice@0.5", "efr_iou@0.25", "efr_iou@0.5", "clean_dice", "seconds"]


def summarise(results: list[dict]) -> dict:
    """Mean and (sample) std over seeds per condition."""
    out: dict[str, dict] = {}
    for cond in dict.fromkeys(r["condition"] for r in results):
        rs = [r for r in results if r["condition"] == cond]
        out[cond] = {c: mean_std([r[c] for r in rs]) for c in COLS}
        out[cond]["seeds"] = [r["seed"] for r in rs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=["synthetic", "kvasir", "kvasir256"], default="synthetic")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--n-train", type=int, default=96)
    ap.add_argument("--n-val", type=int, default=48)
    ap.add_argument("--val-fraction", type=float, default=0.3, help="kvasir held-out fraction")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--features", default="8,8,16,32,64,8", help="basic_unet widths ('' = default)")
    ap.add_argument("--probe", type=int, default=64, help="train-probe cases mined per epoch (c)")
    ap.add_argument("--ratio", type=float, default=0.2)
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--clean-mix", type=float, default=0.0)
    ap.add_argument("--fresh-image", type=float, default=0.0)
    ap.add_argument("--perturbations", default="", help="comma list of families ('' = the five above)")
    ap.add_argument(
        "--steer", type=float, default=0.5, help="steered share of the random follow-ups (steered)"
    )
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seeds", default="0,1,2", help="training seeds")
    ap.add_argument("--data-seed", type=int, default=0, help="split + MR-suite seed (fixed)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conditions", default="plain,random,mined")
    ap.add_argument("--out", default="runs/mining_evidence")
    ap.add_argument("--tag", default="", help="results file suffix (results<tag>.json)")
    args = ap.parse_args()
    out = Path(args.out)
    results = [run(c, int(s), args, out) for s in args.seeds.split(",") for c in args.conditions.split(",")]
    summary = summarise(results)
    (out / args.data).mkdir(parents=True, exist_ok=True)
    (out / args.data / f"results{args.tag}.json").write_text(
        json.dumps({"args": vars(args), "summary": summary, "results": results}, indent=2)
    )
    print(f"| {args.data} | " + " | ".join(COLS) + " |")
    print("|---" * (len(COLS) + 1) + "|")
    for cond, m in summary.items():
        print(f"| {cond} | " + " | ".join(f"{m[c]['mean']:.2f} ± {m[c]['std']:.2f}" for c in COLS) + " |")
    for r in results:
        print(r["condition"], r["seed"], "EFR dice@0.25 by perturbation:", r["efr_dice@0.25_by_perturbation"])


if __name__ == "__main__":
    main()
