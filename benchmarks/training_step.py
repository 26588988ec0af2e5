"""Training-step cost of metamorphic training: plain vs each objective / selection setting, side by side.

A real Lightning trainer fits the polyp recipe's model (SegmentationModule, MONAI BasicUNet
16-16-32-64-128-16, Dice+CE, AdamW) on synthetic polyp batches at the recipe's size (128 px, batch 8)
for ``--steps`` steps per setting; a timing callback measures each step from ``on_train_batch_start``
(before MetamorphicTraining draws, scores and perturbs) to ``on_train_batch_end`` (after the optimiser
step). Settings run in interleaved rounds (plain, A, B, ..., plain, A, B, ...) so every setting sees the
same machine load; the table reports the median step time and its ratio to plain (target: the recipe
default <= 2.0x). Wall-clock ratios, one run: the load and versions are printed with them.

    OMP_NUM_THREADS=1 python benchmarks/training_step.py [--steps 12] [--rounds 3] [--size 128] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import lightning.pytorch as L  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from robusttrain.callbacks import MetamorphicTraining  # noqa: E402
from robusttrain.datamodules import PolypDataModule  # noqa: E402
from robusttrain.models import SegmentationModule  # noqa: E402

SETTINGS = {
    "plain": None,
    "DEFAULT random aug (replace, k=1, q=.5)": dict(k=1, q=0.5, epsilon=1.0),
    "replace, worst-of-4": dict(k=4, q=0.5),
    "consistency, k=1 (lambda=1)": dict(k=1, q=0.5, objective="consistency", consistency=1.0),
    "random + consistency, worst-of-4 augmax": dict(
        k=4, q=0.5, epsilon=1.0, objective="consistency", consistency=1.0, replace_q=0.5, selection="augmax"
    ),
    "random + consistency, AugMix chains": dict(
        k=1, q=0.5, epsilon=1.0, objective="consistency", consistency=1.0, replace_q=0.5, mix="augmix",
        chain_depth=3, width=3,
    ),
    "paired worst-of-4, half-size scoring (v3 method)": dict(
        k=4, q=0.5, objective="paired", consistency=1.0, score_scale=0.5
    ),
}


class StepTimer(L.Callback):
    """Seconds from the start of each training batch hook to the end of its optimiser step."""

    def __init__(self, device: torch.device):
        self.times: list[float] = []
        self.device = device

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._sync()
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._sync()
        self.times.append(time.perf_counter() - self.t0)


def time_setting(setting: dict | None, loader: DataLoader, steps: int, accelerator: str) -> list[float]:
    torch.manual_seed(0)
    model = SegmentationModule(in_channels=3, num_classes=2, features=(16, 16, 32, 64, 128, 16), lr=3e-3)
    timer = StepTimer(torch.device("cuda" if accelerator == "gpu" else "cpu"))
    cbs = [timer]
    if setting is not None:
        # the MR callback is absent: families = the endoscopy suite, severities up to the recipe's cap 4
        # after the timer: Lightning calls hooks in list order, so the clock starts before the draws
        cbs.append(MetamorphicTraining(severity_caps=4, record_per_step=0, **setting))
    out = tempfile.mkdtemp(prefix="training_step.")  # the callback's files; never the working directory
    trainer = L.Trainer(
        default_root_dir=out,
        max_epochs=1,
        limit_train_batches=steps + 2,
        limit_val_batches=0,
        callbacks=cbs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator=accelerator,
        devices=1,
    )
    trainer.fit(model, loader)
    shutil.rmtree(out, ignore_errors=True)
    return timer.times[2:]  # the first two steps warm up allocators and caches


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--only", default="", help="comma-separated setting names (substring match)")
    args = ap.parse_args(argv)
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    dm = PolypDataModule(
        image_size=args.size,
        batch_size=args.batch_size,
        n_train=args.batch_size * (args.steps + 2),
        n_val=4,
        seed=0,
    )
    dm.setup("fit")
    loader = DataLoader(dm.train_dataset, batch_size=args.batch_size, shuffle=False)
    names = [
        n
        for n in SETTINGS
        if n == "plain" or not args.only or any(s.strip() in n for s in args.only.split(","))
    ]
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"threads {torch.get_num_threads()}, device {args.device}, load {os.getloadavg()[0]:.2f} at start; "
        f"{args.size} px, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds per setting"
    )
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            times[n] += time_setting(SETTINGS[n], loader, args.steps, accelerator)
    base = statistics.median(times["plain"])
    print(f"\nload {os.getloadavg()[0]:.2f} at end\n")
    print("| setting | median step (ms) | vs plain |")
    print("|---|---|---|")
    for n in names:
        med = statistics.median(times[n])
        print(f"| {n} | {1000 * med:.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
