"""Size Evidence v3 for the machine: seconds per training step of each condition, per size and net.

Trains ``--steps`` real optimiser steps (Lightning, the conditions of ``conditions.py``, the Kvasir
training split of ``run.py --dataset polyp256``) after ``--warmup`` untimed ones, and
extrapolates one epoch (the training split; the slots replace samples) and one run (``--epochs``). Ratios
within one invocation are what to compare: the machine is shared.

    python -m benchmarks.evidence.sizing --sizes 96,128 --features 16,16,32,64,128,16 --conditions plain,metamorphic
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def time_steps(cond: str, size: int, features: tuple[int, ...], args) -> dict:
    import lightning.pytorch as L

    from benchmarks.evidence.conditions import training_callbacks, usable_families
    from benchmarks.evidence.run.data import build_data
    from robusttrain.models.segmentation import SegmentationModule

    ns = argparse.Namespace(
        dataset="polyp256",
        size=size,
        batch_size=args.batch_size,
        data_seed=0,
        test_fraction=0.15,
        val_fraction=0.1,
    )
    dm, _, _ = build_data(ns)
    perts = usable_families(None, 3)
    import tempfile

    run_dir = tempfile.mkdtemp(prefix="evidence_sizing_")  # the callbacks' files, never the checkout
    cbs, _ = training_callbacks(cond, dm, perts, (2, 4), seed=0, ratio=0.2, probe=32, run_dir=run_dir)
    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, *a, **k):
            stamps.append(time.perf_counter())

    model = SegmentationModule(in_channels=3, num_classes=2, class_names=["polyp"], features=features)
    n_params = sum(p.numel() for p in model.parameters())
    tr = L.Trainer(
        max_epochs=1,
        limit_train_batches=args.warmup + args.steps,
        limit_val_batches=0,
        callbacks=[*cbs, Stamp()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    tr.fit(model, datamodule=dm)
    per_step = (stamps[-1] - stamps[args.warmup - 1]) / args.steps
    steps_epoch = -(-len(dm.train_dataset) // args.batch_size)  # the slots replace samples, add none
    return {
        "condition": cond,
        "size": size,
        "features": list(features),
        "params": n_params,
        "s_per_step": round(per_step, 3),
        "steps_per_epoch": steps_epoch,
        "epoch_min": round(per_step * steps_epoch / 60, 2),
        "run_h": round(per_step * steps_epoch * args.epochs / 3600, 2),
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="96,128")
    ap.add_argument("--features", default="16,16,32,64,128,16", help="';'-separated BasicUNet widths")
    ap.add_argument("--conditions", default="plain,metamorphic")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=40, help="epochs per run, for the extrapolation")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for feats in args.features.split(";"):
        for size in (int(s) for s in args.sizes.split(",")):
            for cond in args.conditions.split(","):
                rows.append(time_steps(cond, size, tuple(int(f) for f in feats.split(",")), args))
                print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
