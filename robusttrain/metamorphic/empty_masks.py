"""Per-case check scores, with the cases whose mask is empty scored apart.

On a case without a lesion (an empty mask) Dice is 0 for any false-positive pixel and 1 for none: a number
about false positives, not segmentation. Pooled into a Dice mean it silently drags it down (or up), and in
an EFR such a case "never fails" (0 -> 0). So ``check`` keeps these cases out of the Dice means and the
EFR, and reports them apart: the share where the model predicts nothing (specificity) and the predicted
(false-positive) area, clean and under each perturbation family.

>>> import torch
>>> from robusttrain.metamorphic.batch import ProbeBatch
>>> from robusttrain.metamorphic.runner import aggregate, run_probe
>>> from robusttrain.metamorphic.suite import MRSuite
>>> suite = MRSuite(["contrast"], severities=(2,)); suite.prepare(3)
>>> masks = torch.zeros(2, 16, 16, dtype=torch.long); masks[0, 4:8, 4:8] = 1   # case b: no lesion
>>> pb = ProbeBatch([0, 1], torch.rand(2, 3, 16, 16), masks, ["a", "b"], [0, 0])
>>> predict = lambda x: torch.cat([torch.ones_like(x[:, :1]), torch.zeros_like(x[:, :1])], 1)  # background
>>> res = run_probe(predict, [pb], suite, "val", path="torch")
>>> hist, cases = aggregate(res, ["fg"], 0, suite)
>>> per_case, followups = case_scores(res, hist, cases, suite)
>>> per_case[["case_id", "empty_mask", "lesion_px", "predicted_px", "dice"]].values.tolist()
[['a', False, 16, 0, 0.0], ['b', True, 0, 0, nan]]
>>> empty_summary(per_case, followups)[["perturbation", "cases", "predicted_nothing", "specificity"]].values.tolist()
[['clean', 1, 1, 1.0], ['contrast', 1, 1, 1.0], ['all', 1, 1, 1.0]]
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from .columns import CASE_COLUMNS, EMPTY_COLUMNS, FOLLOWUP_COLUMNS
from .runner import ProbeResult, _case_sums, case_order
from .suite import MRSuite


def case_scores(
    res: ProbeResult, hist: pd.DataFrame, cases: pd.DataFrame, suite: MRSuite, heldout: Collection[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per case: ``check_cases.csv``; one row per scored follow-up: ``check_followups.csv``) of one
    split, from :func:`~robusttrain.metamorphic.runner.aggregate`'s ``hist`` / ``cases`` and the result's
    integer sums; Dice / IoU are NaN on a case whose mask is empty (``empty_mask``)."""
    src, fol = _case_sums(res, res.src), _case_sums(res, res.fol)
    ids = case_order(res)
    lesion = {c: int(src[c][..., 2].sum()) for c in ids}
    per_case = hist.drop(columns=["epoch"], errors="ignore").copy()
    per_case.insert(0, "split", res.split)
    per_case.insert(2, "empty_mask", [lesion[str(c)] == 0 for c in per_case["case_id"]])
    per_case.insert(3, "lesion_px", [lesion[str(c)] for c in per_case["case_id"]])
    per_case.insert(4, "predicted_px", [int(src[str(c)][..., 1].sum()) for c in per_case["case_id"]])
    for m in ("dice", "iou"):
        cols = [c for c in hist.columns if c.startswith(f"{m}_")]
        per_case.insert(CASE_COLUMNS.index(m), m, per_case[cols].mean(axis=1).where(~per_case["empty_mask"]))
    index = {t: k for k, t in enumerate(suite.tests)}
    f = cases.drop(columns=["epoch"], errors="ignore").copy()
    empty = f["case_id"].map(lambda c: lesion[str(c)] == 0).astype(bool)
    f["empty_mask"] = empty
    f["heldout"] = f["perturbation"].isin(set(heldout))
    f["predicted_px"] = [
        int(fol[str(c)][index[(p, int(s))]][..., 1].sum())
        for c, p, s in zip(f["case_id"], f["perturbation"], f["severity"])
    ]
    for col in ("src_dice", "fol_dice", "src_iou", "fol_iou", "drop_dice", "drop_iou"):
        if col in f:
            f[col] = f[col].where(~empty)
    return per_case, f.reindex(columns=FOLLOWUP_COLUMNS)


def empty_summary(per_case: pd.DataFrame, followups: pd.DataFrame) -> pd.DataFrame:
    """``check_empty_frames.csv`` rows of one split: the empty-mask cases clean (``perturbation=clean``),
    under each family and under all (severities pooled: ``severity`` 0); no rows when there are none."""
    rows = []
    empty = per_case[per_case["empty_mask"]]
    if not len(empty):
        return pd.DataFrame(columns=EMPTY_COLUMNS)
    split = str(per_case["split"].iloc[0])
    fol = followups[followups["empty_mask"].astype(bool)]
    groups = [("clean", empty)]
    groups += [(str(p), fol[fol["perturbation"] == p]) for p in dict.fromkeys(fol["perturbation"])]
    groups += [("all", fol)] if len(fol) else []
    for name, part in groups:
        px = part["predicted_px"].astype(float)
        nothing = int((px == 0).sum())
        rows.append(
            {
                "split": split,
                "perturbation": name,
                "severity": 0,
                "cases": int(len(part)),
                "predicted_nothing": nothing,
                "specificity": nothing / len(part) if len(part) else float("nan"),
                "mean_predicted_px": float(px.mean()) if len(part) else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=EMPTY_COLUMNS)


def format_empty(summary: pd.DataFrame) -> str:
    """Markdown: the empty-mask cases' table (specificity %, mean predicted pixels); "" when none."""
    if not len(summary):
        return ""
    lines = [
        "### Cases whose mask is empty (no lesion): kept out of the Dice means and the EFR\n",
        "Specificity: the share of them where the model predicts no lesion pixel; predicted px: the mean "
        "false-positive area (pixels) per case; follow-up rows count (case, severity) pairs.\n",
        "| split | perturbation | cases | predicted nothing | specificity (%) | mean predicted px |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in summary.itertuples(index=False):
        lines.append(
            f"| {r.split} | {r.perturbation} | {r.cases} | {r.predicted_nothing} | "
            f"{100 * r.specificity:.1f} | {r.mean_predicted_px:.1f} |"
        )
    return "\n".join(lines) + "\n"
