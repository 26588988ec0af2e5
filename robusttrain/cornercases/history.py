"""Load and validate the long per-case history table: ``case_id, epoch, <metric>_<class>…``.

>>> import pandas as pd
>>> h = load_history(pd.DataFrame({"case_id": ["a"], "epoch": [0], "dice_lv": [0.9]}))
>>> metric_columns(h)
['dice_lv']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeAlias

import pandas as pd

from robusttrain.rundir import history as history_file
from robusttrain.rundir.csv_table import read_csv
from robusttrain.rundir.paths import locate

HistoryLike: TypeAlias = "pd.DataFrame | str | os.PathLike"
REQUIRED = ("case_id", "epoch")
# Written by BalancedCheckpoint when it computes Dice itself (no MetamorphicCallback in the run).
FALLBACK_NAME = history_file.FALLBACK_NAME
SCORE_PREFIXES = ("dice_", "iou_")


def resolve_history_path(path: str | os.PathLike) -> Path:
    """A CSV path, or a run directory holding ``history.csv`` (else ``balanced_history.csv``); read
    later through the run-directory reader (:mod:`robusttrain.rundir.paths`)."""
    p = Path(path)
    if p.is_dir():
        found = history_file.path_in(p)
        if found is None:
            raise FileNotFoundError(f"no {history_file.NAME} (or {FALLBACK_NAME}) in run directory {p}")
        return found
    if locate(p.parent, p.name) is None:
        raise FileNotFoundError(f"history file not found: {p}")
    return p


def load_history(source: HistoryLike) -> pd.DataFrame:
    """Return a clean copy: ``case_id`` str, ``epoch`` int, one row per (case, epoch).

    When a resumed run logged an epoch twice, the *last* row wins (it is the newer measurement).
    """
    if isinstance(source, pd.DataFrame):
        df = source.copy()
    else:
        p = resolve_history_path(source)
        df = read_csv(p.parent, p.name)
        if df is None:
            raise ValueError(f"history file {p} is empty")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"history is missing column(s) {missing}; it has {list(df.columns)}")
    df["case_id"] = df["case_id"].astype(str)
    epoch = pd.to_numeric(df["epoch"], errors="coerce")
    bad = epoch.isna() | (epoch != epoch.round()) | (epoch < 0)
    if bad.any():
        i = bad.idxmax()
        raise ValueError(
            f"history column 'epoch' has value {_plain(df['epoch'][i])!r} for case {df['case_id'][i]!r}; "
            "expected a whole number >= 0"
        )
    df["epoch"] = epoch.astype(int)
    for col in score_columns(df):
        df[col] = _checked_scores(df, col)
    df = df.drop_duplicates(["case_id", "epoch"], keep="last")
    return df.sort_values(["epoch", "case_id"], kind="mergesort").reset_index(drop=True)


def score_columns(history: pd.DataFrame) -> list[str]:
    """The ``dice_<class>`` / ``iou_<class>`` columns (scores in [0,1])."""
    return [c for c in history.columns if str(c).startswith(SCORE_PREFIXES)]


def _checked_scores(df: pd.DataFrame, col: str) -> pd.Series:
    # A Dice of inf or -5 would rank as a "best" or "worst" case and steer the checkpoint choice;
    # such a value is a bug upstream, so it is refused by name. Empty (NaN) means "not measured".
    v = pd.to_numeric(df[col], errors="coerce")
    bad = (v.isna() & df[col].notna()) | ~(v.isna() | ((v >= 0) & (v <= 1)))
    if bad.any():
        i = bad.idxmax()
        raise ValueError(
            f"history column {col!r} has value {_plain(df[col][i])!r} for case {df['case_id'][i]!r} at "
            f"epoch {df['epoch'][i]}; expected a score in [0, 1] (empty = not measured)"
        )
    return v.astype(float)


def _plain(v):
    return v.item() if hasattr(v, "item") and not isinstance(v, str) else v


def metric_columns(history: pd.DataFrame, metric: str = "dice") -> list[str]:
    """Columns ``<metric>_<class>`` in table order (the ECOD dimensions)."""
    cols = [c for c in history.columns if str(c).startswith(f"{metric}_")]
    if not cols:
        raise ValueError(f"history has no '{metric}_<class>' columns; it has {list(history.columns)}")
    return cols


def case_scores(history: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Per-row mean over the metric columns (one number per case and epoch)."""
    return history[columns].mean(axis=1, skipna=True)
