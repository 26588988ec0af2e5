"""What ``robusttrain check`` writes: ``checks/<name>/`` of a training run, or a check-only run directory.

A check of a training run's checkpoint writes into that run (``<run>/checks/<name>/``, :data:`DIR`), so one
``report`` of the run shows its training side and its held-out families; any other ``run_dir=`` holds the
same files at its top level (a check-only run directory). The files of one check:

* ``config.check.yaml`` (the resolved recipe), ``efr_table.csv`` / ``efr_table.md``
  (:mod:`robusttrain.rundir.efr`: the EFR tables, over the cases with a lesion);
* :data:`SUMMARY` ``check.json``: which weights, which data, the case counts per dataset (``cases``,
  ``scored_cases`` with a lesion, ``empty_cases`` without), the families labelled held out and those that
  count as trained (with why);
* :data:`CASES` ``check_cases.csv``: one row per (split, case) -- :data:`CASE_COLUMNS` then
  ``dice_<class>`` / ``iou_<class>``; ``dice`` / ``iou`` are empty on a case whose mask is empty;
* :data:`FOLLOWUPS` ``check_followups.csv``: one row per (split, case, perturbation, severity) --
  :data:`FOLLOWUP_COLUMNS` (``mr_cases.csv``'s columns and ``empty_mask``, ``heldout``, ``predicted_px``);
  two checks of one folder pair on (split, case_id, perturbation, severity, seed);
* :data:`EMPTY` ``check_empty_frames.csv``: the cases whose mask is empty, scored apart --
  :data:`EMPTY_COLUMNS`; ``specificity`` = the share of them where the model predicts nothing.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> summary(d) is None, read(d, CASES) is None
(True, True)
>>> check_name("last", None, "all"), check_name("balanced", "/data/hospital A", "val")
('last-val', 'balanced-hospital_A-val')
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.io import atomic_write_csv, atomic_write_json

# the tables' columns have their home beside what fills them (metamorphic/empty_masks.py)
from robusttrain.metamorphic.columns import CASE_COLUMNS as CASE_COLUMNS
from robusttrain.metamorphic.columns import EMPTY_COLUMNS as EMPTY_COLUMNS
from robusttrain.metamorphic.columns import FOLLOWUP_COLUMNS as FOLLOWUP_COLUMNS

from .csv_table import read_csv
from .paths import RunDirFileError, read_text

DIR = "checks"
SUMMARY = "check.json"
CASES = "check_cases.csv"
FOLLOWUPS = "check_followups.csv"
EMPTY = "check_empty_frames.csv"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_name(ckpt_stem: str, data_root: str | None, split: str) -> str:
    """The default ``checks/<name>`` of a check: the checkpoint's stem and what was scored (``val``: the
    recipe's validation split; else the data folder's name, ``-val`` for its validation split only)."""
    parts = (
        [ckpt_stem]
        + ([Path(str(data_root)).name] if data_root else [])
        + (["val"] if split == "val" or not data_root else [])
    )
    name = "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", p).strip("._-") or "x" for p in parts)
    return name[:100]


def valid_name(name: str) -> bool:
    """A folder name ``name=`` may give: letters, digits, ``. _ -``, not starting with a dot (no paths)."""
    return bool(NAME_PATTERN.fullmatch(name))


def write(out_dir: str | os.PathLike, name: str, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(out_dir) / name, frame)


def read(out_dir: str | os.PathLike, name: str) -> pd.DataFrame | None:
    """One of the check's tables (:data:`CASES`, :data:`FOLLOWUPS`, :data:`EMPTY`), or None."""
    frame = read_csv(out_dir, name)
    if frame is not None and "case_id" in frame:
        frame["case_id"] = frame["case_id"].astype(str)
    return frame


def write_summary(out_dir: str | os.PathLike, summary_: dict[str, Any]) -> Path:
    return atomic_write_json(Path(out_dir) / SUMMARY, summary_)


def summary(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``check.json`` (a mapping), or None when missing; anything else is refused naming the file."""
    text = read_text(out_dir, SUMMARY)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise RunDirFileError(f"run-directory file '{Path(out_dir) / SUMMARY}' is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RunDirFileError(f"run-directory file '{Path(out_dir) / SUMMARY}' is not a JSON object")
    return obj


def checks_of(run_dir: str | os.PathLike) -> list[Path]:
    """The check folders of a training run (``<run>/checks/*/`` holding a ``check.json``), sorted by name;
    symlinks are not followed (a run directory is untrusted)."""
    root = Path(run_dir) / DIR
    if not root.is_dir() or root.is_symlink():
        return []
    return [
        p for p in sorted(root.iterdir()) if p.is_dir() and not p.is_symlink() and (p / SUMMARY).is_file()
    ]
