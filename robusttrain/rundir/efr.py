"""``efr.csv`` (error-finding rates of every check) and ``efr_table.csv`` (``robusttrain check``'s tables).

``efr.csv`` schema (:data:`COLUMNS`): ``epoch, split, perturbation, severity, metric, threshold, errors,
cases, efr, efr_low, efr_high, suite_cases, heldout, mean_src_dice, mean_fol_dice, worst_family,
worst_family_dice, final, basis, from_epoch``. ``metric`` is ``dice``/``iou``;
a row with ``severity == 0`` pools a perturbation's severities and ``perturbation == "all"`` pools
every test case; ``cases`` = test cases scored, ``suite_cases`` = test cases of the whole suite in that
row, ``efr_low``/``efr_high`` = 95 % Wilson interval, ``heldout`` = a test-only family (never drawn by
training), ``mean_src_dice`` / ``mean_fol_dice`` = mean clean / perturbed Dice of the row's test cases
(the absolute number beside the rate), ``worst_family`` / ``worst_family_dice`` (``all`` rows only) =
the family with the lowest mean perturbed Dice and that Dice, ``final`` = the run's final table, ``basis``
(``subset``: a budgeted check's pairs; ``suite``: the whole suite in one check; ``rotation``: every
pair's latest score over the run's checks) and ``from_epoch`` (the earliest epoch whose weights scored
a pair of the row). Files written before the endpoint columns existed read with them empty
(:func:`with_endpoints`: NaN, "not recorded"). Written by MetamorphicCallback (a re-check of an epoch replaces its rows); the rows
come from :func:`robusttrain.metamorphic.efr.efr_table`.

``efr_table.csv``: the paper-layout EFR table of an audit (written by ``robusttrain check``).

>>> import tempfile, pandas as pd
>>> d = tempfile.mkdtemp()
>>> read(d) is None
True
>>> e = pd.DataFrame({"epoch": 0, "split": "val", "perturbation": "blur", "metric": "dice",
...                   "threshold": 0.5, "severity": [2, 4, 0], "errors": [1, 3, 4],
...                   "cases": [10, 10, 20], "efr": 0.0})
>>> pool_severities(e)[["errors", "cases", "efr"]].values.tolist()
[[4.0, 20.0, 0.2]]
>>> pool_severities(e)["mean_fol_dice"].isna().all()  # an old file: not recorded
np.True_
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.io import atomic_write_csv
from robusttrain.metamorphic.efr import EFR_COLUMNS, ENDPOINT_COLUMNS

from .csv_table import read_csv

NAME = "efr.csv"
TABLE_NAME = "efr_table.csv"
COLUMNS = EFR_COLUMNS  # the writer's own list: one home for the schema
POOL_KEYS = ["epoch", "split", "perturbation", "metric", "threshold"]  # one pooled row per key
NOT_RECORDED = "not recorded"  # what a table shows for an endpoint an old efr.csv lacks


def write(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / NAME, frame)


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """``efr.csv`` with every :data:`COLUMNS` endpoint (:func:`with_endpoints`), or None."""
    frame = read_csv(run_dir, NAME)
    return None if frame is None else with_endpoints(frame)


def with_endpoints(efr: pd.DataFrame) -> pd.DataFrame:
    """``efr`` with the endpoint columns an older file lacks added empty (NaN: not recorded), and
    ``heldout`` as a bool (an unrecorded one is False: nothing was held out then)."""
    missing = {c: float("nan") for c in ENDPOINT_COLUMNS if c not in efr.columns}
    out = efr.assign(**missing) if missing else efr.copy()
    out["heldout"] = out["heldout"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))
    return out


def read_table(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """``efr_table.csv`` written by ``robusttrain check`` (already in the paper's layout)."""
    return read_csv(run_dir, TABLE_NAME)


def pool_severities(efr: pd.DataFrame) -> pd.DataFrame:
    """One row per :data:`POOL_KEYS` (epoch, split, perturbation, metric, threshold), EFR as a fraction,
    with the endpoint columns (NaN where the file did not record them).

    The MetamorphicCallback writes a pooled row (``severity == 0``) next to the per-severity ones;
    use it where present (summing it too would double-count), else pool errors / cases, and the mean
    Dice weighted by cases (the mean over the pooled test cases).
    """
    efr = with_endpoints(efr)
    keys = [k for k in POOL_KEYS if k in efr.columns]
    is_pooled = efr["severity"] == 0 if "severity" in efr else pd.Series(False, index=efr.index)
    pooled = efr[is_pooled].groupby(keys).agg(**_AGG_FIRST)
    rest = efr[~is_pooled].assign(
        _src=lambda f: f["mean_src_dice"].astype(float) * f["cases"],
        _fol=lambda f: f["mean_fol_dice"].astype(float) * f["cases"],
    )
    summed = rest.groupby(keys).agg(
        errors=("errors", "sum"),
        cases=("cases", "sum"),
        heldout=("heldout", "any"),
        _src=("_src", lambda v: v.sum(min_count=len(v))),
        _fol=("_fol", lambda v: v.sum(min_count=len(v))),
        worst_family=("worst_family", "first"),
        worst_family_dice=("worst_family_dice", "first"),
    )
    n = summed["cases"].where(summed["cases"] > 0)
    summed["mean_src_dice"], summed["mean_fol_dice"] = summed.pop("_src") / n, summed.pop("_fol") / n
    summed = summed[~summed.index.isin(pooled.index)]
    out = pd.concat([pooled, summed]).reset_index()
    out[["errors", "cases"]] = out[["errors", "cases"]].astype(float)
    out["efr"] = out["errors"] / out["cases"].where(out["cases"] > 0)
    return out


_AGG_FIRST = {
    "errors": ("errors", "sum"),
    "cases": ("cases", "sum"),
    "heldout": ("heldout", "any"),
    "mean_src_dice": ("mean_src_dice", "first"),
    "mean_fol_dice": ("mean_fol_dice", "first"),
    "worst_family": ("worst_family", "first"),
    "worst_family_dice": ("worst_family_dice", "first"),
}
