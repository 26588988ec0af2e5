"""Steps 3-4 of a run: the picks' clean held-out Dice, the fixed MR suite on held-out data and
(v5) the check's curve across epochs."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from benchmarks.evidence.run.protocol import FOLLOWUP_COLUMNS
from benchmarks.evidence.run.recorder import per_case_dice
from benchmarks.evidence.run.state import RunState

THRESHOLDS = (0.25, 0.5)


def per_case_mr(cases: pd.DataFrame) -> dict:
    """``{split: {case: {tests, errors_<m>@<t>, corrupted_dice, errors_dice@0.25_by_perturbation}}}``
    from the audit's per-test rows (a drop counts relative to the clean source score)."""
    from robusttrain.metamorphic.records import relative_drops

    mr: dict = {}
    for (split, cid), g in cases.groupby(["split", "case_id"], sort=False):
        d: dict = {"tests": int(len(g)), "corrupted_dice": round(float(g["fol_dice"].mean()), 6)}
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
            "val_worst_k": float(run.trade.table["cvar"].get(e, np.nan))
            if e in run.trade.table.index
            else None,
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
        ref = pd.Series(
            {(sp, c): d for sp, by in run.picks[pol]["dice"].items() for c, d in by.items()}
        ).reindex(src.index)
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
