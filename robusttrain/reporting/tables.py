"""Tables the report and the console show, read off the run directory's frames (no analysis).

>>> import pandas as pd
>>> efr = pd.DataFrame({"epoch": [0, 1, 1, 1], "split": "val", "perturbation": ["blur"] * 4,
...                     "severity": 2, "metric": ["dice", "dice", "iou", "dice"],
...                     "threshold": [0.5, 0.5, 0.5, 0.25], "errors": [3, 1, 2, 4], "cases": 10,
...                     "efr": 0.0})
>>> t = efr_tables(efr)[0.5]
>>> t[[("val", "Dice"), ("val", "IoU")]].astype(float).round(1).to_dict("index")
{'blur': {('val', 'Dice'): 10.0, ('val', 'IoU'): 20.0}, 'All': {('val', 'Dice'): 10.0, ('val', 'IoU'): 20.0}}
>>> t.loc["All", ("val", "perturbed Dice")]  # this file predates the Dice columns
'not recorded'
"""

from __future__ import annotations

import pandas as pd

from robusttrain.metamorphic.efr import pool_families
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir.corner_cases import Corners
from robusttrain.rundir.history import dice_columns

METRIC_LABEL = {"dice": "Dice", "iou": "IoU"}


DICE = "perturbed Dice"  # mean Dice (%) on the perturbed images, beside the rates
WORST, WORST_DICE = "worst family", "worst family Dice"
HELD = ("", "held out")  # the column marking test-only families (only when some are held out)
GROUPS = {"held-out families": True, "trained families": False}


def efr_tables(efr: pd.DataFrame, epoch: int | None = None) -> dict[float, pd.DataFrame]:
    """EFR (%) in the paper's layout, one table per threshold (largest first, as in its Tables 2–9),
    with the absolute numbers a rate can hide beside it.

    Rows: perturbation (file order, pooled ``All`` last; when some families are held out, their pool
    and the trained families' pool before it); columns: (split, Dice/IoU) EFR, (split, perturbed Dice)
    = mean Dice (%) on the perturbed images and, on the pooled rows, (split, worst family) with its
    (split, worst family Dice); ``("", "held out")`` marks test-only families when there are any.
    Severities are pooled as errors / cases. ``epoch`` defaults to the last epoch in the file. An old
    ``efr.csv`` without the Dice columns shows ``not recorded`` there.
    """
    epoch = int(efr["epoch"].max()) if epoch is None else epoch
    frame = efr_file.with_endpoints(efr[(efr["epoch"] == epoch) & (efr["perturbation"] != "all")])
    order = list(dict.fromkeys(frame["perturbation"]))
    per = efr_file.pool_severities(frame)
    held = set(per.loc[per["heldout"].astype(bool), "perturbation"])
    groups = {g: h for g, h in GROUPS.items() if held}
    pools = [
        per[per["perturbation"].isin([p for p in order if (p in held) == h])].assign(perturbation=g)
        for g, h in groups.items()
    ] + [per.assign(perturbation="All")]
    pooled = [
        part.groupby(["split", "metric", "threshold", "perturbation"])[["errors", "cases"]]
        .sum()
        .reset_index()
        for part in pools
    ]
    both = pd.concat([per, *pooled], ignore_index=True)
    both["efr"] = 100.0 * both["errors"] / both["cases"].where(both["cases"] > 0)
    both["metric"] = both["metric"].map(lambda m: METRIC_LABEL.get(m, m))
    index = order + list(groups) + ["All"]
    recorded = bool(per["mean_fol_dice"].notna().any())
    tables = {}
    for t, sub in both.groupby("threshold"):
        table = sub.pivot_table(
            index="perturbation", columns=["split", "metric"], values="efr", aggfunc="first", dropna=False
        )
        for split in dict.fromkeys(sub["split"]):
            fams = per[(per["split"] == split) & (per["threshold"] == t)]
            if len(fams):  # the Dice is the same in every metric's rows: one metric's
                fams = fams[fams["metric"] == fams["metric"].iloc[0]].drop_duplicates("perturbation")
            dice = (100 * fams.set_index("perturbation")["mean_fol_dice"].astype(float)).reindex(index)
            worst = pd.Series(None, index=index, dtype=object)
            worst_dice = pd.Series(float("nan"), index=index)
            for g, part in [
                ("All", fams),
                *((g, fams[fams["heldout"].astype(bool) == h]) for g, h in groups.items()),
            ]:
                stats = pool_families(part)
                dice[g] = 100 * float(stats["mean_fol_dice"])  # type: ignore[arg-type]
                worst[g] = stats["worst_family"]
                worst_dice[g] = 100 * float(stats["worst_family_dice"])  # type: ignore[arg-type]
            if not recorded:  # an efr.csv from before these columns: say so, not a blank
                dice = pd.Series(efr_file.NOT_RECORDED, index=index, dtype=object)
                worst_dice = worst_dice.astype(object)
                worst["All"] = worst_dice["All"] = efr_file.NOT_RECORDED
            table[(split, DICE)], table[(split, WORST)], table[(split, WORST_DICE)] = dice, worst, worst_dice
        if held:
            table[HELD] = pd.Series({p: "yes" if p in held or GROUPS.get(p) else "" for p in index})
            table = table[[HELD] + [c for c in table.columns if c != HELD]]
        tables[float(t)] = table.reindex([p for p in index if p in table.index])
    return dict(sorted(tables.items(), reverse=True))


def last_efr_by_perturbation(efr: pd.DataFrame, metric: str = "dice") -> pd.DataFrame:
    """The console's compact table: EFR (%) at the last epoch, rows perturbation, columns t, and the
    mean perturbed Dice (%) beside them (``held out`` marks test-only families)."""
    tables = efr_tables(efr)
    label = METRIC_LABEL.get(metric, metric)
    cols = {}
    for t, table in tables.items():
        picked = [c for c in table.columns if c[1] == label]
        if picked:
            cols[f"t={t:g}"] = pd.to_numeric(table[picked[0]], errors="coerce")
    if tables:
        table = next(iter(tables.values()))
        dice = [c for c in table.columns if c[1] == DICE]
        if dice:
            cols[DICE] = table[dice[0]]
        if HELD in table.columns:
            cols["held out"] = table[HELD]
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


def corner_console_table(history: pd.DataFrame | None, corners: Corners) -> pd.DataFrame:
    """The flagged cases as the reporter prints them each epoch: case, ECOD score, outlier epochs and the
    mean Dice now (the history's latest epoch); just the cases without a history."""
    table = (
        corner_case_table(history, corners) if history is not None else pd.DataFrame({"case": corners.cases})
    )
    now = history[history["epoch"] == history["epoch"].max()] if history is not None else None
    if now is not None:
        dice_now = now.set_index("case_id")[dice_columns(now)].mean(axis=1)
        table["dice now"] = [round(float(dice_now.get(c, float("nan"))), 3) for c in table["case"]]
    return table[[c for c in ("case", "ECOD score", "outlier epochs", "dice now") if c in table]]


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
