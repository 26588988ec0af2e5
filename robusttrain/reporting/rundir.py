"""Reporting's view of a run directory: the readers of :mod:`robusttrain.rundir` plus table helpers.

Every loader returns ``None`` when its file is missing or unreadable, so plots and the HTML report
degrade section by section instead of failing. Nothing here recomputes analysis: EFR, corner cases
and the balanced epoch are read as their writers stored them.

>>> import tempfile
>>> load_history(tempfile.mkdtemp()) is None
True
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.rundir import corner_cases as corners_file
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir import failures as failures_file
from robusttrain.rundir import history as history_file
from robusttrain.rundir._csv import read_csv
from robusttrain.rundir.corner_cases import Corners  # noqa: F401 (re-exported)
from robusttrain.rundir.paths import inside, read_bytes, read_text  # noqa: F401 (re-exported)

EFR_TABLE = "efr_table.csv"
CONFIG = "config.yaml"
HISTORY, EFR, CORNERS = history_file.NAME, efr_file.NAME, corners_file.NAME
FAILURES = f"{failures_file.DIR}/{failures_file.LOG_NAME}"


def load_history(run_dir: str | Path) -> pd.DataFrame | None:
    """``history.csv`` (:mod:`robusttrain.rundir.history`)."""
    return history_file.read(run_dir)


def load_efr(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr.csv`` (:mod:`robusttrain.rundir.efr`)."""
    return efr_file.read(run_dir)


EFR_KEYS = ["epoch", "split", "perturbation", "metric", "threshold"]


def pool_severities(efr: pd.DataFrame) -> pd.DataFrame:
    """One row per (epoch, split, perturbation, metric, threshold), EFR as a fraction.

    The MetamorphicCallback writes a pooled row (``severity == 0``) next to the per-severity ones;
    use it where present (summing it too would double-count), else pool errors / cases.

    >>> e = pd.DataFrame({"epoch": 0, "split": "val", "perturbation": "blur", "metric": "dice",
    ...                   "threshold": 0.5, "severity": [2, 4, 0], "errors": [1, 3, 4],
    ...                   "cases": [10, 10, 20], "efr": 0.0})
    >>> pool_severities(e)[["errors", "cases", "efr"]].values.tolist()
    [[4.0, 20.0, 0.2]]
    """
    keys = [k for k in EFR_KEYS if k in efr.columns]
    is_pooled = efr["severity"] == 0 if "severity" in efr else pd.Series(False, index=efr.index)
    pooled = efr[is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = efr[~is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = summed[~summed.index.isin(pooled.index)]
    out = pd.concat([pooled, summed]).astype(float).reset_index()
    out["efr"] = out["errors"] / out["cases"].where(out["cases"] > 0)
    return out


def load_efr_table(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr_table.csv`` written by ``robusttrain check`` (already in the paper's layout)."""
    return read_csv(run_dir, EFR_TABLE)


def load_config_text(run_dir: str | Path) -> str | None:
    return read_text(run_dir, CONFIG)


def load_failures(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """``failures/failures.jsonl`` (:mod:`robusttrain.rundir.failures`)."""
    return failures_file.read(run_dir)


dice_columns = history_file.dice_columns


def cohort_mean(history: pd.DataFrame, column: str) -> pd.Series:
    """Mean over cases of ``column`` per epoch (index: epoch) — the cohort curve."""
    return history.groupby("epoch")[column].mean().sort_index()


def clean_dice(history: pd.DataFrame) -> pd.DataFrame:
    """Cohort-mean Dice per epoch and class, plus ``mean`` over classes (index: epoch)."""
    cols = dice_columns(history)
    frame = history.groupby("epoch")[cols].mean().sort_index()
    frame.columns = [c[len("dice_"):] for c in cols]
    frame["mean"] = frame.mean(axis=1)
    return frame


def load_corners(run_dir: str | Path) -> Corners | None:
    """``corner_cases.json`` (:mod:`robusttrain.rundir.corner_cases`), or None when absent/unreadable."""
    return corners_file.read(run_dir)
