"""``failures/mining.csv``: FailureMiningCallback's per-epoch log.

Columns: ``epoch, bank_size`` (records in the bank), ``trainable`` (records replay may train on),
``new`` (records added this epoch), ``replayed`` (replayed samples drawn), then ``weight/<perturbation>``
(the draw weights, one column per perturbation that has one). One row per epoch, rewritten whole.

>>> import tempfile, pandas as pd
>>> d = tempfile.mkdtemp()
>>> _ = write(d, pd.DataFrame([{"epoch": 0, "bank_size": 3, "trainable": 2, "new": 3, "replayed": 0}]))
>>> read(d)["bank_size"].tolist()
[3]
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.io import atomic_write_csv

from .csv_table import read_csv
from .failures import DIR

NAME = "mining.csv"
COLUMNS = ["epoch", "bank_size", "trainable", "new", "replayed"]  # then weight/<perturbation>…


def write(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / DIR / NAME, frame)


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    return read_csv(run_dir, Path(DIR) / NAME)
