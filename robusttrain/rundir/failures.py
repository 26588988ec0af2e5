"""``failures/``: the failure bank's files (written by :class:`robusttrain.mining.FailureBank`).

* ``failures/failures.jsonl``: append-only batches: ``{"kind": "failure", "id": ..., **record}``
  lines (a :class:`~robusttrain.metamorphic.records.FailureRecord` plus ``drop``), each batch closed
  by ``{"kind": "batch", "epoch": e, "seen": [...], "n": k}``; a later line for an id replaces
  the earlier one; a torn last line is skipped.
* ``failures/thumbs/<id>.png``: image strips of the worst failures.
* ``failures/sampling.json``, ``failures/mining.csv``: FailureMiningCallback's weights and log.

>>> import tempfile
>>> read(tempfile.mkdtemp()) is None
True
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .paths import inside, read_text

DIR = "failures"
LOG_NAME = "failures.jsonl"
THUMB_DIR = "thumbs"
SAMPLING_NAME = "sampling.json"
MINING_NAME = "mining.csv"


def read(run_dir: str | os.PathLike) -> list[dict[str, Any]] | None:
    """Every stored failure as a dict (with ``id``, ``drop`` and ``thumb`` when it has one)."""
    text = read_text(run_dir, Path(DIR) / LOG_NAME)
    if text is None:
        return None
    by_id: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines()):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being appended right now; the next read gets it
        if not isinstance(rec, dict) or rec.get("kind", "failure") != "failure":
            continue
        rid = str(rec.get("id", n))
        if "drop" not in rec:
            src, fol = float(rec.get("src_dice", 0.0)), float(rec.get("fol_dice", 0.0))
            rec["drop"] = 0.0 if src <= 0 else (src - fol) / src
        # a "thumb" written in the file itself is never trusted (it could name any file)
        rec.pop("thumb", None)
        if isinstance(rec.get("extra"), dict):
            rec["extra"].pop("thumb", None)
        thumb = inside(run_dir, Path(DIR) / THUMB_DIR / f"{rid}.png")
        if thumb is not None:
            rec["thumb"] = str(thumb)
        by_id[rid] = rec
    return list(by_id.values())
