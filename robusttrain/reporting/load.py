"""What reporting loads from a run directory: the readers of :mod:`robusttrain.rundir`, plus the
cohort views the plots and tables share.

Every loader returns ``None`` when its file is missing or unreadable, so plots and the HTML report
degrade section by section instead of failing. Nothing here recomputes analysis or parses a file:
EFR, corner cases and the balanced epoch are read as their writers stored them.

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
from robusttrain.rundir.corner_cases import Corners
from robusttrain.rundir.history import dice_columns
from robusttrain.rundir.paths import inside, read_bytes, read_text

CONFIG = "config.yaml"
HISTORY, EFR, EFR_TABLE, CORNERS = history_file.NAME, efr_file.NAME, efr_file.TABLE_NAME, corners_file.NAME
FAILURES = f"{failures_file.DIR}/{failures_file.LOG_NAME}"

__all__ = [
    "Corners",
    "dice_columns",
    "inside",
    "read_bytes",
    "load_history",
    "load_efr",
    "load_efr_table",
    "load_config_text",
    "load_failures",
    "load_corners",
    "cohort_mean",
    "clean_dice",
]


def load_history(run_dir: str | Path) -> pd.DataFrame | None:
    """``history.csv`` (:mod:`robusttrain.rundir.history`)."""
    return history_file.read(run_dir)


def load_efr(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr.csv`` (:mod:`robusttrain.rundir.efr`)."""
    return efr_file.read(run_dir)


def load_efr_table(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr_table.csv`` (:func:`robusttrain.rundir.efr.read_table`)."""
    return efr_file.read_table(run_dir)


def load_config_text(run_dir: str | Path) -> str | None:
    """``config.yaml`` as text, read through the run-dir reader (no symlinks, nothing outside)."""
    return read_text(run_dir, CONFIG)


def load_failures(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """``failures/failures.jsonl`` (:func:`robusttrain.rundir.failures.read`)."""
    return failures_file.read(run_dir)


def load_corners(run_dir: str | Path) -> Corners | None:
    """``corner_cases.json`` (:mod:`robusttrain.rundir.corner_cases`), or None when absent/unreadable."""
    return corners_file.read(run_dir)


def cohort_mean(history: pd.DataFrame, column: str) -> pd.Series:
    """Mean over cases of ``column`` per epoch (index: epoch) — the cohort curve."""
    return history.groupby("epoch")[column].mean().sort_index()


def clean_dice(history: pd.DataFrame) -> pd.DataFrame:
    """Cohort-mean Dice per epoch and class, plus ``mean`` over classes (index: epoch)."""
    cols = history_file.dice_columns(history)
    frame = history.groupby("epoch")[cols].mean().sort_index()
    frame.columns = [c[len("dice_") :] for c in cols]
    frame["mean"] = frame.mean(axis=1)
    return frame
