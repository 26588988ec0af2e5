"""``corner_cases.json``: corner cases, outlier epochs and the balanced epoch of a run.

Written by BalancedCheckpoint at the end of fitting (:func:`write`); the same :class:`Corners` view
is built in memory every validation (provisional). Keys (schema 1): ``schema, status, reason,
policy, monitor, mode, least_loss_epoch, reference_epoch, balanced_epoch, checkpoint,
contamination, tail, metric, min_epoch, columns, threshold, corner_cases`` (list of ``{case_id,
score, contributions}``), ``outlier_epochs`` (``{case_id: [epoch, …]}``), ``candidate_epochs``,
``dice`` (``least_loss`` / ``balanced``: per-case and cohort values), ``margin`` (the chosen epoch vs the
last one per criterion, bootstrap CI over cases: :func:`robusttrain.cornercases.margin.selection_margin`),
``policy_epochs`` (every policy's epoch among the same candidates) and ``policy_checkpoints`` (where each
one's weights are: ``balanced.ckpt`` for the run's own policy, ``balanced_picks/epoch=NNNN.ckpt`` for the
others). Values no run writes (an epoch that is not an integer 0..``MAX_EPOCH``, a balanced epoch that
was not a candidate, a checkpoint named anywhere else) are refused in one line by :func:`read`.

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

from . import values
from .paths import RunDirFileError, read_text

log = logging.getLogger(__name__)

NAME = "corner_cases.json"
SCHEMA = 1
CHECKPOINT = "balanced.ckpt"
PICKS_DIR = "balanced_picks"  # the other policies' epochs (BalancedCheckpoint keeps them after the fit)
PICK_PATTERN = PICKS_DIR + r"/epoch=[0-9]{4,}\.ckpt"


def pick_name(epoch: int) -> str:
    """Where another policy's epoch is kept, relative to the run directory.

    >>> pick_name(6)
    'balanced_picks/epoch=0006.ckpt'
    """
    return f"{PICKS_DIR}/epoch={int(epoch):04d}.ckpt"


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
    candidates: list[int] = field(default_factory=list)
    policy_epochs: dict[str, int | None] = field(default_factory=dict)
    policy_checkpoints: dict[str, str | None] = field(default_factory=dict)
    checkpoint: str | None = None


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


def parse(obj: dict[str, Any], where: str = NAME) -> Corners:
    """A written ``corner_cases.json`` object -> :class:`Corners` (the schema above, no aliases);
    :class:`RunDirFileError` naming ``where`` for a value no run writes."""
    listed = obj.get("corner_cases") or []
    candidates = values.epochs(where, "candidate_epochs", obj.get("candidate_epochs"))
    balanced = values.epoch(where, "balanced_epoch", obj.get("balanced_epoch"))
    if balanced is not None and candidates:
        values.within(where, "balanced_epoch", [balanced], candidates, "candidate_epochs")
    picks = obj.get("policy_epochs") or {}
    where_picks = obj.get("policy_checkpoints") or {}
    if not isinstance(picks, dict) or not isinstance(where_picks, dict):
        raise RunDirFileError(
            f"run-directory file '{where}': policy_epochs / policy_checkpoints must be objects"
        )
    policy_epochs = {str(p): values.epoch(where, f"policy_epochs[{p!r}]", e) for p, e in picks.items()}
    if candidates:
        values.within(
            where,
            "policy_epochs",
            [e for e in policy_epochs.values() if e is not None],
            candidates,
            "candidate_epochs",
        )
    return Corners(
        cases=[str(c["case_id"]) for c in listed],
        scores={str(c["case_id"]): float(c["score"]) for c in listed if c.get("score") is not None},
        outlier_epochs={
            str(k): values.epochs(where, f"outlier_epochs[{k!r}]", v)
            for k, v in (obj.get("outlier_epochs") or {}).items()
        },
        balanced_epoch=balanced,
        least_loss_epoch=values.epoch(where, "least_loss_epoch", obj.get("least_loss_epoch")),
        policy=obj.get("policy"),
        reason=obj.get("reason"),
        raw=obj,
        candidates=candidates,
        policy_epochs=policy_epochs,
        policy_checkpoints={
            str(p): values.own_file(where, f"policy_checkpoints[{p!r}]", f, (CHECKPOINT,), PICK_PATTERN)
            for p, f in where_picks.items()
        },
        checkpoint=values.own_file(where, "checkpoint", obj.get("checkpoint"), (CHECKPOINT,)),
    )


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
        return parse(obj, str(Path(run_dir).resolve() / NAME))
    except RunDirFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RunDirFileError(
            f"run-directory file '{Path(run_dir).resolve() / NAME}' does not follow "
            f"the corner_cases.json schema ({type(err).__name__}: {err})"
        ) from None
