"""Error-finding rate (paper 000): a follow-up is an error when (src - fol) / src > t.

EFR = errors / test cases, per perturbation x severity x metric x threshold. Rows with
``severity == 0`` pool all severities of a perturbation; ``perturbation == "all"`` pools
every test case (these are the numbers logged as ``mr/efr/<perturbation>/<metric>@<t>``).
Each row carries a 95 % Wilson interval (``efr_low``, ``efr_high``) so a check that scored
only a budgeted subset of the suite is honest about its uncertainty, and ``suite_cases``:
how many test cases the full suite has in that row (``cases / suite_cases`` = coverage).

A rate can hide the absolute number (a model that segments less has less to lose), so every row also
carries the Dice it rests on: ``mean_fol_dice`` (mean Dice on the perturbed images of the row's test
cases) and ``mean_src_dice`` (their clean Dice); the ``all`` rows name the ``worst_family`` -- the
family with the lowest mean perturbed Dice, severities pooled -- and its ``worst_family_dice``.
``heldout`` is True for a family that training never draws (a test-only family,
``MetamorphicCallback(heldout=...)``); ``all`` pools every family, held out or not (False).

>>> import pandas as pd
>>> cases = pd.DataFrame({"perturbation": ["blur", "blur"], "severity": [2, 4],
...                       "src_dice": [0.8, 0.8], "fol_dice": [0.7, 0.2],
...                       "src_iou": [0.6, 0.6], "fol_iou": [0.5, 0.1]})
>>> t = efr_table(cases, thresholds=(0.25,))
>>> t[(t.severity == 0) & (t.metric == "dice")][["perturbation", "errors", "cases", "efr"]].values.tolist()
[['blur', 1, 2, 0.5], ['all', 1, 2, 0.5]]
>>> row = t[(t.perturbation == "all") & (t.metric == "dice")].iloc[0]
>>> round(float(row.mean_fol_dice), 3), row.worst_family, round(float(row.worst_family_dice), 3)
(0.45, 'blur', 0.45)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np
import pandas as pd

from .records import relative_drops

# a test case whose Dice drops by more than this is a violation: the failure records', the mining's and
# metamorphic training's rates (MetamorphicCallback(violation_threshold=)); one of the reported THRESHOLDS
VIOLATION_THRESHOLD = 0.25
THRESHOLDS = (VIOLATION_THRESHOLD, 0.5)
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
    "heldout",
    "mean_src_dice",
    "mean_fol_dice",
    "worst_family",
    "worst_family_dice",
    "final",
    "basis",
    "from_epoch",
]
# what efr_table returns (the callback adds epoch, split, final, basis, from_epoch)
TABLE_COLUMNS = EFR_COLUMNS[2:-3]
# the endpoints beside each rate (issue 34): absent from efr.csv files written before them
ENDPOINT_COLUMNS = ["heldout", "mean_src_dice", "mean_fol_dice", "worst_family", "worst_family_dice"]


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
    heldout: Collection[str] = (),
) -> pd.DataFrame:
    """EFR rows from one row per test case (``perturbation, severity, src_<m>, fol_<m>``).

    Returns :data:`TABLE_COLUMNS` (``perturbation, severity, metric, threshold, errors, cases, efr,
    efr_low, efr_high, suite_cases`` and the endpoints, module doc); row order is perturbation (first
    appearance), severity (0 = pooled last), metric, t. ``suite_cases``: the number of probe cases the
    full suite tests under each (perturbation, severity); None = ``cases`` (the whole suite was scored).
    ``heldout``: the test-only families (their rows get ``heldout=True``).
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
    held = {str(h) for h in heldout}
    worst, worst_dice = worst_family(cases)
    for p, s, sub in groups:
        dice = {
            "heldout": p in held,
            "mean_src_dice": _mean(sub["src_dice"]),
            "mean_fol_dice": _mean(sub["fol_dice"]),
            "worst_family": worst if p == "all" else None,
            "worst_family_dice": worst_dice if p == "all" else float("nan"),
        }
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
                        **dice,
                    }
                )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _mean(values: pd.Series) -> float:
    v = pd.to_numeric(values, errors="coerce")
    return float(v.mean()) if v.notna().any() else float("nan")


def worst_family(cases: pd.DataFrame) -> tuple[str | None, float]:
    """(family, its mean perturbed Dice): the family with the lowest mean ``fol_dice`` over its test
    cases, severities pooled; ties go to the first in the table; (None, NaN) without test cases.

    >>> worst_family(pd.DataFrame({"perturbation": ["a", "a", "b"], "fol_dice": [0.2, 0.6, 0.5]}))
    ('a', 0.4)
    """
    if not len(cases):
        return None, float("nan")
    means = (
        pd.to_numeric(cases["fol_dice"], errors="coerce").groupby(cases["perturbation"], sort=False).mean()
    )
    means = means.dropna()
    if means.empty:
        return None, float("nan")
    name = str(means.idxmin())
    return name, float(means[name])


def efr_key(perturbation: str, metric: str, threshold: float, prefix: str = "mr/efr") -> str:
    """The logger key of one pooled EFR: ``<prefix>/<perturbation>/<metric>@<t>`` (the one spelling).

    >>> efr_key("blur", "dice", 0.25), efr_key("all", "iou", 0.5, prefix="mr/train_efr")
    ('mr/efr/blur/dice@0.25', 'mr/train_efr/all/iou@0.5')
    """
    return f"{prefix}/{perturbation}/{metric}@{_fmt_t(threshold)}"


def dice_key(name: str, prefix: str = "mr/efr") -> str:
    """The logger key of a mean perturbed Dice beside the EFR keys of ``prefix``:
    ``mr/perturbed_dice/<name>`` (``name``: a family, ``all``, ``heldout``, ``trained`` or
    ``worst_family``); ``mr/train_perturbed_dice/...`` beside ``mr/train_efr``.

    >>> dice_key("blur"), dice_key("worst_family", prefix="mr/train_efr")
    ('mr/perturbed_dice/blur', 'mr/train_perturbed_dice/worst_family')
    """
    head, _, tail = prefix.rpartition("/")
    tail = tail[: -len("efr")] + "perturbed_dice" if tail.endswith("efr") else f"{tail}_perturbed_dice"
    return f"{head}/{tail}/{name}" if head else f"{tail}/{name}"


def family_rates(
    efr: pd.DataFrame | None,
    split: str = "auto",
    metric: str = "dice",
    threshold: float = VIOLATION_THRESHOLD,
    epoch: int | None = None,
) -> dict[str, float]:
    """Per family (not ``all``): its failure rate, errors / test cases over its severities, at one epoch
    of an ``efr.csv`` table (the MetamorphicCallback's; what failure mining and metamorphic training
    weight their families by).

    A family's pooled row (``severity == 0``) is used where the table has one (summing it with the
    per-severity rows would count every case twice), else its severities are pooled; no cases: 0.
    ``split="auto"``: the training probe's rows when there are any, else the validation probe's;
    ``epoch=None``: the latest epoch of ``split``. A table with the rates only (no ``errors`` /
    ``cases`` columns) gives its pooled rows' ``efr``.

    >>> efr = pd.DataFrame({"epoch": 0, "split": "val", "perturbation": ["blur", "blur", "blur", "all"],
    ...                     "severity": [2, 4, 0, 0], "metric": "dice", "threshold": 0.25,
    ...                     "errors": [1, 3, 4, 4], "cases": [10, 10, 20, 20]})
    >>> family_rates(efr)
    {'blur': 0.2}
    """
    if efr is None or not len(efr):
        return {}
    f = efr[(efr["metric"] == metric) & (efr["perturbation"] != "all")]
    f = f[(f["threshold"].astype(float) - threshold).abs() < 1e-9]
    if split == "auto":
        split = "train" if (f["split"] == "train").any() else "val"
    f = f[f["split"] == split]
    if not len(f):
        return {}
    f = f[f["epoch"] == (f["epoch"].max() if epoch is None else epoch)]
    counted = "errors" in f.columns and "cases" in f.columns
    out: dict[str, float] = {}
    for name, rows in f.groupby("perturbation", sort=False):
        pooled = rows[rows["severity"] == 0]
        part = pooled if len(pooled) else rows
        if counted:
            n = float(part["cases"].sum())
            out[str(name)] = float(part["errors"].sum()) / n if n else 0.0
        elif len(pooled) and pooled["efr"].iloc[0] == pooled["efr"].iloc[0]:  # not NaN
            out[str(name)] = float(pooled["efr"].iloc[0])
    return out


def family_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One row per family (not ``all``) of an EFR table: its pooled-severity row of the first metric and
    threshold (the Dice columns are the same in every metric and threshold of a family).

    Old tables without the endpoint columns get them as NaN (``heldout``: False)."""
    rows = table[(table["severity"] == 0) & (table["perturbation"] != "all")]
    if len(rows):
        rows = rows[
            (rows["metric"] == rows["metric"].iloc[0]) & (rows["threshold"] == rows["threshold"].iloc[0])
        ]
    rows = rows.drop_duplicates("perturbation")
    for c in ENDPOINT_COLUMNS:
        if c not in rows:
            rows = rows.assign(**{c: False if c == "heldout" else float("nan")})
    return rows


def pool_families(rows: pd.DataFrame) -> dict[str, object]:
    """Test cases, mean source / perturbed Dice (weighted by test cases: the mean over the pooled
    test cases) and the worst family of some :func:`family_rows`; NaN / None where not recorded.

    >>> rows = pd.DataFrame({"perturbation": ["a", "b"], "cases": [1, 3], "mean_src_dice": [0.8, 0.8],
    ...                      "mean_fol_dice": [0.2, 0.6]})
    >>> {k: round(v, 2) if isinstance(v, float) else v for k, v in pool_families(rows).items()}
    {'cases': 4, 'mean_src_dice': 0.8, 'mean_fol_dice': 0.5, 'worst_family': 'a', 'worst_family_dice': 0.2}
    """
    n = pd.to_numeric(rows["cases"], errors="coerce").fillna(0) if len(rows) else pd.Series(dtype=float)
    out: dict[str, object] = {"cases": int(n.sum())}
    for c in ("mean_src_dice", "mean_fol_dice"):
        v = pd.to_numeric(rows[c], errors="coerce") if c in rows else pd.Series(np.nan, index=rows.index)
        ok = v.notna() & (n > 0)
        out[c] = float((v[ok] * n[ok]).sum() / n[ok].sum()) if ok.any() else float("nan")
    fol = pd.to_numeric(rows["mean_fol_dice"], errors="coerce") if "mean_fol_dice" in rows else None
    if fol is None or fol.isna().all():
        out["worst_family"], out["worst_family_dice"] = None, float("nan")
    else:
        i = fol.idxmin()
        out["worst_family"], out["worst_family_dice"] = str(rows.loc[i, "perturbation"]), float(fol[i])
    return out


def heldout_groups(table: pd.DataFrame) -> dict[str, dict[str, object]]:
    """:func:`pool_families` of the held-out (test-only) and the trained families of an EFR table,
    ``{"heldout": ..., "trained": ...}`` -- empty when no family is held out (nothing to split)."""
    rows = family_rows(table)
    held = rows["heldout"].astype(str).str.lower().isin(["true", "1", "1.0"])
    if not held.any():
        return {}
    return {"heldout": pool_families(rows[held]), "trained": pool_families(rows[~held])}


def efr_metrics(table: pd.DataFrame, prefix: str = "mr/efr") -> dict[str, float]:
    """The pooled-severity rows of an EFR table as logger keys (:func:`efr_key`), and beside them the
    mean perturbed Dice of each family, of ``all``, of the held-out and trained families (when some are
    held out) and of the worst family (:func:`dice_key`; the family's name is in ``efr.csv``)."""
    pooled = table[table["severity"] == 0]
    out = {
        efr_key(str(r.perturbation), str(r.metric), float(r.threshold), prefix): float(r.efr)
        for r in pooled.itertuples()
    }
    if "mean_fol_dice" not in pooled or not len(pooled):
        return out
    for r in pooled.drop_duplicates("perturbation").itertuples():
        out[dice_key(str(r.perturbation), prefix)] = float(r.mean_fol_dice)
        if r.perturbation == "all":
            out[dice_key("worst_family", prefix)] = float(r.worst_family_dice)
    for group, stats in heldout_groups(table).items():
        out[dice_key(group, prefix)] = float(stats["mean_fol_dice"])  # type: ignore[arg-type]
    return {k: v for k, v in out.items() if k.split("/")[1].endswith("efr") or np.isfinite(v)}


def _fmt_t(t: float) -> str:
    # 0.25 -> "0.25", 0.5 -> "0.5": the spelling used in the documented keys
    return f"{float(t):g}"


def format_efr_console(table: pd.DataFrame, title: str = "") -> str:
    """Compact text table: one row per perturbation (pooled severities), EFR in %, and beside it the
    mean Dice on the perturbed images (%, ``Dice*``); held-out families are marked ``[held out]``, and
    a last line names the worst family (lowest perturbed Dice) and the held-out / trained means.

    >>> cases = pd.DataFrame({"perturbation": ["a", "b"], "severity": 2, "src_dice": 0.8,
    ...                       "fol_dice": [0.7, 0.2], "src_iou": 0.6, "fol_iou": 0.5})
    >>> print(format_efr_console(efr_table(cases, (0.25,), ("dice",), heldout=["b"])))  # doctest: +NORMALIZE_WHITESPACE
                    dice@0.25  Dice*  cases
    perturbation
    a                     0.0   70.0      1
    b [held out]        100.0   20.0      1
    all                  50.0   45.0      2
    worst family: b (Dice* 20.0 %); held-out families: Dice* 20.0 %, trained families: Dice* 70.0 %
    """
    pooled = table[table["severity"] == 0]
    if pooled.empty:
        return f"{title}(no metamorphic test cases)"
    wide = pooled.pivot_table(index="perturbation", columns=["metric", "threshold"], values="efr", sort=False)
    wide.columns = [f"{m}@{_fmt_t(t)}" for m, t in wide.columns]
    first = pooled.drop_duplicates("perturbation").set_index("perturbation")
    wide = (wide * 100).round(1)
    if "mean_fol_dice" in first:
        wide["Dice*"] = (100 * pd.to_numeric(first["mean_fol_dice"], errors="coerce")).round(1)
    wide["cases"] = first["cases"]
    if "heldout" in first:
        held = {p for p, h in first["heldout"].items() if str(h).lower() in ("true", "1", "1.0")}
        wide.index = [f"{p} [held out]" if p in held else p for p in wide.index]
        wide.index.name = "perturbation"
    lines = [title] if title else []
    lines.append(wide.to_string())
    notes = []
    if "all" in first.index and "worst_family" in first and pd.notna(first.loc["all", "worst_family"]):
        notes.append(
            f"worst family: {first.loc['all', 'worst_family']} "
            f"(Dice* {100 * float(first.loc['all', 'worst_family_dice']):.1f} %)"
        )
    groups = heldout_groups(table)
    if groups:
        notes.append(
            ", ".join(
                f"{label} families: Dice* {100 * float(groups[g]['mean_fol_dice']):.1f} %"  # type: ignore[arg-type]
                for g, label in (("heldout", "held-out"), ("trained", "trained"))
            )
        )
    if notes:
        lines.append("; ".join(notes))
    return "\n".join(lines)
