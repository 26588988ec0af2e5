"""``resumes.jsonl``: the settings each resume of a run changed, beside the ``config.yaml`` it started with.

A run's ``config.yaml`` is the resolved recipe of the fit that started it, and a resume never rewrites
it (:mod:`robusttrain.cli.resume` says what a resume may change). Each resume that changes a setting
appends one JSON object (schema 1): ``schema``, ``at`` (local time), ``ckpt`` (the file resumed),
``from_epoch`` (its epoch) and ``changed``: ``{key: {"was": value, "now": value}}``. The settings in
force after the n-th resume are ``config.yaml`` with the first n records applied.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = append(d, {"ckpt": "last.ckpt", "from_epoch": 1,
...                "changed": {"trainer.max_epochs": {"was": 2, "now": 4}}})
>>> [r["changed"]["trainer.max_epochs"]["now"] for r in read(d)]
[4]
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_bytes, json_default

from . import paths

NAME = "resumes.jsonl"
SCHEMA = 1


def append(run_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    """Add ``record`` (with ``schema`` and ``at``) as the file's last line; the whole file is rewritten
    atomically, so a kill leaves the old file or the new one. The earlier lines are kept as they are."""
    before = paths.read_bytes(run_dir, NAME) or b""
    if before and not before.endswith(b"\n"):
        before += b"\n"  # a torn last line stays (as it was) on its own line
    line = json.dumps(
        {"schema": SCHEMA, "at": time.strftime("%Y-%m-%d %H:%M:%S"), **record}, default=json_default
    )
    return atomic_write_bytes(Path(run_dir) / NAME, before + line.encode() + b"\n")


def read(run_dir: str | os.PathLike) -> list[dict[str, Any]] | None:
    """The records (objects only; a line that is not one is refused naming the file and line), or None
    when the run was never resumed with a change."""
    text = paths.read_text(run_dir, NAME)
    if text is None:
        return None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise paths.RunDirFileError(
                f"run-directory file '{Path(run_dir) / NAME}' line {i} is not a JSON object (a torn or edited line)"
            )
        out.append(obj)
    return out
