"""``failures/``: the failure bank's files (written by :class:`robusttrain.mining.FailureBank`).

* ``failures/failures.jsonl``: append-only batches: ``{"kind": "failure", "id": ..., **record}``
  lines (a :class:`~robusttrain.metamorphic.records.FailureRecord` plus ``drop``), each batch closed
  by ``{"kind": "batch", "epoch": e, "seen": [...], "n": k}``; a later line for an id replaces
  the earlier one. **One rule for a torn batch**, used by every reader (replay, resume, reporting):
  only batches closed by their marker count; a torn last line or a batch without marker (a run
  killed mid-write) reads as if that flush never happened, and the writer cuts it off
  (:func:`truncate_torn_tail`) before appending again.
* ``failures/thumbs/<id>.png``: image strips of the worst failures.
* ``failures/sampling.json`` and ``failures/mining.csv``: FailureMiningCallback's weights and log
  (:mod:`robusttrain.rundir.sampling`, :mod:`robusttrain.rundir.mining`).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> read(d) is None
True
>>> (d / DIR).mkdir()
>>> _ = (d / DIR / LOG_NAME).write_text('{"kind": "failure", "id": "a", "src_dice": 0.8, "fol_dice": 0.2}\\n'
...                                     '{"kind": "batch", "epoch": 0, "seen": [], "n": 1}\\n'
...                                     '{"kind": "failure", "id": "b", "src_dice": 0.8, "fol_dice": 0.1}\\n')
>>> [(r["id"], round(r["drop"], 2)) for r in read(d)]  # "b" has no marker yet: not written
[('a', 0.75)]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from robusttrain.metamorphic.records import relative_drop

from .paths import inside, read_bytes

DIR = "failures"
LOG_NAME = "failures.jsonl"
THUMB_DIR = "thumbs"

Batch = list[dict[str, Any]]


def log_path(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/failures/failures.jsonl``."""
    return Path(run_dir) / DIR / LOG_NAME


def batch_ends(data: bytes) -> list[int]:
    """Byte offsets just past each batch marker of ``data``, up to the first torn line: the
    complete batches a reader trusts (the last offset is what the writer keeps before appending)."""
    ends: list[int] = []
    pos = 0
    for raw in data.split(b"\n")[:-1]:  # last element: after the final newline (or a torn line)
        pos += len(raw) + 1
        if not raw.strip():
            continue
        try:
            is_marker = json.loads(raw).get("kind") == "batch"
        except (ValueError, AttributeError):
            break
        if is_marker:
            ends.append(pos)
    return ends


def complete_end(data: bytes) -> int:
    """Byte offset just past the last complete batch of ``data`` (0 when there is none)."""
    ends = batch_ends(data)
    return ends[-1] if ends else 0


def parse_batches(data: bytes) -> list[Batch]:
    """Complete batches (each a list of lines ending with its marker) of a log's bytes."""
    batches: list[Batch] = []
    cur: Batch = []
    for raw in data[: complete_end(data)].split(b"\n"):
        if not raw.strip():
            continue
        d = json.loads(raw)
        cur.append(d)
        if d.get("kind") == "batch":
            batches.append(cur)
            cur = []
    return batches


def read_batches(path: str | os.PathLike | None) -> list[Batch]:
    """Complete batches of a bank log; a torn or unterminated tail is ignored."""
    if path is None or not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        return parse_batches(fh.read())


def truncate_torn_tail(path: Path) -> None:
    """Keep only complete batches, so an append never glues onto a half-written line."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = complete_end(data)
    if end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())


def log_signature(path: str | os.PathLike | None) -> tuple[int, int]:
    """Cheap change detector for readers in other processes (size, mtime)."""
    if path is None:
        return (0, 0)
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def read(run_dir: str | os.PathLike) -> list[dict[str, Any]] | None:
    """Every stored failure of the complete batches as a dict (with ``id``, ``drop`` and ``thumb``
    when it has one); a later line for an id replaces the earlier one."""
    data = read_bytes(run_dir, Path(DIR) / LOG_NAME)  # no symlinks, nothing outside the run directory
    if data is None:
        return None
    by_id: dict[str, dict[str, Any]] = {}
    n = 0
    for batch in parse_batches(data):
        for rec in batch[:-1]:
            n += 1
            if not isinstance(rec, dict) or rec.get("kind", "failure") != "failure":
                continue
            rid = str(rec.get("id", n))
            if "drop" not in rec:
                rec["drop"] = relative_drop(float(rec.get("src_dice", 0.0)), float(rec.get("fol_dice", 0.0)))
            # a "thumb" written in the file itself is never trusted (it could name any file)
            rec.pop("thumb", None)
            if isinstance(rec.get("extra"), dict):
                rec["extra"].pop("thumb", None)
            thumb = inside(run_dir, Path(DIR) / THUMB_DIR / f"{rid}.png")
            if thumb is not None:
                rec["thumb"] = str(thumb)
            by_id[rid] = rec
    return list(by_id.values())
