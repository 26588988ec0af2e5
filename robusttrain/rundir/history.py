"""``history.csv``: the clean per-case validation history (the corner-case analysis input).

Schema: ``case_id, epoch, dice_<class>…, iou_<class>…``; one row per (case, epoch), ``epoch`` =
``trainer.current_epoch`` (0-based). Written by MetamorphicCallback; BalancedCheckpoint writes the
same schema to ``balanced_history.csv`` when it computed Dice itself (no MR callback in the run).

>>> import tempfile, pandas as pd
>>> d = tempfile.mkdtemp()
>>> _ = write(d, pd.DataFrame({"case_id": ["a"], "epoch": [0], "dice_lv": [0.9]}))
>>> read(d)["dice_lv"].tolist(), dice_columns(read(d))
([0.9], ['dice_lv'])
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.io import atomic_write_csv

from .csv_table import read_csv
from .paths import locate

NAME = "history.csv"
FALLBACK_NAME = "balanced_history.csv"
REQUIRED = ("case_id", "epoch")


def from_rows(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A history table from its rows (``case_id, epoch, dice_<class>…, iou_<class>…`` each)."""
    return pd.DataFrame(rows)


def write(run_dir: str | os.PathLike, frame: pd.DataFrame, name: str = NAME) -> Path:
    return atomic_write_csv(Path(run_dir) / name, frame)


def path_in(run_dir: str | os.PathLike) -> Path | None:
    """``history.csv``, else ``balanced_history.csv``, else None (through the safe reader)."""
    for name in (NAME, FALLBACK_NAME):
        if (found := locate(run_dir, name)) is not None:
            return found
    return None


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """The history (``case_id`` as str), from either file name; None when absent."""
    p = path_in(run_dir)
    frame = read_csv(p.parent, p.name) if p is not None else None
    if frame is not None and "case_id" in frame:
        frame["case_id"] = frame["case_id"].astype(str)
    return frame


def dice_columns(history: pd.DataFrame) -> list[str]:
    """Per-class Dice columns, in file order (``dice_rv``, ``dice_myo`` …)."""
    return [c for c in history.columns if str(c).startswith("dice_")]
