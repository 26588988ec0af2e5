"""``corner_cases.json``: corner cases, outlier epochs and the balanced epoch of a run.

Written by BalancedCheckpoint at the end of fitting (:func:`write`); the same :class:`Corners` view
is built in memory every validation (provisional). Keys (schema 1): ``schema, status, reason,
policy, monitor, mode, least_loss_epoch, reference_epoch, balanced_epoch, checkpoint,
contamination, tail, metric, min_epoch, columns, threshold, corner_cases`` (list of ``{case_id,
score, contributions}``), ``outlier_epochs`` (``{case_id: [epoch, …]}``), ``candidate_epochs``,
``dice`` (``least_loss`` / ``balanced``: per-case and cohort values), ``margin`` (the chosen epoch vs the
last one per criterion, bootstrap CI over cases: :func:`robusttrain.cornercases.margin.selection_margin`).

>>> c = parse({"corner_cases": [{"case_id": "p3", "score": 9.1}], "balanced_epoch": 4,
...            "least_loss_epoch": 7, "policy": "last_inlier", "outlier_epochs": {"p3": [1]}})
>>> c.cases, c.balanced_epoch, c.least_loss_epoch, c.outlier_epochs
(['p3'], 4, 7, {'p3': [1]})
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from .paths import RunDirFileError, read_text

log = logging.getLogger(__name__)

NAME = "corner_cases.json"
SCHEMA = 1


@dataclass
class Corners:
    """What reporting shows of a corner-case analysis (final, or provisional during training)."""

    cases: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    outlier_epochs: dict[str, list[int]] = field(default_factory=dict)
    balanced_epoch: int | None = None
    least_loss_epoch: int | None = None
    policy: str | None = None
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def from_selection(sel: Any, least_loss_epoch: int | None, reason: str | None = None) -> Corners:
    """A :class:`Corners` of a :class:`robusttrain.cornercases.Selection`."""
    cc = sel.corner_cases
    return Corners(
        cases=[str(c) for c in cc.case_ids],
        scores={str(k): float(v) for k, v in cc.scores.items()},
        outlier_epochs={str(k): [int(e) for e in v] for k, v in sel.outlier_epochs.items()},
        balanced_epoch=sel.epoch,
        least_loss_epoch=least_loss_epoch,
        policy=sel.policy,
        reason=reason if reason is not None else sel.reason,
    )


def parse(obj: dict[str, Any]) -> Corners:
    """A written ``corner_cases.json`` object -> :class:`Corners` (the schema above, no aliases)."""
    listed = obj.get("corner_cases") or []
    return Corners(
        cases=[str(c["case_id"]) for c in listed],
        scores={str(c["case_id"]): float(c["score"]) for c in listed if c.get("score") is not None},
        outlier_epochs={str(k): [int(e) for e in v] for k, v in (obj.get("outlier_epochs") or {}).items()},
        balanced_epoch=_int(obj.get("balanced_epoch")),
        least_loss_epoch=_int(obj.get("least_loss_epoch")),
        policy=obj.get("policy"),
        reason=obj.get("reason"),
        raw=obj,
    )


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def write(run_dir: str | os.PathLike, report: dict[str, Any]) -> Path:
    return atomic_write_json(Path(run_dir) / NAME, {"schema": SCHEMA, **report})


def read_raw(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object, None when absent; :class:`RunDirFileError` when it is not one."""
    text = read_text(run_dir, NAME)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunDirFileError(
            f"run-directory file '{Path(run_dir).resolve() / NAME}' is not valid JSON "
            f"(line {err.lineno}: {err.msg})"
        ) from None
    if not isinstance(obj, dict):
        raise RunDirFileError(
            f"run-directory file '{Path(run_dir).resolve() / NAME}' holds a "
            f"{type(obj).__name__}, expected a JSON object"
        )
    return obj


def read(run_dir: str | os.PathLike) -> Corners | None:
    """``corner_cases.json`` -> :class:`Corners`, or None when absent; RunDirFileError when malformed."""
    obj = read_raw(run_dir)
    if obj is None:
        return None
    try:
        return parse(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RunDirFileError(
            f"run-directory file '{Path(run_dir).resolve() / NAME}' does not follow "
            f"the corner_cases.json schema ({type(err).__name__}: {err})"
        ) from None
