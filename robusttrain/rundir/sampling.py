"""``failures/sampling.json``: the failure-driven draw weights replay uses.

Written by FailureMiningCallback after every bank flush (:func:`write`); read by every replay
dataset, in the data-loader workers too (:func:`read_weights`). Keys: ``epoch`` (the epoch whose
train-probe EFR the weights come from; -1 before the first), ``weights`` (``{perturbation: p}``,
summing to 1) and ``smoothed`` (the EMA of the failure rates behind them).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> read_weights(d)
{}
>>> _ = write(d, epoch=2, weights={"blur": 0.75, "text": 0.25}, smoothed={"blur": 0.3, "text": 0.0})
>>> read_weights(d), read(d)["epoch"]
({'blur': 0.75, 'text': 0.25}, 2)
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from .failures import DIR

log = logging.getLogger(__name__)

NAME = "sampling.json"


def path(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/failures/sampling.json``."""
    return Path(run_dir) / DIR / NAME


def write(
    run_dir: str | os.PathLike, epoch: int, weights: Mapping[str, float], smoothed: Mapping[str, float]
) -> Path:
    return atomic_write_json(
        path(run_dir), {"epoch": int(epoch), "weights": dict(weights), "smoothed": dict(smoothed)}
    )


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The written object, or None when absent / unreadable / not an object (a warning names the file)."""
    p = path(run_dir)
    if not p.is_file():
        return None
    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        log.warning("cannot read %s: %s", p, err)
        return None
    if not isinstance(obj, dict):
        log.warning("cannot read %s: expected a JSON object, got %s", p, type(obj).__name__)
        return None
    return obj


def read_weights(run_dir: str | os.PathLike) -> dict[str, float]:
    """``weights`` as ``{perturbation: finite float >= 0}``; ``{}`` when absent or malformed."""
    obj = read(run_dir)
    raw = obj.get("weights") if obj is not None else None
    if not isinstance(raw, dict):
        return {}
    out: dict[str, float] = {}
    for k, v in raw.items():
        try:
            w = float(v)
        except (TypeError, ValueError):
            w = math.nan
        if isinstance(v, bool) or not math.isfinite(w) or w < 0:
            log.warning(
                "%s: weights[%r]=%r: expected a finite number >= 0; weights ignored", path(run_dir), k, v
            )
            return {}
        out[str(k)] = w
    return out
