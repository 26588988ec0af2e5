"""Evidence v2 (issue 12): failure mining and the checkpoint policies under a held-out protocol.

Protocol (one command per dataset):
- **Split** (fixed by ``--data-seed``, never by the training seed): the training set is split by
  case into train / validation / test. Polyps: Kvasir-SEG; the test part plus CVC-ClinicDB,
  CVC-ColonDB, ETIS and the PolypGen centres (C1–C6) are *held out*. ACDC: split by patient
  (both phases of a patient on one side); only the in-domain test patients are held out.
- **Conditions** (same optimiser steps; ``benchmarks/evidence/conditions.py``): ``plain``, ``random``
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

Evidence v4 (issue 34, ``docs/evidence_v4/PROTOCOL.md``): ``--protocol v4`` (its conditions from
``conditions.V4_*``, the test suite ``--test-perturbations`` with the held-out families, runs under
``<out>/<dataset>_v4/``, every follow-up's Dice in ``followups.csv.gz``, fp16 ``least_loss`` / ``last``
weights, tables by ``report_v4.py``); run it through ``grid_v4.sh``.
``--dataset synthetic`` is a procedural stand-in shaped like ``polyp256`` for dry runs and tests.

    python -m benchmarks.evidence.run --dataset polyp --seeds 0,1,2 --epochs 30 --size 128 --jobs 2
    python -m benchmarks.evidence.run --dataset acdc --seeds 0,1,2 --epochs 30 --size 128 --jobs 2
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from benchmarks.paths import DATA_ROOT

DATA = DATA_ROOT  # $DATA_ROOT, else <repo>/../shared/data; --data-root overrides
KEY_COLS = ["efr_dice@0.25", "efr_dice@0.5", "efr_iou@0.25", "efr_iou@0.5"]
THRESHOLDS = (0.25, 0.5)


# ----------------------------------------------------------------------------------- data
# (held-out test, validation) share of each dataset's keys, the protocol's split (--test/--val-fraction)
SPLIT_FRACTIONS = {
    "synthetic": (0.25, 0.25),
    "polyp": (0.25, 0.15),
    "acdc": (0.3, 0.3),
    "polyp256": (0.15, 0.1),
    "pranet256": (0.15, 0.1),
}


def three_way_indices(keys: list[str], test_fraction: float, val_fraction: float, seed: int):
    """(train, val, test) sample indices; every key (case, patient, video sequence) on one side:
    ``test_fraction`` of all keys is held out, then ``val_fraction`` of all keys from the rest."""
    from robusttrain.datamodules.base import split_by_case

    rest, test = split_by_case(keys, test_fraction, seed)
    rest_keys = [keys[i] for i in rest]
    tr, va = split_by_case(rest_keys, val_fraction / (1.0 - test_fraction), seed + 1)
    tr, va = [rest[i] for i in tr], [rest[i] for i in va]
    assert not ({keys[i] for i in tr} & {keys[i] for i in va + test}), "split leaks a case"
    return tr, va, test


def three_way_split(dm, test_fraction: float, val_fraction: float, seed: int):
    """Set ``dm.train_dataset`` / ``dm.val_dataset`` and return the held-out test view.

    Split by the datamodule's split key (case; ACDC: patient): ``test_fraction`` of all keys is
    held out, then ``val_fraction`` of all keys is taken from the rest for validation.
    """
    source = dm._read(dm.root)
    keys = [dm._split_key(source.case_id(i)) for i in range(len(source))]
    tr, va, test = three_way_indices(keys, test_fraction, val_fraction, seed)
    dm.train_dataset, dm.val_dataset = dm._view(source, tr, True), dm._view(source, va, False)
    return dm._view(source, test, False)


class ConcatSource:
    """Several sources as one (a datamodule source: ``load``, ``case_id``, ``slice_index``); case ids
    get the part's name as prefix (``kvasir-<id>``, ``clinicdb-<id>``), so they stay unique."""

    def __init__(self, parts: dict):
        self.parts = list(parts.items())
        self.index = [(k, i) for k, (_, src) in enumerate(self.parts) for i in range(len(src))]
        self.mask_mode = getattr(self.parts[0][1], "mask_mode", None)

    def __len__(self) -> int:
        return len(self.index)

    def load(self, i: int):
        k, j = self.index[i]
        return self.parts[k][1].load(j)

    def case_id(self, i: int) -> str:
        k, j = self.index[i]
        return f"{self.parts[k][0]}-{self.parts[k][1].case_id(j)}"

    def slice_index(self, i: int) -> int:
        return 0


def polypgen_by_centre(dm, root: Path) -> dict:
    """One held-out view per PolypGen centre (``centres.csv``; C1/C2/C4 are inferred, see PROVENANCE)."""
    source = dm._read(str(root))
    with open(root / "centres.csv", newline="") as f:
        centre = {Path(r["image"]).stem: r["centre_inferred"] for r in csv.DictReader(f)}
    out: dict[str, list[int]] = {}
    for i in range(len(source)):
        out.setdefault(f"polypgen_{centre[source.case_id(i)]}", []).append(i)
    return {name: dm._view(source, idx, False) for name, idx in sorted(out.items())}


def clinicdb_sequences(root: Path) -> dict[str, str]:
    """``{case id (file stem): "seqN"}`` from CVC-ClinicDB's ``sequences.csv`` (frames of one video
    sequence show one polyp: they are resampled together)."""
    with open(root / "sequences.csv", newline="") as f:
        return {Path(r["file"]).stem: f"seq{int(r['sequence']):02d}" for r in csv.DictReader(f)}


def build_polyp256(args, kw):
    """Evidence v3 data: Kvasir-SEG (998, polyp_256) split by file id into train / validation /
    held-out test; all 609 CVC-ClinicDB frames (clustered by sequence) and ColonDB, ETIS and the
    PolypGen centres held out. ``dm.clusters`` maps ``(set, case id)`` to its bootstrap cluster."""
    from robusttrain.datamodules.polyp import PolypDataModule

    data = Path(getattr(args, "data_root", None) or DATA)
    root = data / "polyp_256"
    dm = PolypDataModule(root=str(root / "kvasir_seg"), **kw)
    held = {"kvasir_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
    held["cvc_clinicdb"] = dm._view(dm._read(str(root / "cvc_clinicdb")), None, False)
    for name, folder in (("cvc_colondb", "cvc_colondb"), ("etis", "etis_larib")):
        held[name] = dm._view(dm._read(str(data / folder)), None, False)
    held.update(polypgen_by_centre(dm, data / "polypgen"))
    seqs = clinicdb_sequences(root / "cvc_clinicdb")
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/{seqs[c]}" for c in held["cvc_clinicdb"].case_ids()}
    return dm, held, ["kvasir_test"]


def build_pranet256(args, kw):
    """GPU protocol (PraNet-style): train on Kvasir-SEG **and** CVC-ClinicDB. Kvasir split by file
    id, ClinicDB by video sequence (``sequences.csv``), each into train / validation / test with
    ``--test-fraction`` / ``--val-fraction``; validation = both validation parts; held out: both test
    parts (``kvasir_test``, ``cvc_clinicdb`` = the held-out sequences), ColonDB, ETIS, PolypGen."""
    from robusttrain.datamodules.polyp import PolypDataModule

    root = Path(args.data_root) / "polyp_256"
    dm = PolypDataModule(root=str(root / "kvasir_seg"), **kw)
    src = ConcatSource(
        {"kvasir": dm._read(str(root / "kvasir_seg")), "clinicdb": dm._read(str(root / "cvc_clinicdb"))}
    )
    seqs = clinicdb_sequences(root / "cvc_clinicdb")
    ids = [src.case_id(i) for i in range(len(src))]
    parts = {
        "kvasir": [i for i, c in enumerate(ids) if c.startswith("kvasir-")],
        "clinicdb": [i for i, c in enumerate(ids) if c.startswith("clinicdb-")],
    }
    key = lambda c: f"clinicdb-{seqs[c.split('-', 1)[1]]}" if c.startswith("clinicdb-") else c
    split = {}
    for name, idx in parts.items():
        tr, va, te = three_way_indices(
            [key(ids[i]) for i in idx], args.test_fraction, args.val_fraction, args.data_seed
        )
        split[name] = ([idx[i] for i in tr], [idx[i] for i in va], [idx[i] for i in te])
    dm.train_dataset = dm._view(src, split["kvasir"][0] + split["clinicdb"][0], True)
    dm.val_dataset = dm._view(src, split["kvasir"][1] + split["clinicdb"][1], False)
    held = {
        "kvasir_test": dm._view(src, split["kvasir"][2], False),
        "cvc_clinicdb": dm._view(src, split["clinicdb"][2], False),
    }
    # The other OOD sets are optional here: the device copy (benchmarks/gpu/pack.py) carries them only
    # while its 64 MiB budget holds. A missing one is named, never silently dropped.
    for name, folder in (("cvc_colondb", "cvc_colondb"), ("etis", "etis_larib"), ("polypgen", "polypgen")):
        if not (Path(args.data_root) / folder).is_dir():
            print(f"[evidence] held-out set {folder} not under {args.data_root}: not reported", flush=True)
        elif name == "polypgen":
            held.update(polypgen_by_centre(dm, Path(args.data_root) / folder))
        else:
            held[name] = dm._view(dm._read(str(Path(args.data_root) / folder)), None, False)
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/{key(c)}" for c in held["cvc_clinicdb"].case_ids()}
    return dm, held, ["kvasir_test"]


# folders each data set reads under --data-root (checked before anything is created)
REQUIRED = {
    "synthetic": (),
    "polyp": ("kvasir_seg", "cvc_clinicdb", "cvc_colondb", "etis_larib", "polypgen"),
    "polyp256": ("polyp_256/kvasir_seg", "polyp_256/cvc_clinicdb", "cvc_colondb", "etis_larib", "polypgen"),
    "pranet256": ("polyp_256/kvasir_seg", "polyp_256/cvc_clinicdb"),
    "acdc": ("acdc/volumes",),
}
SYNTHETIC_CASES = (
    40  # Kvasir stand-in (train / val / test), plus 12 "ClinicDB" frames in 3 sequences and 4 others
)


def build_synthetic(args, kw):
    """Procedural polyp frames shaped like ``polyp256`` (for the tiny grid and the tests, no data folder):
    a three-way split of :data:`SYNTHETIC_CASES` frames, a ``cvc_clinicdb`` stand-in of 12 frames in
    3 "sequences" of 4 (bootstrap clusters) and an ``etis`` stand-in of 4 (``other_ood``)."""
    from robusttrain.datamodules.polyp import PolypDataModule
    from robusttrain.datamodules.synthetic_polyp import SyntheticPolypSource

    dm = PolypDataModule(**kw)
    n, size, s = SYNTHETIC_CASES, args.size, args.data_seed
    src = SyntheticPolypSource(n, seed=s, image_size=size)
    tr, va, te = three_way_indices(
        [src.case_id(i) for i in range(n)], args.test_fraction, args.val_fraction, s
    )
    dm.train_dataset, dm.val_dataset = dm._view(src, tr, True), dm._view(src, va, False)
    held = {"kvasir_test": dm._view(src, te, False)}
    held["cvc_clinicdb"] = dm._view(SyntheticPolypSource(12, s + 1, size, start=n), None, False)
    held["etis"] = dm._view(SyntheticPolypSource(4, s + 2, size, start=n + 12), None, False)
    ids = held["cvc_clinicdb"].case_ids()
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/seq{i // 4:02d}" for i, c in enumerate(ids)}
    return dm, held, ["kvasir_test"]


def build_data(args):
    """(datamodule with train/val set up, {held-out name: dataset}, in-domain names)."""
    kw = dict(image_size=args.size, batch_size=args.batch_size, seed=args.data_seed, num_workers=0)
    data = Path(getattr(args, "data_root", None) or DATA)
    if args.dataset == "synthetic":
        return build_synthetic(args, kw)
    if args.dataset == "polyp256":
        return build_polyp256(args, kw)
    if args.dataset == "pranet256":
        return build_pranet256(args, kw)
    if args.dataset == "polyp":
        from robusttrain.datamodules.polyp import PolypDataModule

        dm = PolypDataModule(root=str(data / "kvasir_seg"), **kw)
        held = {"kvasir_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
        for name, folder in (
            ("cvc_clinicdb", "cvc_clinicdb"),
            ("cvc_colondb", "cvc_colondb"),
            ("etis", "etis_larib"),
        ):
            held[name] = dm._view(dm._read(str(data / folder)), None, False)
        held.update(polypgen_by_centre(dm, data / "polypgen"))
        return dm, held, ["kvasir_test"]
    from robusttrain.datamodules.acdc import ACDCDataModule

    dm = ACDCDataModule(root=str(data / "acdc" / "volumes"), **kw)
    held = {"acdc_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
    return dm, held, ["acdc_test"]


# ----------------------------------------------------------------------------------- recording
@torch.no_grad()
def per_case_dice(model, dataset, class_names, batch_size: int = 16) -> list[dict]:
    """Clean per-case Dice (volume sums over a case's slices), one row per case."""
    from torch.utils.data import DataLoader

    from robusttrain.metamorphic.scoring import dice_from_sums, logits_sums

    dev = next(model.parameters()).device
    sums: dict[str, np.ndarray] = {}
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        logits = model(batch["image"].to(dev)).float().cpu()
        for cid, s in zip(batch["case_id"], logits_sums(logits, batch["mask"])):
            sums[cid] = sums.get(cid, 0) + s
    return [
        {"case_id": cid, **{f"dice_{c}": float(v) for c, v in zip(class_names, dice_from_sums(s))}}
        for cid, s in sums.items()
    ]


def make_recorder(class_names: list[str], weights_dir: Path | None = None):
    from lightning.pytorch import Callback

    class EpochRecorder(Callback):
        """After every fitting validation: validation loss, clean per-case validation Dice and a CPU
        copy of the weights (so any epoch picked at the end can be evaluated on held-out data).

        With ``weights_dir`` the weights go to ``epoch=NNN.pt`` files (atomic) instead of memory, and
        rows / losses / training seconds travel in the Lightning checkpoint: a killed run resumes."""

        def __init__(self):
            self.rows: list[dict] = []
            self.val_loss: dict[int, float] = {}
            self.weights: dict[int, dict] = {}
            self.train_seconds = 0.0
            self._t = None

        def on_train_epoch_start(self, trainer, pl_module):
            self._t = time.time()

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking or trainer.state.fn != "fit":
                return
            epoch = int(trainer.current_epoch)
            self.val_loss[epoch] = float(trainer.callback_metrics["val/loss"])
            was = pl_module.training
            pl_module.eval()
            try:
                self.rows = [r for r in self.rows if r["epoch"] != epoch]
                self.rows += [
                    {"split": "val", "epoch": epoch, **r}
                    for r in per_case_dice(pl_module, trainer.datamodule.val_dataset, class_names)
                ]
            finally:
                pl_module.train(was)
            state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            if weights_dir is None:
                self.weights[epoch] = state
            else:
                from benchmarks.evidence.artifacts import save_weights

                save_weights(weights_dir / f"epoch={epoch:03d}.pt", state, epoch=epoch)
            if self._t is not None:
                self.train_seconds += time.time() - self._t
                self._t = None
            val_dice = float(
                np.mean(
                    [np.mean([r[f"dice_{c}"] for c in class_names]) for r in self.rows if r["epoch"] == epoch]
                )
            )
            print(
                f"[evidence] epoch {epoch} val_loss={self.val_loss[epoch]:.4f} val_dice={val_dice:.4f} "
                f"train_s={self.train_seconds:.0f}",
                flush=True,
            )

        def epoch_weights(self, epoch: int) -> dict:
            if weights_dir is None:
                return self.weights[epoch]
            from benchmarks.evidence.artifacts import load_weights

            return load_weights(weights_dir / f"epoch={epoch:03d}.pt")

        def state_dict(self):
            return {
                "rows": self.rows,
                "val_loss": {str(k): v for k, v in self.val_loss.items()},
                "train_seconds": self.train_seconds,
            }

        def load_state_dict(self, state):
            self.rows = list(state["rows"])
            self.val_loss = {int(k): float(v) for k, v in state["val_loss"].items()}
            self.train_seconds = float(state.get("train_seconds", 0.0))

    return EpochRecorder()


# ----------------------------------------------------------------------------------- Evidence v4
# the archive of every follow-up's Dice (per case, test and scored checkpoint): a re-analysis needs no re-run
FOLLOWUP_COLUMNS = ("policy", "split", "case_id", "perturbation", "severity", "src_dice", "fol_dice")
KEPT_FP16 = ("least_loss", "last")  # the checkpoints kept as fp16 state dicts (seed 0 committed)
KEPT_FP16_V5 = ("least_loss", "ema")  # v5: the two checkpoints its decisions rest on (seeds 0, 1 committed)


def v4_condition_kwargs(cond: str, v5: bool = False) -> dict:
    """What the v4 (v5) condition trains with (recorded in config.yaml and result.json)."""
    from benchmarks.evidence.conditions import V4_MINED, V4_MT, v4_dose, v5_condition_kwargs

    if v5:
        return v5_condition_kwargs(cond)
    if cond == "mined_dose":
        return {"failure_mining": dict(V4_MINED), "dose": v4_dose(cond)}
    if cond in V4_MT:
        return {"metamorphic_training": dict(V4_MT[cond]), "dose": v4_dose(cond)}
    return {"dose": 0.0}


def run_model(run: RunState, feats) -> dict:
    """The SegmentationModule keywords of a run besides its data's (v5: the condition's model, fixed by the
    protocol; earlier protocols: BasicUNet with ``--features`` / ``--lr`` / ``--lr-tail``)."""
    if run.v5:
        from benchmarks.evidence.conditions import v5_model

        return v5_model(run.cond)
    tail = {"lr_tail": run.args.lr_tail} if getattr(run.args, "lr_tail", 0.0) > 0 else {}  # v3: no lr_tail
    return {"lr": run.args.lr, "features": feats, **tail}


def v4_family_sets(args, cond: str, perts: list[str], test_fams: list[str]) -> dict:
    """The families a v4 run trains on and is tested on: held-out = test families no v4 condition
    ever draws (``--perturbations`` + every condition's extra suites); in-family = the rest."""
    from benchmarks.evidence.conditions import V4_CONDITIONS, V5_CONDITIONS, v4_training_families
    from robusttrain.perturbations.suites import resolve

    v5 = getattr(args, "protocol", "v3") == "v5"
    trained_anywhere: set[str] = set()
    for c in V5_CONDITIONS if v5 else V4_CONDITIONS:
        try:
            trained_anywhere |= set(v4_training_families(c, perts))
        except ValueError:  # a suite not in this library (yet) holds no family of the test suite either
            continue
    requested = resolve(args.test_perturbations.split(","))
    return {
        "training_families": v4_training_families(cond, perts),
        "test_families": list(test_fams),
        "heldout_families": [f for f in test_fams if f not in trained_anywhere],
        "infamily_families": [f for f in test_fams if f in trained_anywhere],
        "test_families_skipped": [f for f in requested if f not in test_fams],  # do not run on RGB
    }


# ----------------------------------------------------------------------------------- one run
def per_case_mr(cases: pd.DataFrame) -> dict:
    """``{split: {case: {tests, errors_<m>@<t>, corrupted_dice, errors_dice@0.25_by_perturbation}}}``
    from the audit's per-test rows (a drop counts relative to the clean source score)."""
    from robusttrain.metamorphic.records import relative_drops

    mr: dict = {}
    for (split, cid), g in cases.groupby(["split", "case_id"], sort=False):
        d = {"tests": int(len(g)), "corrupted_dice": round(float(g["fol_dice"].mean()), 6)}
        for m in ("dice", "iou"):
            drop = relative_drops(g[f"src_{m}"], g[f"fol_{m}"])  # one home for the relative drop
            for t in THRESHOLDS:
                d[f"errors_{m}@{t:g}"] = int((drop > t).sum())
        by = g.groupby("perturbation")
        d["errors_dice@0.25_by_perturbation"] = {
            p: int((relative_drops(gp["src_dice"], gp["fol_dice"]) > 0.25).sum()) for p, gp in by
        }
        # v4: the per-family follow-up Dice (held-out vs in-family and worst-family endpoints)
        d["fol_dice_by_perturbation"] = {p: round(float(gp["fol_dice"].mean()), 6) for p, gp in by}
        mr.setdefault(split, {})[cid] = d
    return mr


@dataclass
class RunState:
    """One (condition, seed) run as the protocol steps fill it in: :func:`train_run` sets the data,
    callbacks, model and trainer; :func:`pick_checkpoints` the validation picks and weight averages;
    :func:`score_heldout` the held-out Dice of every pick; :func:`score_mr` the MR suite's follow-ups;
    :func:`write_run` turns it into ``result.json`` and the run's artifacts."""

    cond: str
    seed: int
    args: argparse.Namespace
    run_dir: Path
    v3: bool
    v4: bool  # v4 or later: the held-out family sets, per-follow-up archive, fp16 weights
    device: str
    v5: bool = False  # Evidence v5: the condition picks the model; EMA scored beside least_loss
    resume_from: str | None = None
    # train_run
    dm: Any = None
    held: dict = field(default_factory=dict)
    names: list = field(default_factory=list)
    n_train_cases: int = 0
    n_val_cases: int = 0
    sevs: tuple = ()
    mt: dict | None = None
    cbs: list = field(default_factory=list)
    test_fams: list = field(default_factory=list)
    v4_sets: dict = field(default_factory=dict)
    feats: tuple = ()
    rec: Any = None
    ema: Any = None
    model: Any = None
    trainer: Any = None
    train_s: float = 0.0
    # pick_checkpoints
    cols: list = field(default_factory=list)
    losses: dict = field(default_factory=dict)
    least: int = -1
    trade: Any = None
    choices: dict = field(default_factory=dict)
    cohort: Any = None
    extra_weights: dict = field(default_factory=dict)
    averages: dict = field(default_factory=dict)
    # score_heldout
    t1: float = 0.0
    need: list = field(default_factory=list)
    held_rows: Any = None
    picks: dict = field(default_factory=dict)
    # score_mr
    suite: Any = None
    efr_pols: list = field(default_factory=list)
    mr_by: dict = field(default_factory=dict)
    mr: dict = field(default_factory=dict)
    consistency: float = 0.0
    followups: list = field(default_factory=list)
    # score_curve (v5)
    curve: dict = field(default_factory=dict)


def run_one(cond: str, seed: int, args_dict: dict) -> dict:
    """Train one (condition, seed), pick every checkpoint on validation, report on held-out data.

    The protocol's steps, in order: :func:`train_run` (fit), :func:`pick_checkpoints` (validation
    only), :func:`score_heldout` (clean per-case Dice of every pick), :func:`score_mr` (the fixed MR
    suite at the ``--efr-policies`` picks), :func:`write_run` (``result.json`` and artifacts).

    With ``--resume``: a finished run (``result.json``) is read back; an interrupted one (v3: its
    ``fit/last.ckpt``, written after every epoch) continues from its last epoch."""
    args = argparse.Namespace(**args_dict)
    v5 = getattr(args, "protocol", "v3") == "v5"
    v4 = getattr(args, "protocol", "v3") == "v4" or v5
    # the v3 machinery (resumable fit, per-epoch weights, averages, kept checkpoints) serves v4 / v5 too
    v3 = args.dataset in ("polyp256", "pranet256", "synthetic") or v4
    device = "cuda" if getattr(args, "accelerator", "cpu") == "gpu" else "cpu"
    profile = int(getattr(args, "profile_steps", 0) or 0)
    run_dir = dataset_dir(args) / ("profile" if profile else "") / f"{cond}_s{seed}"
    done = run_dir / "result.json"
    if args.resume and done.is_file():  # finished by an earlier, interrupted invocation
        return json.loads(done.read_text())
    run = RunState(cond=cond, seed=seed, args=args, run_dir=run_dir, v3=v3, v4=v4, device=device, v5=v5)
    profiled = train_run(run, profile)
    if profiled is not None:  # timing only (--profile-steps): nothing is scored or tabled
        return profiled
    pick_checkpoints(run)
    score_heldout(run)
    score_mr(run)
    if v5:
        score_curve(run)
    return write_run(run)


def train_run(run: RunState, profile: int = 0) -> dict | None:
    """Step 1, train: a fresh (or resumed) run folder, the seeded data and split, the condition's
    callbacks, the validation recorder (and, v3/v4, the EMA beside it, the resumable ``fit/`` checkpoint
    and ``config.yaml``), the model, then ``trainer.fit``.

    Returns the timing record of a ``--profile-steps`` run (nothing else happens to it), else None.
    Refuses (``SystemExit``) a BatchNorm model under v3/v4 and a run that stopped before its last epoch."""
    import lightning.pytorch as L

    from benchmarks.evidence.conditions import MT_CONDITIONS, MT_DEFAULTS, training_callbacks, usable_families
    from robusttrain.models.segmentation import SegmentationModule

    args, cond, seed, run_dir, v3, v4 = run.args, run.cond, run.seed, run.run_dir, run.v3, run.v4
    torch.set_num_threads(args.threads)
    last_ckpt = run_dir / "fit" / "last.ckpt"
    resume_from = str(last_ckpt) if (v3 and args.resume and last_ckpt.is_file()) else None
    if run_dir.exists() and resume_from is None:  # a fresh failure bank per run
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(seed, workers=True)
    dm, held, _ = build_data(args)
    names = dm.class_names
    n_train_cases, n_val_cases = len(dm.train_dataset.case_ids()), len(dm.val_dataset.case_ids())
    perts = usable_families(args.perturbations.split(","), dm.in_channels)
    sevs = tuple(int(s) for s in args.severities.split(","))
    mining = {
        k: getattr(args, k)
        for k in ("jitter", "fresh_image", "clean_mix")
        if getattr(args, k, None) is not None
    }
    mt = {"q": args.q} if getattr(args, "q", None) is not None else None
    common = dict(
        seed=args.data_seed,
        ratio=args.ratio,
        probe=args.probe,
        mine_every=args.mine_every,
        run_dir=str(run_dir),
        val_every=getattr(args, "mr_every", 0),
        val_cases=getattr(args, "mr_val_cases", None),
        train_seed=seed,
    )
    if v4:  # the pre-registered conditions (conditions.V4_* / V5_*): no per-invocation overrides
        from benchmarks.evidence.conditions import v4_callbacks, v5_callbacks

        cbs, _ = (v5_callbacks if run.v5 else v4_callbacks)(cond, dm, perts, sevs, **common)
        test_fams = usable_families(args.test_perturbations.split(","), dm.in_channels)
        v4_sets = v4_family_sets(args, cond, perts, test_fams)
    else:
        cbs, _ = training_callbacks(cond, dm, perts, sevs, mining=mining, mt=mt, **common)
        test_fams, v4_sets = perts, {}
    feats = tuple(int(f) for f in args.features.split(","))
    rec = make_recorder(names, run_dir / "epochs" if v3 else None)
    extra = []
    ema = None
    if v3:
        from lightning.pytorch.callbacks import ModelCheckpoint

        from benchmarks.evidence.artifacts import write_config

        # top_k=1 (the latest epoch): Lightning writes last.ckpt only in a step that saved a checkpoint
        extra = [ModelCheckpoint(dirpath=run_dir / "fit", save_last=True, save_top_k=1, every_n_epochs=1)]
        from benchmarks.evidence.averages import EMATracker

        decay = args.ema_decay
        if v4:  # sized to the run: a half-life of --ema-half-life of the run's optimiser steps
            from benchmarks.evidence.averages import ema_decay_for

            steps = args.epochs * len(dm.train_dataloader())
            decay = ema_decay_for(steps, args.ema_half_life)
        ema = EMATracker(decay=decay)  # watches the run, never swaps into it (averages.py)
        extra.append(ema)
        kw = {**MT_DEFAULTS, **(mt or {}), **MT_CONDITIONS[cond]} if cond in MT_CONDITIONS else None
        if v4:
            kw = {"condition": v4_condition_kwargs(cond, run.v5), **v4_sets}
        write_config(run_dir, args, cond, seed, feats, test_fams, sevs, kw, model=run_model(run, feats))
    if run.v5:  # paired seeds: one model's init (decoder, or all of it) is the same in every condition
        torch.manual_seed(seed)
    model = SegmentationModule(
        in_channels=dm.in_channels, num_classes=dm.num_classes, class_names=names, **run_model(run, feats)
    )
    if run.v5:  # ... and every condition, either model, sees the same data order
        L.seed_everything(seed, workers=True)
    if v3 and not run.v5:  # v5's EMA and averages carry the BatchNorm buffers (PROTOCOL.md)
        from benchmarks.evidence.averages import has_batchnorm

        # refused before training: its averages' BatchNorm statistics would need re-estimating
        if has_batchnorm(model):
            raise SystemExit(
                "evidence: the balanced average / EMA of a BatchNorm model is not supported here"
            )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        callbacks=[*cbs, rec, *extra],
        logger=False,
        default_root_dir=run_dir,
        enable_checkpointing=bool(extra),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator=getattr(args, "accelerator", "cpu"),
        devices=1,
        deterministic=False,
        precision=getattr(args, "precision", "32-true"),
        max_steps=profile or -1,
        profiler="simple" if profile else None,
    )
    t0 = time.time()
    trainer.fit(model, datamodule=dm, ckpt_path=resume_from)
    if profile:  # timing only (--profile-steps): nothing is scored or tabled
        seconds = time.time() - t0
        print(
            f"[evidence] profile {cond}_s{seed}, {profile} steps, {seconds:.1f} s\n{trainer.profiler.summary()}",
            flush=True,
        )
        return {"condition": cond, "seed": seed, "profiled_steps": profile, "seconds": seconds}
    if trainer.interrupted or int(trainer.current_epoch) < args.epochs:  # never score a half-trained run
        raise SystemExit(
            f"evidence: {cond}_s{seed} stopped at epoch {trainer.current_epoch} of {args.epochs} "
            "(interrupted); run again with --resume to continue it"
        )
    run.train_s = rec.train_seconds if v3 else time.time() - t0
    run.resume_from, run.dm, run.held, run.names = resume_from, dm, held, names
    run.n_train_cases, run.n_val_cases, run.sevs, run.mt, run.cbs = n_train_cases, n_val_cases, sevs, mt, cbs
    run.test_fams, run.v4_sets, run.feats, run.rec, run.ema = test_fams, v4_sets, feats, rec, ema
    run.model, run.trainer = model, trainer
    return None


def pick_checkpoints(run: RunState) -> None:
    """Step 2, choose on validation only: the least-validation-loss epoch, every policy of
    ``policy_tradeoff`` (last, last_inlier, maximin, pareto, cvar), the best validation Dice, and (v3/v4)
    the two weight averages (balanced average over the window, the EMA) beside them."""
    from robusttrain.cornercases.tradeoff import policy_tradeoff

    args, rec, names = run.args, run.rec, run.names
    rows = pd.DataFrame(rec.rows)
    cols = [f"dice_{c}" for c in names]
    rows["dice"] = rows[cols].mean(axis=1)
    val = rows
    losses = {e: v for e, v in rec.val_loss.items() if np.isfinite(v)}
    least = min(losses, key=lambda e: (losses[e], e))  # ties → earliest, like ModelCheckpoint
    trade = policy_tradeoff(
        val[["case_id", "epoch", *cols]],
        reference_epoch=least,
        min_epoch=args.min_epoch,
        contamination=args.contamination,
        worst_fraction=args.worst_fraction,
    )
    choices = dict(trade.choices)
    cohort = val.groupby("epoch")["dice"].mean()
    choices["best_val_dice"] = int(max(cohort.index, key=lambda e: (round(float(cohort[e]), 12), e)))
    # the two weight averages (issue 21 §5), evaluated like the picked epochs, reported against "last"
    extra_weights: dict[str, dict] = {}
    averages: dict[str, dict] = {}
    if run.v3:
        from benchmarks.evidence.averages import balanced_average

        flags = trade.selections["last_inlier"].outlier_epochs
        validated = sorted(rec.val_loss)  # the product's window: over every validated epoch
        # SWAD-style (issue 30): with a constant-LR tail, the window is the tail's epochs
        window = args.lr_tail if getattr(args, "lr_tail", 0.0) > 0 else args.average_window
        extra_weights["balanced_average"], averages["balanced_average"] = balanced_average(
            rec.epoch_weights, validated, flags, window=window
        )
        extra_weights["ema"] = run.ema.weights()
        averages["ema"] = {"decay": run.ema.decay, "steps": int(run.trainer.global_step)}
    run.cols, run.losses, run.least, run.trade, run.choices, run.cohort = cols, losses, least, trade, choices, cohort
    run.extra_weights, run.averages = extra_weights, averages


def score_heldout(run: RunState) -> None:
    """Step 3, report on held-out data: the clean per-case Dice of every pick (``--heldout-curve``:
    of every validated epoch) and of the weight averages, from the weights kept for that epoch."""
    args, rec, model, names, cols, held = run.args, run.rec, run.model, run.names, run.cols, run.held
    run.t1 = time.time()
    need = sorted(rec.val_loss) if args.heldout_curve else sorted(set(run.choices.values()))
    held_rows = []
    model.to(run.device).eval()
    for e in need:
        model.load_state_dict(rec.epoch_weights(e))
        for split, ds in held.items():
            held_rows += [{"split": split, "epoch": e, **r} for r in per_case_dice(model, ds, names)]
    held_rows = pd.DataFrame(held_rows)
    held_rows["dice"] = held_rows[cols].mean(axis=1)
    picks = {}
    for pol, e in run.choices.items():
        at = held_rows[held_rows["epoch"] == e]
        picks[pol] = {
            "epoch": int(e),
            "val_cohort": float(run.cohort[e]),
            "val_worst_k": float(run.trade.table["cvar"].get(e, np.nan)) if e in run.trade.table.index else None,
            "dice": {s: dict(zip(g["case_id"], g["dice"].round(6))) for s, g in at.groupby("split")},
        }
    for pol, weights in run.extra_weights.items():  # the weight averages
        model.load_state_dict(weights)
        picks[pol] = {
            "epoch": None,
            "average": run.averages[pol],
            "dice": {
                s: {
                    r["case_id"]: round(float(np.mean([r[c] for c in cols])), 6)
                    for r in per_case_dice(model, ds, names)
                }
                for s, ds in held.items()
            },
        }
    run.need, run.held_rows, run.picks = need, held_rows, picks


def score_mr(run: RunState) -> None:
    """Step 4, EFR on the held-out sets: one fixed MR suite (seeded by ``--data-seed``, the same for
    every run) audited at every ``--efr-policies`` pick (v2: least_loss only), per case; checks that the
    audit's clean source scores are the pick's own (``audit_clean_max_abs_diff``); v4 keeps every
    follow-up's Dice for ``followups.csv.gz``."""
    from robusttrain.metamorphic.audit import audit
    from robusttrain.metamorphic.suite import MRSuite

    args, model = run.args, run.model
    suite = MRSuite(run.test_fams, run.sevs, seed=args.data_seed)
    efr_pols = getattr(args, "efr_policies", "least_loss").split(",")
    mr_by: dict = {}
    consistency = 0.0
    followups = []
    for pol in efr_pols:
        model.load_state_dict(
            run.extra_weights[pol] if pol in run.extra_weights else run.rec.epoch_weights(run.choices[pol])
        )
        res = audit(
            model,
            run.held,
            suite,
            out_dir=None,
            device=run.device,
            batch_size=16,
            path="torch" if run.device == "cuda" else "numpy",
            class_names=run.names,
            max_cases=getattr(args, "efr_cases", None),
        )
        cases = res["cases"]
        mr_by[pol] = per_case_mr(cases)
        # the audit's clean source scores must be the pick's own (same weights, same data)
        src = cases.groupby(["split", "case_id"])["src_dice"].first()
        ref = pd.Series({(sp, c): d for sp, by in run.picks[pol]["dice"].items() for c, d in by.items()}).reindex(
            src.index
        )
        consistency = max(consistency, float((src - ref).abs().max()))
        if run.v4:
            followups.append(cases[list(FOLLOWUP_COLUMNS[1:])].assign(policy=pol))
    run.suite, run.efr_pols, run.mr_by, run.mr = suite, efr_pols, mr_by, mr_by[efr_pols[0]]
    run.consistency, run.followups = consistency, followups


def score_curve(run: RunState) -> None:
    """Step 4b (v5, the check's validity across a run's epochs): at every ``--curve-every``-th epoch
    (and the last), the clean Dice of every held-out split and the MR suite on a fixed, seeded subset of
    ``--curve-cases`` validation cases -- the in-domain check a user runs during training -- from the
    weights kept for that epoch. The follow-ups go into ``followups.csv.gz`` as checkpoint
    ``epoch=N`` (split ``val``); ``result.json``'s ``curve`` holds the per-epoch numbers."""
    from robusttrain.metamorphic.audit import audit

    args, model, cols, names = run.args, run.model, run.cols, run.names
    every = int(args.curve_every)
    epochs = sorted(run.rec.val_loss)
    picked = [e for e in epochs if (e + 1) % every == 0 or e == epochs[-1]]
    fams = set(run.v4_sets["heldout_families"])
    curve: dict = {}
    model.to(run.device).eval()
    for e in picked:
        model.load_state_dict(run.rec.epoch_weights(e))
        clean = {
            split: float(np.mean([np.mean([r[c] for c in cols]) for r in per_case_dice(model, ds, names)]))
            for split, ds in run.held.items()
        }
        res = audit(
            model,
            {"val": run.dm.val_dataset},
            run.suite,
            out_dir=None,
            device=run.device,
            batch_size=16,
            path="torch" if run.device == "cuda" else "numpy",
            class_names=names,
            max_cases=args.curve_cases,
        )
        cases = res["cases"]
        held = cases["perturbation"].isin(fams)
        from robusttrain.metamorphic.records import relative_drops

        curve[str(e)] = {
            "clean": {k: round(v, 6) for k, v in clean.items()},
            "val_clean_dice": round(float(cases.groupby("case_id")["src_dice"].first().mean()), 6),
            "val_heldout_dice": round(float(cases.loc[held, "fol_dice"].mean()), 6),
            "val_infamily_dice": round(float(cases.loc[~held, "fol_dice"].mean()), 6),
            "val_efr": round(float((relative_drops(cases["src_dice"], cases["fol_dice"]) > 0.25).mean()), 6),
            "val_cases": int(cases["case_id"].nunique()),
        }
        run.followups.append(cases[list(FOLLOWUP_COLUMNS[1:])].assign(policy=f"epoch={e}"))
    run.curve = curve


def write_run(run: RunState) -> dict:
    """Step 5, write: the trade-off plots and tables (validation and held-out), the per-run record
    ``result.json`` (atomic: its presence marks the run finished), and, v3/v4, the picked checkpoints,
    the re-score script and (v4) ``followups.csv.gz`` and the fp16 weights. Returns the record."""
    from benchmarks.evidence.conditions import MT_CONDITIONS, MT_DEFAULTS
    from robusttrain.cornercases import epoch_table
    from robusttrain.cornercases.tradeoff import Tradeoff
    from robusttrain.reporting.plots import plot_tradeoff, save_png

    args, cond, seed, run_dir, rec, choices = run.args, run.cond, run.seed, run.run_dir, run.rec, run.choices
    trade, held_rows, mr, dm, model = run.trade, run.held_rows, run.mr, run.dm, run.model
    # trade-off plots: the validation picks drawn on validation and on the pooled held-out cases
    save_png(plot_tradeoff(trade), run_dir / "tradeoff_val.png")
    hist_h = held_rows.assign(case_id=held_rows["split"] + "/" + held_rows["case_id"])
    h_tab = epoch_table(hist_h, run.cols, [], args.worst_fraction)
    save_png(
        plot_tradeoff(Tradeoff(h_tab, choices, {}, args.worst_fraction)), run_dir / "tradeoff_heldout.png"
    )
    h_tab.to_csv(run_dir / "tradeoff_heldout.csv")
    trade.table.to_csv(run_dir / "tradeoff_val.csv")
    out = {
        "condition": cond,
        "seed": seed,
        "train_seconds": round(run.train_s, 1),
        "heldout_seconds": round(time.time() - run.t1, 1),
        "heldout_epochs": run.need,
        "optimizer_steps": int(run.trainer.global_step),
        "train_samples_per_epoch": len(dm.train_dataset),
        "n_train_cases": run.n_train_cases,
        "n_val_cases": run.n_val_cases,
        "n_held_out_cases": {s: len(v) for s, v in mr.items()},
        "least_loss_epoch": run.least,
        "val_loss": run.losses,
        "choices": choices,
        "picks": run.picks,
        "mr": mr,
        "tests": [list(t) for t in run.suite.tests],
        "audit_clean_max_abs_diff": run.consistency,
        "selection_reasons": {p: s.reason for p, s in trade.selections.items()},
    }
    if run.v4:
        from benchmarks.evidence.artifacts import save_fp16, write_followups

        write_followups(run_dir / "followups.csv.gz", run.followups, FOLLOWUP_COLUMNS)
        for pol in KEPT_FP16_V5 if run.v5 else KEPT_FP16:  # committed for seed 0 (v5: 0, 1; archive.py)
            averaged = pol in run.extra_weights
            save_fp16(
                run_dir / "fp16" / f"{pol}.ckpt",
                run.extra_weights[pol] if averaged else rec.epoch_weights(choices[pol]),
                run_dir / "config.yaml",
                **({} if averaged else {"epoch": int(choices[pol])}),
                policy=pol,
            )
        out.update(
            protocol="v5" if run.v5 else "v4",
            condition_kwargs=v4_condition_kwargs(cond, run.v5),
            **run.v4_sets,
        )
        if run.v5:
            out.update(
                curve=run.curve,
                params=sum(p.numel() for p in model.parameters()),
                pretrained_weights=getattr(model, "pretrained_weights", None),  # file + sha256 it started from
            )
        out["ema_decay"] = run.ema.decay
    if run.v3:
        from benchmarks.evidence.artifacts import save_weights, write_rescore

        for pol, e in choices.items():  # the checkpoints of the tables, loadable by the product's CLI
            save_weights(
                run_dir / "checkpoints" / f"{pol}.ckpt", rec.epoch_weights(e), epoch=int(e), policy=pol
            )
        for pol, weights in run.extra_weights.items():
            save_weights(run_dir / "checkpoints" / f"{pol}.ckpt", weights, policy=pol)
        net = run_model(run, run.feats)
        write_rescore(
            run_dir,
            args,
            net.get("features"),
            sorted([*choices, *run.extra_weights]),
            net.get("network", "basic_unet"),
        )
        out.update(
            mr_by_policy=run.mr_by,
            efr_policies=run.efr_pols,
            clusters={f"{s}/{c}": g for (s, c), g in dm.clusters.items()},
            n_held_out_cases={s: len(ds) for s, ds in run.held.items()},
            n_efr_cases={s: len(v) for s, v in mr.items()},
            params=sum(p.numel() for p in model.parameters()),
            resumed=run.resume_from is not None,
            run_dir=str(run_dir),
        )
        if cond in MT_CONDITIONS:
            out["mt_kwargs"] = {**MT_DEFAULTS, **(run.mt or {}), **MT_CONDITIONS[cond]}
    if run.v5 and cond == "pretrained_steer":  # mining v2: the bank of conditions and the per-epoch steering
        from robusttrain.callbacks import FailureMiningCallback

        mining = next(cb for cb in run.cbs if isinstance(cb, FailureMiningCallback))
        out.update(conditions_bank=len(mining.conditions), mining_rows=mining.rows)
    elif cond in ("mined", "mined_dose"):
        bank = run.cbs[-1].bank
        out.update(
            bank_size=len(bank),
            trainable=len(bank.trainable()),
            distinct_cases=len({r.case_id for r in bank.trainable()}),
        )
    from robusttrain.io import atomic_write_text

    atomic_write_text(run_dir / "result.json", json.dumps(out, default=float))
    print(
        json.dumps(
            {
                k: out[k]
                for k in (
                    "condition",
                    "seed",
                    "train_seconds",
                    "heldout_seconds",
                    "least_loss_epoch",
                    "choices",
                    "audit_clean_max_abs_diff",
                )
            }
        ),
        flush=True,
    )
    return out


def _run_star(job):
    return run_one(*job)


# ----------------------------------------------------------------------------------- summary
class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit 2 (no usage block above them)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v

    return parse


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {v}")
    return v


def _seeds(text: str) -> str:
    """``0,1,2`` -> the same text; every item a distinct integer >= 0, at least one."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 (e.g. 0,1,2), got {text!r}")
    if len(set(map(int, items))) != len(items):
        raise argparse.ArgumentTypeError(f"a seed is named twice in {text!r}")
    return ",".join(str(int(t)) for t in items)


POLICIES = ("least_loss", "last", "best_val_dice", "last_inlier", "maximin", "pareto", "cvar")
AVERAGE_POLICIES = ("balanced_average", "ema")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Every value the runs will need, checked before any folder is created (one line, exit 2)."""
    from benchmarks.evidence.conditions import CONDITIONS, V4_CONDITIONS, V5_CONDITIONS

    known = {"v4": V4_CONDITIONS, "v5": V5_CONDITIONS}.get(args.protocol, CONDITIONS)
    conds = args.conditions.split(",")
    bad = [c for c in conds if c not in known]
    if bad or not args.conditions:
        ap.error(
            f"--conditions: unknown {bad[0] if bad else ''!r} for --protocol {args.protocol}; "
            f"expected a comma list of {', '.join(known)}"
        )
    if len(set(conds)) != len(conds):
        ap.error(f"--conditions names a condition twice: {args.conditions!r}")
    if args.protocol in ("v4", "v5") and args.dataset not in ("polyp256", "synthetic"):
        ap.error(
            f"--protocol {args.protocol} runs on --dataset polyp256 (or synthetic for a dry run), got {args.dataset}"
        )
    if args.protocol == "v5":
        # the model and its schedule come with the condition (conditions.V5_MODELS): an override would be unused
        for flag in ("features", "lr", "lr_tail", "probe", "mine_every"):
            if getattr(args, flag) != ap.get_default(flag):
                ap.error(
                    f"--{flag.replace('_', '-')} does not apply to --protocol v5 (each condition's model, "
                    "schedule and mining are fixed in conditions.V5_MODELS / V5_STEER)"
                )
        from benchmarks.evidence.conditions import V5_MODELS

        args.lr_tail = float(V5_MODELS["pretrained"]["lr_tail"])  # both models' (the averages' window)
    if args.report_only:
        return
    if not 0.0 <= args.lr_tail < 1.0:
        ap.error(f"--lr-tail {args.lr_tail}: expected a fraction in [0, 1) (0 = no constant-LR tail)")
    if args.lr_tail > 0:
        import inspect

        from robusttrain.models.segmentation import SegmentationModule

        if "lr_tail" not in inspect.signature(SegmentationModule.__init__).parameters:
            ap.error(
                f"--lr-tail {args.lr_tail}: this library's SegmentationModule has no lr_tail (issue 30's "
                "averages not merged); --lr-tail 0 trains v3's plain cosine"
            )
    if not args.profile_steps and args.min_epoch >= args.epochs:
        # the balanced policies would have no epoch to choose from (and the run dies after training)
        ap.error(f"--min-epoch {args.min_epoch} must be below --epochs {args.epochs}")
    v3 = args.dataset in ("polyp256", "pranet256", "synthetic") or args.protocol in ("v4", "v5")
    allowed = POLICIES + (AVERAGE_POLICIES if v3 else ())
    bad = [p for p in args.efr_policies.split(",") if p not in allowed]
    if bad:
        ap.error(f"--efr-policies: unknown {bad[0]!r}; expected a comma list of {', '.join(allowed)}")
    try:
        [int(f) for f in args.features.split(",")]
        [int(v) for v in args.severities.split(",")]
    except ValueError:
        ap.error(
            f"--features / --severities: expected comma-separated integers, got "
            f"{args.features!r} / {args.severities!r}"
        )
    root = Path(args.data_root)
    missing = [f for f in REQUIRED[args.dataset] if not (root / f).is_dir()]
    if missing:
        ap.error(
            f"--data-root {root}: no {missing[0]}/ there (--dataset {args.dataset} reads "
            f"{', '.join(f + '/' for f in REQUIRED[args.dataset])} under it)"
        )
    from robusttrain.perturbations.suites import resolve

    for flag, spec in (
        ("--perturbations", args.perturbations),
        ("--test-perturbations", args.test_perturbations),
    ):
        try:
            resolve(spec.split(","))
        except (ValueError, TypeError, KeyError) as e:
            ap.error(f"{flag} {spec!r}: {str(e).strip().splitlines()[0]}")
    if args.protocol in ("v4", "v5"):
        # the v4 / v5 conditions are pre-registered (conditions.V4_* / V5_*): an override would be unused
        for flag in ("q", "jitter", "fresh_image", "clean_mix"):
            if getattr(args, flag) is not None:
                ap.error(
                    f"--{flag.replace('_', '-')} does not apply to --protocol {args.protocol} (its conditions "
                    "are fixed in conditions.py)"
                )
        check_v4_conditions(ap, args, conds)


def check_v4_conditions(ap, args, conds) -> None:
    """Every v4 condition constructs with today's library (the MetamorphicTraining API of issue 30, the
    shift families), and no held-out test family is drawn in training."""
    from benchmarks.evidence.conditions import (
        V4_MT,
        V4_RANDOM,
        V5_STEER,
        V5_TRAINING,
        v4_training_families,
        v5_model,
    )
    from robusttrain.callbacks import MetamorphicTraining
    from robusttrain.models.segmentation import SegmentationModule
    from robusttrain.perturbations.suites import resolve

    perts = args.perturbations.split(",")
    trained = set()
    for c in conds:
        try:
            fams = v4_training_families(c, perts)
            if args.protocol == "v4" and c in V4_MT:
                MetamorphicTraining(perturbations=fams, severity_caps=4, **V4_MT[c])
            if args.protocol == "v5":  # its model builds (the pretrained weights verified) and it trains
                SegmentationModule(in_channels=3, num_classes=2, **v5_model(c))
                if V5_TRAINING[c] != "plain":
                    MetamorphicTraining(perturbations=fams, severity_caps=4, **V4_RANDOM)
                if V5_TRAINING[c] == "steer":  # mining v2's callback takes the protocol's settings
                    from robusttrain.callbacks import FailureMiningCallback

                    FailureMiningCallback(mode="steer", **V5_STEER)
        except (ValueError, TypeError, KeyError) as e:
            ap.error(
                f"condition {c!r} does not construct with this library: {str(e).strip().splitlines()[0]}"
            )
        trained |= set(fams)
    test = resolve(args.test_perturbations.split(","))
    if not [f for f in test if f not in trained and f not in resolve(perts)]:
        ap.error(
            f"--test-perturbations {args.test_perturbations!r}: no family held out from training "
            f"(every one is drawn by a condition)"
        )


def main(argv=None) -> dict:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dataset",
        choices=["polyp", "acdc", "polyp256", "pranet256", "synthetic"],
        required=True,
        help="polyp256 = Evidence v3 (issue 22): train on Kvasir-SEG (polyp_256), CVC-ClinicDB held out; "
        "pranet256 = the GPU protocol: train on Kvasir-SEG + CVC-ClinicDB (split by sequence); "
        "synthetic = procedural frames shaped like polyp256 (tiny dry runs, no data folder)",
    )
    ap.add_argument(
        "--protocol",
        choices=["v3", "v4", "v5"],
        default="v3",
        help="v4 = Evidence v4 (issue 34, docs/evidence_v4/PROTOCOL.md): its conditions (conditions.V4_*), "
        "the held-out test families, per-follow-up archive, fp16 weights; v5 = Evidence v5 (issue 45, "
        "docs/evidence_v5/PROTOCOL.md): conditions.V5_* (each picks its model), the check's curve",
    )
    ap.add_argument(
        "--curve-every",
        type=_int_at_least(1),
        default=5,
        help="v5: score every N-th epoch (and the last) on the held-out splits and the MR suite on "
        "--curve-cases validation cases (the check's validity across epochs)",
    )
    ap.add_argument(
        "--curve-cases", type=_int_at_least(1), default=32, help="v5: validation cases of the curve's MR suite"
    )
    ap.add_argument(
        "--test-perturbations",
        default=None,
        help="v4: the MR test suite (suites or families; default endoscopy,endoscopy_heldout); families no "
        "condition trains on are the held-out ones",
    )
    ap.add_argument(
        "--ema-half-life",
        type=_fraction,
        default=0.05,
        help="v4: the EMA's half-life as a fraction of the run's optimiser steps (sets the decay; 0.05 = "
        "the product's EMACheckpoint default)",
    )
    ap.add_argument(
        "--lr-tail",
        type=float,
        default=0.0,
        help="constant-LR tail over the last fraction of the epochs (SegmentationModule(lr_tail=), issue 30; "
        "0 = v3's cosine); v4: the balanced average's window is then the tail",
    )
    ap.add_argument(
        "--data-root",
        default=str(DATA),
        help="folder holding polyp_256/, cvc_colondb/, ... "
        "(the GPU machine: .gpudata from benchmarks/gpu/pack.py)",
    )
    ap.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--precision", default="32-true", help="Lightning precision (GPU: bf16-mixed)")
    ap.add_argument("--seeds", type=_seeds, default="0,1,2", help="training seeds")
    ap.add_argument("--conditions", default="plain,random,mined")
    ap.add_argument("--epochs", type=_int_at_least(1), default=30)
    ap.add_argument(
        "--size", type=_int_at_least(16), default=128, help="training / evaluation image size (px)"
    )
    ap.add_argument("--features", default="16,16,32,64,128,16", help="MONAI BasicUNet widths")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=_int_at_least(1), default=8)
    ap.add_argument("--test-fraction", type=float, default=None, help="held-out share (polyp 0.25, acdc 0.3)")
    ap.add_argument(
        "--val-fraction", type=float, default=None, help="validation share (polyp 0.15, acdc 0.3)"
    )
    ap.add_argument(
        "--perturbations",
        default="",
        help="suite name or comma list of families; '' = endoscopy (polyp) / mri (acdc)",
    )
    ap.add_argument("--severities", default="2,4")
    ap.add_argument("--ratio", type=float, default=0.2, help="extra slots per epoch (all conditions)")
    ap.add_argument("--probe", type=int, default=32, help="training cases probed for failures (mined)")
    ap.add_argument("--mine-every", type=int, default=1, help="probe every N epochs (mined)")
    for flag in ("jitter", "fresh-image", "clean-mix"):
        ap.add_argument(
            f"--{flag}",
            type=float,
            default=None,
            help=f"FailureMiningCallback {flag.replace('-', '_')} (mined; default: conditions.MINING_DEFAULTS)",
        )
    ap.add_argument(
        "--q", type=float, default=None, help="MetamorphicTraining dose (MT conditions; default 0.5)"
    )
    ap.add_argument(
        "--mr-every",
        type=int,
        default=0,
        help="MetamorphicCallback validation check every N epochs (0 = never; it steers the MT families)",
    )
    ap.add_argument("--mr-val-cases", type=int, default=None, help="validation cases the check probes")
    ap.add_argument("--efr-policies", default="least_loss", help="checkpoints scored with the MR suite")
    ap.add_argument(
        "--efr-cases",
        type=int,
        default=None,
        help="MR suite on a fixed seeded subset of at most N cases per held-out set (clean Dice on all)",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="summarise the finished runs of --conditions x --seeds under <out>/<dataset> (no training; "
        "runs of other conditions or seeds in the same folder stay out of the tables)",
    )
    ap.add_argument(
        "--check-only",
        action="store_true",
        help="check every argument (data folders, families, that the conditions construct) and exit",
    )
    ap.add_argument("--min-epoch", type=int, default=3, help="warm-up epochs the balanced policies skip")
    ap.add_argument(
        "--average-window", type=float, default=0.5, help="balanced average: last fraction of epochs"
    )
    ap.add_argument("--ema-decay", type=float, default=0.999, help="EMA decay per optimizer step")
    ap.add_argument("--contamination", type=float, default=0.1)
    ap.add_argument("--worst-fraction", type=float, default=0.1, help="k of the worst-k / cvar numbers")
    ap.add_argument("--data-seed", type=int, default=0, help="split + MR-suite seed (fixed)")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument(
        "--heldout-curve",
        action="store_true",
        help="evaluate every epoch on the held-out sets (trade-off curve), not only the picks",
    )
    ap.add_argument("--jobs", type=_int_at_least(1), default=1, help="runs in parallel (processes)")
    ap.add_argument("--threads", type=_int_at_least(1), default=1, help="torch threads per run")
    ap.add_argument("--out", default="runs/evidence")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="reuse <out>/<dataset>/<cond>_s<seed>/result.json of runs that already finished",
    )
    ap.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="time N training steps of each run with Lightning's SimpleProfiler (where a step's time goes: "
        "data, hooks, forward, backward); runs one at a time under <out>/<dataset>/profile/, nothing scored",
    )
    args = ap.parse_args(argv)
    defaults = SPLIT_FRACTIONS[args.dataset]
    args.test_fraction = defaults[0] if args.test_fraction is None else args.test_fraction
    args.val_fraction = defaults[1] if args.val_fraction is None else args.val_fraction
    args.perturbations = args.perturbations or ("mri" if args.dataset == "acdc" else "endoscopy")
    if args.test_perturbations is None:
        from benchmarks.evidence.conditions import V4_TEST_SUITE

        args.test_perturbations = ",".join(V4_TEST_SUITE) if args.protocol in ("v4", "v5") else args.perturbations
    check_args(ap, args)
    if args.check_only:
        print(f"evidence: arguments OK ({args.conditions} x seeds {args.seeds}, --dataset {args.dataset})")
        return {}

    jobs = [(c, int(s), vars(args)) for s in args.seeds.split(",") for c in args.conditions.split(",")]
    t0 = time.time()
    out = dataset_dir(args)
    if args.profile_steps:  # one after the other, never in parallel: each profile sees the device alone
        args.resume = False
        return {"profiles": [_run_star((c, s, vars(args))) for c, s, _ in jobs]}
    if args.report_only:  # exactly the named grid: later seeds in the same folder do not move its tables
        named = {(c, s) for c, s, _ in jobs}
        results = [r for r in finished(out) if (r["condition"], int(r["seed"])) in named]
        if not results:
            raise SystemExit(
                f"evidence: no finished run of {args.conditions} x seeds {args.seeds} under {out}"
            )
        return write_summary(results, args, out, time.time() - t0)
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(_run_star, jobs, chunksize=1)
    else:
        results = []
        for j in jobs:  # the tables are re-written after every run: partial results are readable
            results.append(_run_star(j))
            if args.dataset in ("polyp256", "pranet256") or args.protocol in ("v4", "v5"):
                write_summary(finished(out), args, out, time.time() - t0)
    if args.dataset in ("polyp256", "pranet256") or args.protocol in ("v4", "v5"):  # every finished run, also
        results = finished(out)  # other invocations' (grid processes share one --out: keep theirs)
    return write_summary(results, args, out, time.time() - t0)


def dataset_dir(args) -> Path:
    """``<out>/<dataset>`` (v4, v5: ``<out>/<dataset>_v4`` / ``_v5``: their condition names are not v3's)."""
    protocol = getattr(args, "protocol", "v3")
    return Path(args.out) / (args.dataset + (f"_{protocol}" if protocol in ("v4", "v5") else ""))


def finished(out: Path) -> list[dict]:
    """Every finished run (``result.json``) under ``out``, in (seed, condition) order."""
    rs = [json.loads(p.read_text()) for p in sorted(out.glob("*_s*/result.json"))]
    return sorted(rs, key=lambda r: (r["seed"], r["condition"]))


def write_summary(results: list[dict], args, out: Path, wall: float) -> dict:
    """``results.json`` (summary + per-run numbers) and ``results.md`` (tables), both atomic."""
    from robusttrain.io import atomic_write_text

    if getattr(args, "protocol", "v3") == "v5":
        from benchmarks.evidence.report_v5 import summarise_v5, write_tables_v5

        summary = summarise_v5(results, args)
        md = write_tables_v5(summary, args)
    elif getattr(args, "protocol", "v3") == "v4":
        from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

        summary = summarise_v4(results, args)
        md = write_tables_v4(summary, args)
    elif args.dataset in ("polyp256", "pranet256", "synthetic"):
        from benchmarks.evidence.report_v3 import summarise_v3, write_tables_v3

        summary = summarise_v3(results, args, out)
        md = write_tables_v3(summary, args)
    else:
        from benchmarks.evidence.report_v2 import summarise, write_tables

        summary = summarise(results, args)
        md = write_tables(summary, args)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"args": vars(args), "wall_seconds": round(wall, 1), "summary": summary, "results": results}
    atomic_write_text(out / "results.json", json.dumps(payload, indent=1, default=float))
    atomic_write_text(
        out / "summary.json", json.dumps({"args": vars(args), "summary": summary}, indent=1, default=float)
    )
    atomic_write_text(out / "results.md", md)
    print(md, flush=True)
    return payload


if __name__ == "__main__":
    main()
