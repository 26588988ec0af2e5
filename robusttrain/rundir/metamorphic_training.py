"""``metamorphic_training.csv`` and ``metamorphic_training_samples.jsonl``: what worst-of-k trained on.

``metamorphic_training.csv`` -- one row per (epoch, family): ``candidates`` drawn, ``chosen`` (kept
follow-ups), ``rejected`` (occluders over the lesion), ``mean_score`` / ``mean_chosen_score`` (the
scoring loss of all / kept candidates; empty for k = 1) and ``weight`` (the family's draw probability
at the epoch's last step). Rows are written in (epoch, family) order.

``metamorphic_training_samples.jsonl`` -- a sample of the kept follow-ups (the first few of every
``record_every``-th step): ``step, epoch, rank, position, case_id, family, severity, params`` with
the params as nested lists, enough to re-create the training image exactly from the clean one
(``get(family, severity).apply_batch(x, m, params=...)``).

>>> import tempfile, pandas as pd
>>> d = tempfile.mkdtemp()
>>> _ = write_stats(d, pd.DataFrame({"epoch": [0], "family": ["blur"], "candidates": [8], "chosen": [2]}))
>>> read_stats(d)["chosen"].tolist()
[2]
>>> _ = write_samples(d, [{"step": 0, "family": "blur", "params": {"sigma_rel": [[0.01]]}}])
>>> read_samples(d)[0]["params"]["sigma_rel"]
[[0.01]]
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.io import atomic_write_csv, atomic_write_text

from . import values
from .csv_table import read_csv
from .paths import read_text

STATS = "metamorphic_training.csv"
SAMPLES = "metamorphic_training_samples.jsonl"
STATS_COLUMNS = [
    "epoch",
    "family",
    "candidates",
    "chosen",
    "rejected",
    "mean_score",
    "mean_chosen_score",
    "weight",
]


def write_stats(run_dir: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(run_dir) / STATS, frame)


COUNTS = ("epoch", "candidates", "chosen", "rejected")


def read_stats(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """The table, None when absent; a torn row or a count no run writes (``candidates=1e308``, ``-3``,
    ``2.5``) is refused with one line naming the file, line and column."""
    frame = read_csv(run_dir, STATS)
    if frame is not None:
        values.counts(f"{os.path.realpath(run_dir)}{os.sep}{STATS}", frame, COUNTS)
    return frame


def write_samples(run_dir: str | os.PathLike, records: Sequence[dict[str, Any]]) -> Path:
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    return atomic_write_text(Path(run_dir) / SAMPLES, text)


def read_samples(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The recorded samples; a line that is not a JSON object ends the read (a torn write). Read through
    the run-directory reader (no symlinks, nothing outside the run directory, UTF-8 only)."""
    text = read_text(run_dir, SAMPLES)
    if text is None:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if not isinstance(rec, dict):
            break
        out.append(rec)
    return out
