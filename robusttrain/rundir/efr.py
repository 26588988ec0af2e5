"""``efr.csv`` (error-finding rates of every check) and ``efr_table.csv`` (``robusttrain check``'s tables).

``efr.csv`` schema (:data:`COLUMNS`): ``epoch, split, perturbation, severity, metric, threshold, errors,
cases, efr, efr_low, efr_high, suite_cases, final, basis, from_epoch``. ``metric`` is ``dice``/``iou``;
a row with ``severity == 0`` pools a perturbation's severities and ``perturbation == "all"`` pools
every test case; ``cases`` = test cases scored, ``suite_cases`` = test cases of the whole suite in that
row, ``efr_low``/``efr_high`` = 95 % Wilson interval, ``final`` = the run's final table, ``basis``
(``subset``: a budgeted check's pairs; ``suite``: the whole suite in one check; ``rotation``: every
pair's latest score over the run's checks) and ``from_epoch`` (the earliest epoch whose weights scored
a pair of the row). Written by MetamorphicCallback (a re-check of an epoch replaces its rows); the rows
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
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.io import atomic_write_csv
from robusttrain.metamorphic.efr import EFR_COLUMNS

from ._csv import read_csv

NAME = "efr.csv"
TABLE_NAME = "efr_table.csv"
COLUMNS = EFR_COLUMNS  # the writer's own list: one home for the schema
POOL_KEYS = ["epoch", "split", "perturbation", "metric", "threshold"]  # one pooled row per key


def write(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / NAME, frame)


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    return read_csv(run_dir, NAME)


def read_table(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """``efr_table.csv`` written by ``robusttrain check`` (already in the paper's layout)."""
    return read_csv(run_dir, TABLE_NAME)


def pool_severities(efr: pd.DataFrame) -> pd.DataFrame:
    """One row per :data:`POOL_KEYS` (epoch, split, perturbation, metric, threshold), EFR as a fraction.

    The MetamorphicCallback writes a pooled row (``severity == 0``) next to the per-severity ones;
    use it where present (summing it too would double-count), else pool errors / cases.
    """
    keys = [k for k in POOL_KEYS if k in efr.columns]
    is_pooled = efr["severity"] == 0 if "severity" in efr else pd.Series(False, index=efr.index)
    pooled = efr[is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = efr[~is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = summed[~summed.index.isin(pooled.index)]
    out = pd.concat([pooled, summed]).astype(float).reset_index()
    out["efr"] = out["errors"] / out["cases"].where(out["cases"] > 0)
    return out
