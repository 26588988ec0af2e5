"""``ema.json``: the EMA behind ``ema.ckpt`` -- its decay, where the decay came from, and the window it gives.

Written by EMACheckpoint at the end of fitting, after ``ema.ckpt`` (:func:`write`). Keys (schema 1):
``schema, checkpoint`` (``ema.ckpt``), ``decay`` (per update), ``decay_from`` (``given`` |
``half_life``), ``half_life`` (fraction of the updates, or null when the decay was given),
``half_life_updates``, ``updates`` (EMA updates the run makes: every ``update_every_n_steps``-th optimizer
step from ``update_starting_at_step``), ``averaged`` (updates the average holds at the end),
``first_update_share`` (share of the first update's weights in the average) and
``last_quarter_share`` (share of the last quarter of the updates), ``buffers`` (``averaged``: BatchNorm
statistics are EMAs too | ``not_averaged``), ``global_step``.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = write(d, {"decay": 0.99})
>>> read(d)["decay"], read(d)["schema"]
(0.99, 1)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from . import paths

NAME = "ema.json"
CHECKPOINT = "ema.ckpt"
SCHEMA = 1


def write(run_dir: str | os.PathLike, report: dict[str, Any]) -> Path:
    return atomic_write_json(Path(run_dir) / NAME, {"schema": SCHEMA, **report})


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The written object, or None when absent / unreadable (a warning names the file)."""
    return paths.read_json_object(run_dir, NAME)
