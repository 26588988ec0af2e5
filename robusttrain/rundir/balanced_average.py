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
>>> _ = write(d, {"status": "ok", "window_epochs": [0], "averaged_epochs": [0, 1e300, -7]})
>>> read_checked(d)
Traceback (most recent call last):
...
robusttrain.rundir.paths.RunDirFileError: run-directory file '...balanced_average.json': averaged_epochs holds 1e+300, which no run writes (expected an epoch number, an integer from 0 to 1000000)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from . import paths, values

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


EPOCH_LISTS = ("window_epochs", "averaged_epochs", "excluded_epochs", "missing_epochs")


def read_checked(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The object for showing it (``report``): None when absent; :class:`~robusttrain.rundir.paths.RunDirFileError`
    (one line) when it is not a JSON object or holds values no run writes -- epochs that are not
    integers 0..``MAX_EPOCH``, averaged / excluded / missing epochs outside ``window_epochs``, a
    ``checkpoint`` other than ``balanced_average.ckpt``, a ``window`` outside (0, 1] or ``lr_tail``."""
    text = paths.read_text(run_dir, NAME)
    if text is None:
        return None
    where = str(Path(run_dir).resolve() / NAME)
    try:
        obj = json.loads(text)
    except ValueError as err:
        raise paths.RunDirFileError(f"run-directory file '{where}' is not valid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise paths.RunDirFileError(
            f"run-directory file '{where}' holds a {type(obj).__name__}, expected a JSON object"
        )
    lists = {key: values.epochs(where, key, obj.get(key)) for key in EPOCH_LISTS}
    for key in EPOCH_LISTS[1:]:
        values.within(where, key, lists[key], lists["window_epochs"], "window_epochs")
    values.own_file(where, "checkpoint", obj.get("checkpoint"), (CHECKPOINT,))
    window = obj.get("window")
    number = isinstance(window, (int, float)) and not isinstance(window, bool)
    if window is not None and window != "lr_tail" and not (number and 0 < window <= 1):
        raise paths.RunDirFileError(
            f"run-directory file '{where}': window holds {window!r}, which no run writes "
            "(expected 'lr_tail' or a fraction in (0, 1])"
        )
    flags = obj.get("outlier_epochs")
    if isinstance(flags, dict):
        for case, flagged in flags.items():
            values.epochs(where, f"outlier_epochs[{case!r}]", flagged)
    return {**obj, **lists}
