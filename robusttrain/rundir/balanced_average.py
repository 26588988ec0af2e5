"""``balanced_average.json``: which epochs ``balanced_average.ckpt`` averages, and why.

Written by BalancedAverage at the end of fitting (:func:`write`). Keys (schema 1): ``schema,
status`` (``ok`` | ``no_inlier_epoch`` | ``not_enough_data``), ``reason, checkpoint`` (file name or
null), ``window`` (the fraction), ``window_epochs`` (the validated epochs in it), ``outlier_epochs``
(the ECOD flags of the corner cases, ``{case_id: [epoch, ...]}``), ``averaged_epochs, excluded_epochs,
missing_epochs`` (in the window but no longer on disk), ``bn`` (``{"reestimated": bool, "batches":
int}``).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = write(d, {"status": "ok", "averaged_epochs": [2, 3]})
>>> read(d)["averaged_epochs"], read(d)["schema"]
([2, 3], 1)
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

log = logging.getLogger(__name__)

NAME = "balanced_average.json"
CHECKPOINT = "balanced_average.ckpt"
# per-epoch weights while they are in the window; removed when the fit ends
WINDOW_DIR = "balanced_average_window"
SCHEMA = 1


def write(run_dir: str | os.PathLike, report: dict[str, Any]) -> Path:
    return atomic_write_json(Path(run_dir) / NAME, {"schema": SCHEMA, **report})


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The written object, or None when absent / unreadable (a warning names the file)."""
    path = Path(run_dir) / NAME
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        log.warning("cannot read %s: %s", path, err)
        return None
    return obj if isinstance(obj, dict) else None
