"""Error-finding rate (paper 000): a follow-up is an error when (src - fol) / src > t.

EFR = errors / test cases, per perturbation x severity x metric x threshold. Rows with
``severity == 0`` pool all severities of a perturbation; ``perturbation == "all"`` pools
every test case (these are the numbers logged as ``mr/efr/<perturbation>/<metric>@<t>``).
Each row carries a 95 % Wilson interval (``efr_low``, ``efr_high``) so a check that scored
only a budgeted subset of the suite is honest about its uncertainty, and ``suite_cases``:
how many test cases the full suite has in that row (``cases / suite_cases`` = coverage).

>>> import pandas as pd
>>> cases = pd.DataFrame({"perturbation": ["blur", "blur"], "severity": [2, 4],
...                       "src_dice": [0.8, 0.8], "fol_dice": [0.7, 0.2],
...                       "src_iou": [0.6, 0.6], "fol_iou": [0.5, 0.1]})
>>> t = efr_table(cases, thresholds=(0.25,))
>>> t[(t.severity == 0) & (t.metric == "dice")][["perturbation", "errors", "cases", "efr"]].values.tolist()
[['blur', 1, 2, 0.5], ['all', 1, 2, 0.5]]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from .records import relative_drops

THRESHOLDS = (0.25, 0.5)
EFR_COLUMNS = [
    "epoch",
    "split",
    "perturbation",
    "severity",
    "metric",
    "threshold",
    "errors",
    "cases",
    "efr",
    "efr_low",
    "efr_high",
    "suite_cases",
    "final",
    "basis",
    "from_epoch",
]
# what efr_table returns (the callback adds epoch, split, final, basis, from_epoch)
TABLE_COLUMNS = EFR_COLUMNS[2:-3]


def wilson_interval(errors: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``errors / n`` (95 % for ``z=1.96``).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n errors,
    which matters for the small per-perturbation counts of a budgeted check. ``n == 0``: NaNs.

    >>> [round(v, 3) for v in wilson_interval(2, 10)]
    [0.057, 0.51]
    >>> [round(v, 3) for v in wilson_interval(0, 20)]
    [0.0, 0.161]
    """
    if n <= 0:
        return float("nan"), float("nan")
    if not 0 <= errors <= n:
        raise ValueError(f"wilson_interval: errors must lie in 0..n={n}, got {errors}")
    p, z2 = errors / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # clip: floating error may put a bound a hair outside [0, 1] at 0 or n errors
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def is_error(src: np.ndarray, fol: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean array: the MR is violated at ``threshold``.

    >>> is_error([1.0, 1.0, 0.0], [0.74, 0.76, 0.0], 0.25).tolist()
    [True, False, False]
    """
    return relative_drops(src, fol) > threshold


def efr_table(
    cases: pd.DataFrame,
    thresholds: Sequence[float] = THRESHOLDS,
    metrics: Iterable[str] = ("dice", "iou"),
    suite_cases: int | None = None,
) -> pd.DataFrame:
    """EFR rows from one row per test case (``perturbation, severity, src_<m>, fol_<m>``).

    Returns columns ``perturbation, severity, metric, threshold, errors, cases, efr, efr_low,
    efr_high, suite_cases``; row order is perturbation (first appearance), severity (0 = pooled
    last), metric, t. ``suite_cases``: the number of probe cases the full suite tests under each
    (perturbation, severity); None = ``cases`` (the whole suite was scored).
    """
    rows = []
    if len(cases) == 0:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    perts = list(dict.fromkeys(cases["perturbation"]))
    groups: list[tuple[str, int, pd.DataFrame]] = []
    for p in perts:
        sub = cases[cases["perturbation"] == p]
        for s in sorted(set(int(v) for v in sub["severity"])):
            groups.append((p, s, sub[sub["severity"] == s]))
        groups.append((p, 0, sub))
    groups.append(("all", 0, cases))
    n_tests = {p: len(set(int(v) for v in cases.loc[cases["perturbation"] == p, "severity"])) for p in perts}
    for p, s, sub in groups:
        n = int(len(sub))
        # strata in the full suite behind this row: one (p, s), all severities of p, or every test
        strata = 1 if s else n_tests[p] if p != "all" else sum(n_tests.values())
        full = n if suite_cases is None else int(suite_cases) * strata
        for m in metrics:
            for t in thresholds:
                err = int(is_error(sub[f"src_{m}"].to_numpy(), sub[f"fol_{m}"].to_numpy(), t).sum())
                lo, hi = wilson_interval(err, n)
                rows.append(
                    {
                        "perturbation": p,
                        "severity": s,
                        "metric": m,
                        "threshold": float(t),
                        "errors": err,
                        "cases": n,
                        "efr": err / n if n else float("nan"),
                        "efr_low": lo,
                        "efr_high": hi,
                        "suite_cases": max(full, n),
                    }
                )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def efr_key(perturbation: str, metric: str, threshold: float, prefix: str = "mr/efr") -> str:
    """The logger key of one pooled EFR: ``<prefix>/<perturbation>/<metric>@<t>`` (the one spelling).

    >>> efr_key("blur", "dice", 0.25), efr_key("all", "iou", 0.5, prefix="mr/train_efr")
    ('mr/efr/blur/dice@0.25', 'mr/train_efr/all/iou@0.5')
    """
    return f"{prefix}/{perturbation}/{metric}@{_fmt_t(threshold)}"


def efr_metrics(table: pd.DataFrame, prefix: str = "mr/efr") -> dict[str, float]:
    """The pooled-severity rows of an EFR table as logger keys (:func:`efr_key`)."""
    pooled = table[table["severity"] == 0]
    return {
        efr_key(str(r.perturbation), str(r.metric), float(r.threshold), prefix): float(r.efr)
        for r in pooled.itertuples()
    }


def _fmt_t(t: float) -> str:
    # 0.25 -> "0.25", 0.5 -> "0.5": the spelling used in the documented keys
    return f"{float(t):g}"


def format_efr_console(table: pd.DataFrame, title: str = "") -> str:
    """Compact text table: one row per perturbation (pooled severities), EFR in %."""
    pooled = table[table["severity"] == 0]
    if pooled.empty:
        return f"{title}(no metamorphic test cases)"
    wide = pooled.pivot_table(index="perturbation", columns=["metric", "threshold"], values="efr", sort=False)
    wide.columns = [f"{m}@{_fmt_t(t)}" for m, t in wide.columns]
    n = pooled.groupby("perturbation", sort=False)["cases"].first()
    wide = (wide * 100).round(1)
    wide["cases"] = n
    return (title + "\n" if title else "") + wide.to_string()
