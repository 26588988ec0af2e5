"""Tables the report and the console show, read off the run directory's frames (no analysis).

>>> import pandas as pd
>>> efr = pd.DataFrame({"epoch": [0, 1, 1, 1], "split": "val", "perturbation": ["blur"] * 4,
...                     "severity": 2, "metric": ["dice", "dice", "iou", "dice"],
...                     "threshold": [0.5, 0.5, 0.5, 0.25], "errors": [3, 1, 2, 4], "cases": 10,
...                     "efr": 0.0})
>>> efr_tables(efr)[0.5].round(1).to_dict("index")
{'blur': {('val', 'Dice'): 10.0, ('val', 'IoU'): 20.0}, 'All': {('val', 'Dice'): 10.0, ('val', 'IoU'): 20.0}}
"""

from __future__ import annotations

import pandas as pd

from robusttrain.rundir import efr as efr_file
from robusttrain.rundir.corner_cases import Corners
from robusttrain.rundir.history import dice_columns

METRIC_LABEL = {"dice": "Dice", "iou": "IoU"}


def efr_tables(efr: pd.DataFrame, epoch: int | None = None) -> dict[float, pd.DataFrame]:
    """EFR (%) in the paper's layout, one table per threshold (largest first, as in its Tables 2–9).

    Rows: perturbation (file order, pooled ``All`` last); columns: (split, Dice/IoU). Severities
    are pooled as errors / cases. ``epoch`` defaults to the last epoch in the file.
    """
    epoch = int(efr["epoch"].max()) if epoch is None else epoch
    frame = efr[(efr["epoch"] == epoch) & (efr["perturbation"] != "all")]
    order = list(dict.fromkeys(frame["perturbation"]))
    per = efr_file.pool_severities(frame)
    pooled = per.groupby(["split", "metric", "threshold"])[["errors", "cases"]].sum().reset_index()
    pooled["perturbation"] = "All"
    both = pd.concat([per, pooled], ignore_index=True)
    both["efr"] = 100.0 * both["errors"] / both["cases"].where(both["cases"] > 0)
    both["metric"] = both["metric"].map(lambda m: METRIC_LABEL.get(m, m))
    tables = {}
    for t, sub in both.groupby("threshold"):
        table = sub.pivot_table(
            index="perturbation", columns=["split", "metric"], values="efr", aggfunc="first", dropna=False
        )
        tables[float(t)] = table.reindex([p for p in order + ["All"] if p in table.index])
    return dict(sorted(tables.items(), reverse=True))


def last_efr_by_perturbation(efr: pd.DataFrame, metric: str = "dice") -> pd.DataFrame:
    """The console's compact table: EFR (%) at the last epoch, rows perturbation, columns t."""
    tables = efr_tables(efr)
    label = METRIC_LABEL.get(metric, metric)
    cols = {}
    for t, table in tables.items():
        picked = [c for c in table.columns if c[1] == label]
        if picked:
            cols[f"t={t:g}"] = table[picked[0]]
    return pd.DataFrame(cols)


def corner_case_table(history: pd.DataFrame, corners: Corners) -> pd.DataFrame:
    """Per flagged case: score, outlier epochs and per-class Dice at least-loss vs balanced epoch."""
    cols = dice_columns(history)
    rows = []
    for cid in corners.cases:
        row: dict[str, object] = {"case": cid}
        if cid in corners.scores:
            row["ECOD score"] = round(corners.scores[cid], 3)
        row["outlier epochs"] = ", ".join(map(str, corners.outlier_epochs.get(cid, []))) or "-"
        case = history[history["case_id"] == cid].set_index("epoch")
        for label, ep in (("least-loss", corners.least_loss_epoch), ("balanced", corners.balanced_epoch)):
            for col in cols:
                if ep is not None and ep in case.index:
                    row[f"{col} @ {label}"] = round(float(case.loc[ep, col]), 3)
        rows.append(row)
    return pd.DataFrame(rows)


def epoch_comparison(history: pd.DataFrame, corners: Corners) -> pd.DataFrame:
    """Cohort-mean and worst-corner-case mean Dice at the least-loss vs the balanced epoch."""
    cols = dice_columns(history)
    score = history.assign(mean_dice=history[cols].mean(axis=1))
    rows = []
    for label, ep in (("least-loss", corners.least_loss_epoch), ("balanced", corners.balanced_epoch)):
        at = score[score["epoch"] == ep] if ep is not None else score.iloc[:0]
        flagged = at[at["case_id"].isin(corners.cases)]
        rows.append(
            {
                "checkpoint": label,
                "epoch": "-" if ep is None else ep,
                "cohort mean Dice": round(float(at["mean_dice"].mean()), 4) if len(at) else None,
                "corner-case mean Dice": round(float(flagged["mean_dice"].mean()), 4)
                if len(flagged)
                else None,
                "worst corner-case Dice": round(float(flagged["mean_dice"].min()), 4)
                if len(flagged)
                else None,
            }
        )
    return pd.DataFrame(rows)
