"""Step 5 of a run: ``result.json`` and the run's artifacts."""

from __future__ import annotations

import json
import time

from benchmarks.evidence.run.protocol import (
    FOLLOWUP_COLUMNS,
    KEPT_FP16,
    KEPT_FP16_V5,
    run_model,
    v4_condition_kwargs,
)
from benchmarks.evidence.run.state import RunState


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
                pretrained_weights=getattr(
                    model, "pretrained_weights", None
                ),  # file + sha256 it started from
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
            run_dir=str(run_dir.relative_to(args.out)),  # under --out: no machine path in the record
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
