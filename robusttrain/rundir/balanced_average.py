"""``balanced_average.json``: which epochs ``balanced_average.ckpt`` averages, and why.

Written by BalancedAverage at the end of fitting (:func:`write`). Keys (schema 2): ``schema,
status`` (``ok`` | ``no_inlier_epoch`` | ``not_enough_data``), ``reason, checkpoint`` (file name or
null), ``run_id`` (SHA-256 of the fit's epoch snapshots and the callback's settings: the json counts
as this run's only when it matches), ``window`` (the setting: a fraction or ``"lr_tail"``), ``rule``
(``lr_tail``: the constant-LR tail | ``fraction``: the last fraction of the validated epochs),
``window_epochs`` (the validated epochs in it), ``window_lr`` (the LR each of them started with),
``outlier_epochs`` (the ECOD flags of the corner cases, ``{case_id: [epoch, ...]}``), ``averaged_epochs,
excluded_epochs, missing_epochs`` (in the window but not on disk, or another run's), ``bn``
(``{"reestimated": bool, "batches": int}``). Schema 1 (no ``run_id`` / ``rule`` / ``window_lr``) is read
as it is.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = write(d, {"status": "ok", "averaged_epochs": [2, 3]})
>>> read(d)["averaged_epochs"], read(d)["schema"]
([2, 3], 2)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from . import paths

NAME = "balanced_average.json"
CHECKPOINT = "balanced_average.ckpt"
# per-epoch weights while they may be in the window; removed when the fit ends
WINDOW_DIR = "balanced_average_window"
SCHEMA = 2


def write(run_dir: str | os.PathLike, report: dict[str, Any]) -> Path:
    return atomic_write_json(Path(run_dir) / NAME, {"schema": SCHEMA, **report})


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The written object, or None when absent / unreadable (a warning names the file)."""
    return paths.read_json_object(run_dir, NAME)
