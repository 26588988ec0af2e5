"""``mr_cases.csv``: one row per (epoch, split, case, perturbation, severity) of every check.

Columns (MetamorphicCallback, :func:`robusttrain.metamorphic.runner.aggregate`): ``epoch, split,
case_id, perturbation, severity, seed``, source / follow-up scores (``src_dice``, ``fol_dice``,
``src_iou``, ``fol_iou``), drops (``drop_dice``, ``drop_iou``) and ``consistency``.

>>> import tempfile
>>> read(tempfile.mkdtemp()) is None
True
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.io import atomic_write_csv

from .csv_table import read_csv

NAME = "mr_cases.csv"


def write(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / NAME, frame)


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    frame = read_csv(run_dir, NAME)
    if frame is not None and "case_id" in frame:
        frame["case_id"] = frame["case_id"].astype(str)
    return frame
