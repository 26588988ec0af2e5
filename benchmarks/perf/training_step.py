"""Training-step cost of metamorphic training: plain vs each objective / selection setting, side by side.

A real Lightning trainer fits the polyp recipe's model (SegmentationModule, MONAI BasicUNet
16-16-32-64-128-16, Dice+CE, AdamW) on synthetic polyp batches at the recipe's size (128 px, batch 8)
for ``--steps`` steps per setting; a timing callback measures each step from ``on_train_batch_start``
(before MetamorphicTraining draws, scores and perturbs) to ``on_train_batch_end`` (after the optimiser
step). Settings run in interleaved rounds (plain, A, B, ..., plain, A, B, ...) so every setting sees the
same machine load; the table reports the median step time and its ratio to plain (target: the recipe
default <= 2.0x). Wall-clock ratios, one run: the load and versions are printed with them.

    OMP_NUM_THREADS=1 python -m benchmarks.perf.training_step [--steps 12] [--rounds 3] [--size 128] [--device cpu]

``--models basic_unet,lite0_unet`` times only the plain step of each model instead, in interleaved rounds
(basic, lite0, basic, lite0, ...), and prints each one's ratio to the first (issue 43's step-time ratio).
``--model flexible_unet`` times recipe=polyp_gpu's network (FlexibleUNet, EfficientNet-b0 encoder; random
weights: the step's cost does not depend on them) instead of the BasicUNet; ``--precision bf16-mixed``
the recipe's precision. The setting "recipe" is the packaged ``callbacks/metamorphic_training.yaml``
(what every recipe trains with). ``--mr-budget 0.25`` then also fits ``--mr-epochs`` epochs with the
MetamorphicCallback at that budget beside the recipe's MetamorphicTraining and prints, per epoch, the
check's seconds against the training seconds it follows (the callback's own ``mr/check_s`` /
``mr/train_s``; target (train + check) / train <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any

import lightning.pytorch as L
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from benchmarks.common import Results, add_json_argument
from robusttrain.callbacks import MetamorphicCallback, MetamorphicTraining
from robusttrain.cli.compose import PACKAGE_RECIPES
from robusttrain.datamodules import PolypDataModule
from robusttrain.models import SegmentationModule

SETTINGS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "DEFAULT random aug (replace, k=1, q=.5)": dict(k=1, q=0.5, epsilon=1.0),
    "replace, worst-of-4": dict(k=4, q=0.5),
    "consistency, k=1 (lambda=1)": dict(k=1, q=0.5, objective="consistency", consistency=1.0),
    "random + consistency, worst-of-4 augmax": dict(
        k=4, q=0.5, epsilon=1.0, objective="consistency", consistency=1.0, replace_q=0.5, selection="augmax"
    ),
    "random + consistency, AugMix chains": dict(
        k=1,
        q=0.5,
        epsilon=1.0,
        objective="consistency",
        consistency=1.0,
        replace_q=0.5,
        mix="augmix",
        chain_depth=3,
        width=3,
    ),
    "paired worst-of-4, half-size scoring (v3 method)": dict(
        k=4, q=0.5, objective="paired", consistency=1.0, score_scale=0.5
    ),
}
# what the recipes train: recipe=polyp (lite0_unet; model=basic_unet: BasicUNet) and recipe=polyp_gpu
# (FlexibleUNet-b0)
MODELS: dict[str, dict[str, Any]] = {
    "basic_unet": dict(network="basic_unet", features=(16, 16, 32, 64, 128, 16)),
    "flexible_unet": dict(network="flexible_unet", backbone="efficientnet-b0", pretrained=False),
    # model=lite0_unet with its ImageNet weights and the recipe's encoder LR multiplier
    "lite0_unet": dict(
        network="lite0_unet", features=(128, 64, 32, 16, 8), pretrained=True, encoder_lr_mult=0.1
    ),
}


def recipe_setting() -> dict:
    """The packaged recipes' MetamorphicTraining arguments (its yaml's plain values; paths and seeds
    are interpolations and stay at the class defaults)."""
    node = OmegaConf.load(PACKAGE_RECIPES / "callbacks" / "metamorphic_training.yaml").metamorphic_training
    raw = OmegaConf.to_container(node, resolve=False)
    assert isinstance(raw, dict), "metamorphic_training.yaml: expected a mapping"
    skip = {"_target_", "enabled", "perturbations", "severity_caps"}
    return {k: v for k, v in raw.items() if k not in skip and not (isinstance(v, str) and "${" in v)}


SETTINGS["recipe (callbacks/metamorphic_training.yaml)"] = recipe_setting()


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


def time_setting(
    setting: dict | None,
    loader: DataLoader,
    steps: int,
    accelerator: str,
    model_name: str = "basic_unet",
    precision: str = "32-true",
) -> list[float]:
    torch.manual_seed(0)
    model = SegmentationModule(in_channels=3, num_classes=2, lr=3e-3, **MODELS[model_name])
    timer = StepTimer(torch.device("cuda" if accelerator == "gpu" else "cpu"))
    cbs: list[L.Callback] = [timer]
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
        precision=precision,  # type: ignore[arg-type]  # a str Lightning checks itself
    )
    trainer.fit(model, loader)
    shutil.rmtree(out, ignore_errors=True)
    return timer.times[2:]  # the first two steps warm up allocators and caches


def compare_models(
    models: list[str], loader: DataLoader, args: argparse.Namespace, accelerator: str, results: Results
) -> None:
    """The plain training step of each model, interleaved rounds; median and ratio to the first."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown[0]!r}; choose from {', '.join(sorted(MODELS))}")
    times: dict[str, list[float]] = {m: [] for m in models}
    for _ in range(args.rounds):
        for m in models:
            times[m] += time_setting(None, loader, args.steps, accelerator, m, args.precision)
    base = statistics.median(times[models[0]])
    print(f"\nload {os.getloadavg()[0]:.2f} at end\n")
    meds = {m: statistics.median(times[m]) for m in models}
    cols = [f"model ({args.size} px, batch {args.batch_size})", "median step (ms)", f"vs {models[0]}"]
    rows = [[m, 1000 * meds[m], meds[m] / base] for m in models]
    print(results.table("models", cols, rows, {cols[1]: "{:.0f}", cols[2]: "{:.2f}x"}))


class CheckTimes(L.Callback):
    """The MetamorphicCallback's ``mr/check_s`` and ``mr/train_s`` of every fitting validation."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float]] = []

    def on_validation_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        if not trainer.sanity_checking and "mr/check_s" in m:
            self.rows.append((trainer.current_epoch, float(m["mr/check_s"]), float(m["mr/train_s"])))


def time_check(
    dm: PolypDataModule, args: argparse.Namespace, accelerator: str
) -> list[tuple[int, float, float]]:
    """Per epoch (check seconds, training seconds) of a fit with the MR check at ``--mr-budget``."""
    torch.manual_seed(0)
    model = SegmentationModule(in_channels=3, num_classes=2, lr=3e-3, **MODELS[args.model])
    out = tempfile.mkdtemp(prefix="training_step.")
    times = CheckTimes()
    cbs = [
        MetamorphicCallback(dirpath=out, budget=args.mr_budget, batch_size=args.batch_size, verbose=False),
        MetamorphicTraining(dirpath=out, severity_caps=4, record_per_step=0, **recipe_setting()),
        times,
    ]
    trainer = L.Trainer(
        default_root_dir=out,
        max_epochs=args.mr_epochs,
        callbacks=cbs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator=accelerator,
        devices=1,
        precision=args.precision,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    shutil.rmtree(out, ignore_errors=True)
    return times.rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--only", default="", help="comma-separated setting names (substring match)")
    ap.add_argument("--model", choices=sorted(MODELS), default="basic_unet")
    ap.add_argument(
        "--models", default="", help="comma-separated models: the plain step of each, side by side"
    )
    ap.add_argument("--precision", default="32-true", help="Lightning precision, e.g. bf16-mixed")
    ap.add_argument("--mr-budget", type=float, default=None, help="also time the MR check at this budget")
    ap.add_argument("--mr-epochs", type=int, default=3)
    ap.add_argument("--mr-val", type=int, default=64, help="validation images of the --mr-budget fit")
    add_json_argument(ap)
    args = ap.parse_args(argv)
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    results = Results("benchmarks.perf.training_step", args, device=args.device, argv=argv)
    dm = PolypDataModule(
        image_size=args.size,
        batch_size=args.batch_size,
        n_train=args.batch_size * (args.steps + 2),
        n_val=args.mr_val if args.mr_budget is not None else 4,
        seed=0,
    )
    dm.setup("fit")
    assert dm.train_dataset is not None  # setup("fit") builds it
    loader = DataLoader(dm.train_dataset, batch_size=args.batch_size, shuffle=False)
    names = [
        n
        for n in SETTINGS
        if n == "plain" or not args.only or any(s.strip() in n for s in args.only.split(","))
    ]
    print(results.header_line())
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"threads {torch.get_num_threads()}, device {args.device}, load {os.getloadavg()[0]:.2f} at start; "
        f"{args.size} px, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds per setting; "
        f"model {args.model}, precision {args.precision}"
    )
    if args.models:
        compare_models([m.strip() for m in args.models.split(",")], loader, args, accelerator, results)
        results.write(args.json)
        return
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            times[n] += time_setting(SETTINGS[n], loader, args.steps, accelerator, args.model, args.precision)
    base = statistics.median(times["plain"])
    print(f"\nload {os.getloadavg()[0]:.2f} at end\n")
    meds = {n: statistics.median(times[n]) for n in names}
    rows = [[n, 1000 * meds[n], meds[n] / base] for n in names]
    fmt = {"median step (ms)": "{:.0f}", "vs plain": "{:.2f}x"}
    print(results.table("settings", ["setting", "median step (ms)", "vs plain"], rows, fmt))
    if args.mr_budget is not None:
        epochs = time_check(dm, args, accelerator)
        print(f"\nMR check at budget={args.mr_budget} ({args.mr_val} validation images, {args.model}):\n")
        # the last epoch's check is the final one (completes the rotation)
        cols = ["epoch", "training (s)", "check (s)", "(train + check) / train"]
        table = [[e, tr, ch, (tr + ch) / max(tr, 1e-9)] for e, ch, tr in epochs]
        fmt = {cols[1]: "{:.1f}", cols[2]: "{:.1f}", cols[3]: "{:.2f}x"}
        print(results.table("mr_check", cols, table, fmt))
    results.write(args.json)


if __name__ == "__main__":
    main()
