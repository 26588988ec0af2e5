"""``failures/mining.csv``: FailureMiningCallback's per-epoch log.

Columns: ``epoch, bank_size`` (records in the bank), ``trainable`` (records replay may train on),
``new`` (records added this epoch), ``replayed`` (replayed samples drawn), then ``weight/<perturbation>``
(the draw weights, one column per perturbation that has one). One row per epoch, rewritten whole.
In ``mode="steer"`` (mining v2) also: ``conditions`` (failure conditions in the bank), ``failures``
(conditions the epoch's check failed), ``repaired`` (conditions it no longer failed), ``new_failures``
(its failures on cases whose previous test passed: overfitting), ``steered`` / ``perturbed`` (follow-ups
steered / drawn this epoch, all ranks) and ``steered_share``.

``failures/conditions.json``: the condition bank (:class:`~robusttrain.mining.conditions.ConditionBank`
``state_dict``), rewritten atomically after each check.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = write(d, [{"epoch": 0, "bank_size": 3, "trainable": 2, "new": 3, "replayed": 0}])
>>> read(d)["bank_size"].tolist()
[3]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.io import atomic_write_csv, atomic_write_json

from .csv_table import read_csv
from .failures import DIR
from .paths import read_json_object

NAME = "mining.csv"
CONDITIONS = "conditions.json"
COLUMNS = ["epoch", "bank_size", "trainable", "new", "replayed"]  # then weight/<perturbation>…


def write(run_dir: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """``mining.csv`` from its rows (one per epoch: :data:`COLUMNS`, then ``weight/<perturbation>``…)."""
    return atomic_write_csv(Path(run_dir) / DIR / NAME, pd.DataFrame(rows))


def read(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    return read_csv(run_dir, Path(DIR) / NAME)


def write_conditions(run_dir: str | os.PathLike, state: dict[str, Any]) -> Path:
    return atomic_write_json(Path(run_dir) / DIR / CONDITIONS, state)


def read_conditions(run_dir: str | os.PathLike) -> dict | None:
    """The condition bank's state, or None when absent or unreadable (a warning names the file)."""
    return read_json_object(run_dir, f"{DIR}/{CONDITIONS}")
