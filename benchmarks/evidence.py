"""Evidence v2 (issue 12): failure mining and the checkpoint policies under a held-out protocol.

Protocol (one command per dataset):
- **Split** (fixed by ``--data-seed``, never by the training seed): the training set is split by
  case into train / validation / test. Polyps: Kvasir-SEG; the test part plus CVC-ClinicDB,
  CVC-ColonDB, ETIS and the PolypGen centres (C1–C6) are *held out*. ACDC: split by patient
  (both phases of a patient on one side); only the in-domain test patients are held out.
- **Conditions** (same optimiser steps; ``benchmarks/conditions.py``): ``plain``, ``random``
  (standard random augmentation with the same perturbation families), ``mined`` (failure replay
  with the recipe's family settings).
- **Choices on validation only**: after every epoch the recorder scores the validation cases
  (clean per-case Dice) and keeps the weights in memory. Checkpoints are
  picked from the *validation* history: least validation loss (``least_loss``, the checkpoint the
  conditions are compared at), best validation Dice, the last epoch, and every balanced policy
  (``last_inlier``, ``maximin``, ``pareto``, ``cvar``). Each pick is then *reported* on the held-out
  cases, which no choice ever saw (evaluated after training from the kept weights; with
  ``--heldout-curve`` every epoch is, for the held-out trade-off curve).
- **EFR** on the held-out sets at the least-loss checkpoint, with one fixed MR suite (seeded by the
  data seed, so every condition and seed meets the same follow-ups).
- **Statistics**: mean ± std over training seeds; paired differences (per held-out case, same
  seed, across conditions or policies) with a case-bootstrap 95 % CI (``paired_stats.py``).

Writes ``<out>/<dataset>/results.json`` (per-run, per-case numbers and the summary) and
``results.md`` (the tables), plus trade-off plots (validation and held-out) for every run.

    python benchmarks/evidence.py --dataset polyp --seeds 0,1,2 --epochs 30 --size 128 --jobs 2
    python benchmarks/evidence.py --dataset acdc --seeds 0,1,2 --epochs 30 --size 128 --jobs 2
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # shared benchmark modules

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
KEY_COLS = ["efr_dice@0.25", "efr_dice@0.5", "efr_iou@0.25", "efr_iou@0.5"]
THRESHOLDS = (0.25, 0.5)


# ----------------------------------------------------------------------------------- data
def three_way_split(dm, test_fraction: float, val_fraction: float, seed: int):
    """Set ``dm.train_dataset`` / ``dm.val_dataset`` and return the held-out test view.

    Split by the datamodule's split key (case; ACDC: patient): ``test_fraction`` of all keys is
    held out, then ``val_fraction`` of all keys is taken from the rest for validation.
    """
    from robusttrain.datamodules.base import split_by_case

    source = dm._read(dm.root)
    keys = [dm._split_key(source.case_id(i)) for i in range(len(source))]
    rest, test = split_by_case(keys, test_fraction, seed)
    rest_keys = [keys[i] for i in rest]
    tr, va = split_by_case(rest_keys, val_fraction / (1.0 - test_fraction), seed + 1)
    tr, va = [rest[i] for i in tr], [rest[i] for i in va]
    assert not ({keys[i] for i in tr} & {keys[i] for i in va + test}), "split leaks a case"
    dm.train_dataset, dm.val_dataset = dm._view(source, tr, True), dm._view(source, va, False)
    return dm._view(source, test, False)


def polypgen_by_centre(dm, root: Path) -> dict:
    """One held-out view per PolypGen centre (``centres.csv``; C1/C2/C4 are inferred, see PROVENANCE)."""
    source = dm._read(str(root))
    with open(root / "centres.csv", newline="") as f:
        centre = {Path(r["image"]).stem: r["centre_inferred"] for r in csv.DictReader(f)}
    out: dict[str, list[int]] = {}
    for i in range(len(source)):
        out.setdefault(f"polypgen_{centre[source.case_id(i)]}", []).append(i)
    return {name: dm._view(source, idx, False) for name, idx in sorted(out.items())}


def build_data(args):
    """(datamodule with train/val set up, {held-out name: dataset}, in-domain names)."""
    kw = dict(image_size=args.size, batch_size=args.batch_size, seed=args.data_seed, num_workers=0)
    if args.dataset == "polyp":
        from robusttrain.datamodules.polyp import PolypDataModule

        dm = PolypDataModule(root=str(DATA / "kvasir_seg"), **kw)
        held = {"kvasir_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
        for name, folder in (("cvc_clinicdb", "cvc_clinicdb"), ("cvc_colondb", "cvc_colondb"),
                             ("etis", "etis_larib")):
            held[name] = dm._view(dm._read(str(DATA / folder)), None, False)
        held.update(polypgen_by_centre(dm, DATA / "polypgen"))
        return dm, held, ["kvasir_test"]
    from robusttrain.datamodules.acdc import ACDCDataModule

    dm = ACDCDataModule(root=str(DATA / "acdc" / "volumes"), **kw)
    held = {"acdc_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
    return dm, held, ["acdc_test"]


# ----------------------------------------------------------------------------------- recording
@torch.no_grad()
def per_case_dice(model, dataset, class_names, batch_size: int = 16) -> list[dict]:
    """Clean per-case Dice (volume sums over a case's slices), one row per case."""
    from torch.utils.data import DataLoader

    from robusttrain.metamorphic.scoring import dice_from_sums, logits_sums

    sums: dict[str, np.ndarray] = {}
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        for cid, s in zip(batch["case_id"], logits_sums(model(batch["image"]), batch["mask"])):
            sums[cid] = sums.get(cid, 0) + s
    return [{"case_id": cid, **{f"dice_{c}": float(v) for c, v in zip(class_names, dice_from_sums(s))}}
            for cid, s in sums.items()]


def make_recorder(class_names: list[str]):
    from lightning.pytorch import Callback

    class EpochRecorder(Callback):
        """After every fitting validation: validation loss, clean per-case validation Dice and a CPU
        copy of the weights (so any epoch picked at the end can be evaluated on held-out data)."""

        def __init__(self):
            self.rows: list[dict] = []
            self.val_loss: dict[int, float] = {}
            self.weights: dict[int, dict] = {}

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking or trainer.state.fn != "fit":
                return
            epoch = int(trainer.current_epoch)
            self.val_loss[epoch] = float(trainer.callback_metrics["val/loss"])
            was = pl_module.training
            pl_module.eval()
            try:
                self.rows += [{"split": "val", "epoch": epoch, **r}
                              for r in per_case_dice(pl_module, trainer.datamodule.val_dataset, class_names)]
            finally:
                pl_module.train(was)
            self.weights[epoch] = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}

    return EpochRecorder()


# ----------------------------------------------------------------------------------- one run
def run_one(cond: str, seed: int, args_dict: dict) -> dict:
    """Train one (condition, seed), pick every checkpoint on validation, report on held-out data."""
    import lightning.pytorch as L
    from conditions import training_callbacks, usable_families

    from robusttrain.cornercases.tradeoff import policy_tradeoff
    from robusttrain.metamorphic.audit import audit
    from robusttrain.metamorphic.records import relative_drops
    from robusttrain.metamorphic.suite import MRSuite
    from robusttrain.models.segmentation import SegmentationModule

    args = argparse.Namespace(**args_dict)
    run_dir = Path(args.out) / args.dataset / f"{cond}_s{seed}"
    done = run_dir / "result.json"
    if args.resume and done.is_file():  # finished by an earlier, interrupted invocation
        return json.loads(done.read_text())
    torch.set_num_threads(args.threads)
    L.seed_everything(seed, workers=True)
    if run_dir.exists():  # a fresh failure bank per run
        import shutil
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    dm, held, _ = build_data(args)
    names = dm.class_names
    n_train_cases, n_val_cases = len(dm.train_dataset.case_ids()), len(dm.val_dataset.case_ids())
    perts = usable_families(args.perturbations.split(","), dm.in_channels)
    sevs = tuple(int(s) for s in args.severities.split(","))
    mining = {k: getattr(args, k) for k in ("jitter", "fresh_image", "clean_mix") if getattr(args, k, None) is not None}
    cbs, _ = training_callbacks(cond, dm, perts, sevs, seed=args.data_seed, ratio=args.ratio, probe=args.probe,
                                mine_every=args.mine_every, run_dir=str(run_dir), mining=mining)
    rec = make_recorder(names)
    feats = tuple(int(f) for f in args.features.split(","))
    model = SegmentationModule(in_channels=dm.in_channels, num_classes=dm.num_classes, class_names=names,
                               lr=args.lr, features=feats)
    trainer = L.Trainer(max_epochs=args.epochs, callbacks=[*cbs, rec], logger=False, default_root_dir=run_dir,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, accelerator="cpu", devices=1, deterministic=False)
    t0 = time.time()
    trainer.fit(model, datamodule=dm)
    train_s = time.time() - t0

    rows = pd.DataFrame(rec.rows)
    cols = [f"dice_{c}" for c in names]
    rows["dice"] = rows[cols].mean(axis=1)
    val = rows
    losses = {e: v for e, v in rec.val_loss.items() if np.isfinite(v)}
    least = min(losses, key=lambda e: (losses[e], e))  # ties → earliest, like ModelCheckpoint
    trade = policy_tradeoff(val[["case_id", "epoch", *cols]], reference_epoch=least, min_epoch=args.min_epoch,
                            contamination=args.contamination, worst_fraction=args.worst_fraction)
    choices = dict(trade.choices)
    cohort = val.groupby("epoch")["dice"].mean()
    choices["best_val_dice"] = int(max(cohort.index, key=lambda e: (round(float(cohort[e]), 12), e)))

    # held-out per-case Dice at every pick, from the weights kept for that epoch
    t1 = time.time()
    need = sorted(rec.weights) if args.heldout_curve else sorted(set(choices.values()))
    held_rows = []
    model.eval()
    for e in need:
        model.load_state_dict(rec.weights[e])
        for split, ds in held.items():
            held_rows += [{"split": split, "epoch": e, **r} for r in per_case_dice(model, ds, names)]
    held_rows = pd.DataFrame(held_rows)
    held_rows["dice"] = held_rows[cols].mean(axis=1)
    picks = {}
    for pol, e in choices.items():
        at = held_rows[held_rows["epoch"] == e]
        picks[pol] = {"epoch": int(e), "val_cohort": float(cohort[e]),
                      "val_worst_k": float(trade.table["cvar"].get(e, np.nan)) if e in trade.table.index else None,
                      "dice": {s: dict(zip(g["case_id"], g["dice"].round(6))) for s, g in at.groupby("split")}}

    # EFR on the held-out sets at the least-loss checkpoint, one fixed suite for every run
    model.load_state_dict(rec.weights[least])
    suite = MRSuite(perts, sevs, seed=args.data_seed)
    res = audit(model, held, suite, out_dir=None, device="cpu", batch_size=16, path="numpy", class_names=names)
    cases = res["cases"]
    mr = {}
    for (split, cid), g in cases.groupby(["split", "case_id"], sort=False):
        d = {"tests": int(len(g))}
        for m in ("dice", "iou"):
            drop = relative_drops(g[f"src_{m}"], g[f"fol_{m}"])
            for t in THRESHOLDS:
                d[f"errors_{m}@{t:g}"] = int((drop > t).sum())
        d["errors_dice@0.25_by_perturbation"] = {
            p: int((relative_drops(gp["src_dice"], gp["fol_dice"]) > 0.25).sum()) for p, gp in g.groupby("perturbation")}
        mr.setdefault(split, {})[cid] = d
    # the audit's clean source scores must be the recorder's at the same epoch (same weights, same data)
    src = cases.groupby(["split", "case_id"])["src_dice"].first()
    rec_at = held_rows[held_rows["epoch"] == least].set_index(["split", "case_id"])["dice"]
    consistency = float((src - rec_at.reindex(src.index)).abs().max())

    # trade-off plots: the validation picks drawn on validation and on the pooled held-out cases
    from robusttrain.cornercases import epoch_table
    from robusttrain.cornercases.tradeoff import Tradeoff
    from robusttrain.reporting.plots import plot_tradeoff, save_png

    save_png(plot_tradeoff(trade), run_dir / "tradeoff_val.png")
    hist_h = held_rows.assign(case_id=held_rows["split"] + "/" + held_rows["case_id"])
    h_tab = epoch_table(hist_h, cols, [], args.worst_fraction)
    save_png(plot_tradeoff(Tradeoff(h_tab, choices, {}, args.worst_fraction)), run_dir / "tradeoff_heldout.png")
    h_tab.to_csv(run_dir / "tradeoff_heldout.csv")
    trade.table.to_csv(run_dir / "tradeoff_val.csv")
    out = {"condition": cond, "seed": seed, "train_seconds": round(train_s, 1),
           "heldout_seconds": round(time.time() - t1, 1), "heldout_epochs": need, "optimizer_steps": int(trainer.global_step),
           "train_samples_per_epoch": len(dm.train_dataset),
           "n_train_cases": n_train_cases, "n_val_cases": n_val_cases,
           "n_held_out_cases": {s: len(v) for s, v in mr.items()}, "least_loss_epoch": least, "val_loss": losses,
           "choices": choices, "picks": picks, "mr": mr, "tests": [list(t) for t in suite.tests],
           "audit_clean_max_abs_diff": consistency,
           "selection_reasons": {p: s.reason for p, s in trade.selections.items()}}
    if cond == "mined":
        bank = cbs[-1].bank
        out.update(bank_size=len(bank), trainable=len(bank.trainable()),
                   distinct_cases=len({r.case_id for r in bank.trainable()}))
    from robusttrain.io import atomic_write_text

    atomic_write_text(done, json.dumps(out, default=float))
    print(json.dumps({k: out[k] for k in ("condition", "seed", "train_seconds", "heldout_seconds",
                                          "least_loss_epoch", "choices", "audit_clean_max_abs_diff")}), flush=True)
    return out


def _run_star(job):
    return run_one(*job)


# ----------------------------------------------------------------------------------- summary
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=["polyp", "acdc"], required=True)
    ap.add_argument("--seeds", default="0,1,2", help="training seeds")
    ap.add_argument("--conditions", default="plain,random,mined")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--size", type=int, default=128, help="training / evaluation image size (px)")
    ap.add_argument("--features", default="16,16,32,64,128,16", help="MONAI BasicUNet widths")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--test-fraction", type=float, default=None, help="held-out share (polyp 0.25, acdc 0.3)")
    ap.add_argument("--val-fraction", type=float, default=None, help="validation share (polyp 0.15, acdc 0.3)")
    ap.add_argument("--perturbations", default="",
                    help="suite name or comma list of families; '' = endoscopy (polyp) / mri (acdc)")
    ap.add_argument("--severities", default="2,4")
    ap.add_argument("--ratio", type=float, default=0.2, help="extra slots per epoch (all conditions)")
    ap.add_argument("--probe", type=int, default=32, help="training cases probed for failures (mined)")
    ap.add_argument("--mine-every", type=int, default=1, help="probe every N epochs (mined)")
    for flag in ("jitter", "fresh-image", "clean-mix"):
        ap.add_argument(f"--{flag}", type=float, default=None,
                        help=f"FailureMiningCallback {flag.replace('-', '_')} (mined; default: conditions.MINING_DEFAULTS)")
    ap.add_argument("--min-epoch", type=int, default=3, help="warm-up epochs the balanced policies skip")
    ap.add_argument("--contamination", type=float, default=0.1)
    ap.add_argument("--worst-fraction", type=float, default=0.1, help="k of the worst-k / cvar numbers")
    ap.add_argument("--data-seed", type=int, default=0, help="split + MR-suite seed (fixed)")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--heldout-curve", action="store_true",
                    help="evaluate every epoch on the held-out sets (trade-off curve), not only the picks")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--out", default="runs/evidence")
    ap.add_argument("--resume", action="store_true",
                    help="reuse <out>/<dataset>/<cond>_s<seed>/result.json of runs that already finished")
    args = ap.parse_args(argv)
    defaults = {"polyp": (0.25, 0.15), "acdc": (0.3, 0.3)}[args.dataset]
    args.test_fraction = defaults[0] if args.test_fraction is None else args.test_fraction
    args.val_fraction = defaults[1] if args.val_fraction is None else args.val_fraction
    args.perturbations = args.perturbations or {"polyp": "endoscopy", "acdc": "mri"}[args.dataset]

    jobs = [(c, int(s), vars(args)) for s in args.seeds.split(",") for c in args.conditions.split(",")]
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(_run_star, jobs, chunksize=1)
    else:
        results = [_run_star(j) for j in jobs]
    from evidence_report import summarise, write_tables

    summary = summarise(results, args)
    out = Path(args.out) / args.dataset
    out.mkdir(parents=True, exist_ok=True)
    payload = {"args": vars(args), "wall_seconds": round(time.time() - t0, 1), "summary": summary,
               "results": results}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=float))
    md = write_tables(summary, args)
    (out / "results.md").write_text(md)
    print(md)
    return payload


if __name__ == "__main__":
    main()
