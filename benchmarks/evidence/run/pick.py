"""Step 2 of a run: every checkpoint choice, on validation only."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.evidence.run.state import RunState


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
    run.cols, run.losses, run.least, run.trade, run.choices, run.cohort = (
        cols,
        losses,
        least,
        trade,
        choices,
        cohort,
    )
    run.extra_weights, run.averages = extra_weights, averages
