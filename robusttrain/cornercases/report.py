"""Text report for ``python -m robusttrain corners RUN_DIR_OR_HISTORY_CSV [policy=...]``.

The least-loss epoch comes from ``corner_cases.json`` (BalancedCheckpoint), else the smallest
``val/loss`` / ``val_loss`` in a ``metrics.csv`` under the run directory, else it is unknown
(corner cases are then found at the last epoch and no gain is reported).

>>> import pandas as pd
>>> rows = [{"case_id": f"p{c}", "epoch": e, "dice_lv": 0.5 + 0.04 * e} for c in range(6) for e in range(8)]
>>> rows[-1]["dice_lv"] = 0.05
>>> print(corners_report(pd.DataFrame(rows), least_loss_epoch=7).splitlines()[3])
balanced epoch (last_inlier): 6
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.rundir import corner_cases as corners_file
from robusttrain.rundir.csv_table import read_csv

from .balanced import select_balanced_epoch
from .history import load_history, metric_columns, resolve_history_path

LOSS_COLUMNS = ("val/loss", "val_loss")
METRICS_FILES = ("metrics.csv", "logs/metrics.csv", "lightning_logs/version_0/metrics.csv")


def least_loss_from_run(run_dir: Path) -> tuple[int | None, str]:
    """(epoch, where it came from) — ``(None, "unknown")`` when the run dir has no record of it."""
    saved = corners_file.read_raw(run_dir) or {}
    if saved.get("least_loss_epoch") is not None:
        return int(saved["least_loss_epoch"]), corners_file.NAME
    for name in METRICS_FILES:  # known places only: a shared run directory is not walked
        df = read_csv(run_dir, name)
        if df is None:
            continue
        col = next((c for c in LOSS_COLUMNS if c in df.columns), None)
        if col is None or "epoch" not in df.columns:
            continue
        df = df.dropna(subset=[col])
        if len(df):
            # idxmin returns the first minimum: ties go to the earliest epoch, like ModelCheckpoint
            return int(df.loc[df[col].idxmin(), "epoch"]), f"{name}:{col}"
    return None, "unknown"


def _fmt(v: float | None) -> str:
    return "   n/a" if v is None or pd.isna(v) else f"{v:6.3f}"


def _gain(a: float | None, b: float | None) -> str:
    return "    n/a" if a is None or b is None or pd.isna(a) or pd.isna(b) else f"{b - a:+7.3f}"


def corners_report(
    path_or_history: str | os.PathLike | pd.DataFrame,
    policy: str = "last_inlier",
    contamination: float = 0.1,
    tail: str = "low",
    metric: str = "dice",
    least_loss_epoch: int | None = None,
    min_epoch: int | None = None,
    worst_fraction: float | None = None,
) -> str:
    """The flagged cases with their Dice at the least-loss and balanced epochs, and the gain.

    ``min_epoch`` / ``worst_fraction`` (the ``cvar`` policy's share of worst cases) None → the value in
    ``corner_cases.json`` (so the report matches the callback), else 0 / 0.1.
    """
    run_dir, candidates, source = None, None, "least_loss_epoch argument"
    if isinstance(path_or_history, pd.DataFrame):
        h, name = load_history(path_or_history), "<DataFrame>"
    else:
        hp = resolve_history_path(path_or_history)
        h, name, run_dir = load_history(hp), str(path_or_history), hp.parent
        saved = corners_file.read_raw(run_dir)
        if saved is not None:  # only epochs whose weights were kept can be balanced.ckpt
            candidates = saved.get("candidate_epochs") or None
            if min_epoch is None:
                min_epoch = int(saved.get("min_epoch") or 0)
            if worst_fraction is None:
                worst_fraction = saved.get("worst_fraction")
    min_epoch = 0 if min_epoch is None else int(min_epoch)
    worst_fraction = 0.1 if worst_fraction is None else worst_fraction
    if least_loss_epoch is None:
        least_loss_epoch, source = least_loss_from_run(run_dir) if run_dir else (None, "unknown")
    cols = metric_columns(h, metric)
    epochs = set(h["epoch"].tolist())
    ref = least_loss_epoch if least_loss_epoch in epochs else None
    sel = select_balanced_epoch(
        h,
        policy,
        reference_epoch=ref,
        candidates=candidates,
        contamination=contamination,
        tail=tail,
        metric=metric,
        min_epoch=min_epoch,
        worst_fraction=worst_fraction,
    )
    cc = sel.corner_cases
    lines = [
        f"corner-case report: {name}",
        f"history: {h['case_id'].nunique()} cases x {len(epochs)} epochs; columns {', '.join(cols)}",
        f"least-loss epoch: {'unknown' if least_loss_epoch is None else least_loss_epoch} ({source})",
        f"balanced epoch ({policy}): {sel.epoch}",
        f"status: {sel.status} - {sel.reason}",
        f"corner cases at epoch {cc.epoch} (ECOD tail={tail}, contamination={contamination}): "
        f"{len(cc.case_ids)} flagged"
        + (f", threshold {cc.threshold:.3f}" if cc.threshold is not None else ""),
    ]
    mean = h.assign(mean=h[cols].mean(axis=1)).set_index(["epoch", "case_id"])
    la, lb = (f"@{least_loss_epoch}" if least_loss_epoch is not None else "@?"), f"@{sel.epoch}"

    def val(epoch, case, col):
        return mean[col].get((epoch, case)) if epoch is not None else None

    if cc.case_ids:
        lines += [
            "",
            f"{'case':<22}{'score':>7}  {'dice' + la:>9}  {'dice' + lb:>9}  {'gain':>7}  outlier epochs",
        ]
        for c in cc.case_ids:
            a, b = val(least_loss_epoch, c, "mean"), val(sel.epoch, c, "mean")
            lines.append(
                f"{c:<22}{cc.scores[c]:7.2f}  {_fmt(a):>9}  {_fmt(b):>9}  {_gain(a, b)}  "
                f"{sel.outlier_epochs.get(c, [])}"
            )
            for col in cols:
                a, b = val(least_loss_epoch, c, col), val(sel.epoch, c, col)
                lines.append(f"  {col:<27}  {_fmt(a):>9}  {_fmt(b):>9}  {_gain(a, b)}")
    lines += ["", "cohort mean (all cases):"]
    for col in [*cols, "mean"]:
        a = mean[col].xs(least_loss_epoch, level="epoch").mean() if least_loss_epoch in epochs else None
        b = mean[col].xs(sel.epoch, level="epoch").mean() if sel.epoch is not None else None
        lines.append(f"  {col:<27}  {_fmt(a):>9}  {_fmt(b):>9}  {_gain(a, b)}")
    return "\n".join(lines)
