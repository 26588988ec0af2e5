"""Error-finding rate (paper 000): a follow-up is an error when (src - fol) / src > t.

EFR = errors / test cases, per perturbation x severity x metric x threshold. Rows with
``severity == 0`` pool all severities of a perturbation; ``perturbation == "all"`` pools
every test case (these are the numbers logged as ``mr/efr/<perturbation>/<metric>@<t>``).

>>> import pandas as pd
>>> cases = pd.DataFrame({"perturbation": ["blur", "blur"], "severity": [2, 4],
...                       "src_dice": [0.8, 0.8], "fol_dice": [0.7, 0.2],
...                       "src_iou": [0.6, 0.6], "fol_iou": [0.5, 0.1]})
>>> t = efr_table(cases, thresholds=(0.25,))
>>> t[(t.severity == 0) & (t.metric == "dice")][["perturbation", "errors", "cases", "efr"]].values.tolist()
[['blur', 1, 2, 0.5], ['all', 1, 2, 0.5]]
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

THRESHOLDS = (0.25, 0.5)
EFR_COLUMNS = ["epoch", "split", "perturbation", "severity", "metric", "threshold",
               "errors", "cases", "efr"]


def relative_drops(src: np.ndarray, fol: np.ndarray) -> np.ndarray:
    """Vectorised :func:`robusttrain.metamorphic.records.relative_drop` (0 where src <= 0)."""
    src = np.asarray(src, dtype=np.float64)
    fol = np.asarray(fol, dtype=np.float64)
    return np.where(src > 0, (src - fol) / np.where(src > 0, src, 1.0), 0.0)


def is_error(src: np.ndarray, fol: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean array: the MR is violated at ``threshold``.

    >>> is_error([1.0, 1.0, 0.0], [0.74, 0.76, 0.0], 0.25).tolist()
    [True, False, False]
    """
    return relative_drops(src, fol) > threshold


def efr_table(cases: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS,
              metrics: Iterable[str] = ("dice", "iou")) -> pd.DataFrame:
    """EFR rows from one row per test case (``perturbation, severity, src_<m>, fol_<m>``).

    Returns columns ``perturbation, severity, metric, threshold, errors, cases, efr``;
    row order is perturbation (first appearance), severity (0 = pooled last), metric, t.
    """
    rows = []
    if len(cases) == 0:
        return pd.DataFrame(columns=EFR_COLUMNS[2:])
    perts = list(dict.fromkeys(cases["perturbation"]))
    groups: list[tuple[str, int, pd.DataFrame]] = []
    for p in perts:
        sub = cases[cases["perturbation"] == p]
        for s in sorted(set(int(v) for v in sub["severity"])):
            groups.append((p, s, sub[sub["severity"] == s]))
        groups.append((p, 0, sub))
    groups.append(("all", 0, cases))
    for p, s, sub in groups:
        for m in metrics:
            for t in thresholds:
                err = int(is_error(sub[f"src_{m}"].to_numpy(), sub[f"fol_{m}"].to_numpy(), t).sum())
                n = int(len(sub))
                rows.append({"perturbation": p, "severity": s, "metric": m, "threshold": float(t),
                             "errors": err, "cases": n, "efr": err / n if n else float("nan")})
    return pd.DataFrame(rows)


def efr_metrics(table: pd.DataFrame, prefix: str = "mr/efr") -> dict[str, float]:
    """The pooled-severity rows of an EFR table as logger keys ``<prefix>/<pert>/<metric>@<t>``."""
    pooled = table[table["severity"] == 0]
    return {f"{prefix}/{r.perturbation}/{r.metric}@{_fmt_t(r.threshold)}": float(r.efr)
            for r in pooled.itertuples()}


def _fmt_t(t: float) -> str:
    # 0.25 -> "0.25", 0.5 -> "0.5": the spelling used in the documented keys
    return f"{float(t):g}"


def format_efr_console(table: pd.DataFrame, title: str = "") -> str:
    """Compact text table: one row per perturbation (pooled severities), EFR in %."""
    pooled = table[table["severity"] == 0]
    if pooled.empty:
        return f"{title}(no metamorphic test cases)"
    wide = pooled.pivot_table(index="perturbation", columns=["metric", "threshold"],
                              values="efr", sort=False)
    wide.columns = [f"{m}@{_fmt_t(t)}" for m, t in wide.columns]
    n = pooled.groupby("perturbation", sort=False)["cases"].first()
    wide = (wide * 100).round(1)
    wide["cases"] = n
    return (title + "\n" if title else "") + wide.to_string()
