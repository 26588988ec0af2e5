"""``efr.csv``: error-finding rates of every check.

Schema: ``epoch, split, perturbation, severity, metric, threshold, errors, cases, efr``; ``metric``
is ``dice``/``iou``; a row with ``severity == 0`` pools a perturbation's severities. Also (when
written by a budgeted run) ``efr_low, efr_high`` (95 % Wilson), ``suite_cases``, ``final`` (the final
table), ``basis`` (``subset``: a budgeted check's pairs; ``suite``: the whole suite in one check;
``rotation``: every pair's latest score over the run's checks) and ``from_epoch`` (the earliest epoch
whose weights scored a pair of the row). Written by
MetamorphicCallback (a re-check of an epoch replaces its rows).

>>> import tempfile, pandas as pd
>>> d = tempfile.mkdtemp()
>>> read(d) is None
True
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from robusttrain.io import atomic_write_csv

from ._csv import read_csv

NAME = "efr.csv"
COLUMNS = ["epoch", "split", "perturbation", "severity", "metric", "threshold", "errors", "cases", "efr"]


def write(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / NAME, frame)


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    return read_csv(Path(run_dir) / NAME)
