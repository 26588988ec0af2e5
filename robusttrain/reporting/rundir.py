"""Read a run directory's files (see docs/design.md, "Run directory files").

Every loader returns ``None`` when its file is missing or unreadable, so plots and the HTML report
degrade section by section instead of failing. Nothing here recomputes analysis: EFR, corner cases
and the balanced epoch are read as their writers stored them.

>>> import tempfile
>>> load_history(tempfile.mkdtemp()) is None
True
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

HISTORY = "history.csv"
EFR = "efr.csv"
EFR_TABLE = "efr_table.csv"
CORNERS = "corner_cases.json"
FAILURES = "failures/failures.jsonl"
CONFIG = "config.yaml"


def _csv(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, OSError) as err:
        log.warning("cannot read %s: %s", path, err)
        return None
    return frame if len(frame) else None


def load_history(run_dir: str | Path) -> pd.DataFrame | None:
    """``history.csv``: one row per (case_id, epoch), ``dice_<class>``/``iou_<class>`` columns."""
    frame = _csv(Path(run_dir) / HISTORY)
    if frame is not None:
        frame["case_id"] = frame["case_id"].astype(str)
    return frame


def load_efr(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr.csv``: ``epoch,split,perturbation,severity,metric,threshold,errors,cases,efr``."""
    return _csv(Path(run_dir) / EFR)


EFR_KEYS = ["epoch", "split", "perturbation", "metric", "threshold"]


def pool_severities(efr: pd.DataFrame) -> pd.DataFrame:
    """One row per (epoch, split, perturbation, metric, threshold), EFR as a fraction.

    The MetamorphicCallback writes a pooled row (``severity == 0``) next to the per-severity ones;
    use it where present (summing it too would double-count), else pool errors / cases.

    >>> e = pd.DataFrame({"epoch": 0, "split": "val", "perturbation": "blur", "metric": "dice",
    ...                   "threshold": 0.5, "severity": [2, 4, 0], "errors": [1, 3, 4],
    ...                   "cases": [10, 10, 20], "efr": 0.0})
    >>> pool_severities(e)[["errors", "cases", "efr"]].values.tolist()
    [[4.0, 20.0, 0.2]]
    """
    keys = [k for k in EFR_KEYS if k in efr.columns]
    is_pooled = efr["severity"] == 0 if "severity" in efr else pd.Series(False, index=efr.index)
    pooled = efr[is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = efr[~is_pooled].groupby(keys)[["errors", "cases"]].sum()
    summed = summed[~summed.index.isin(pooled.index)]
    out = pd.concat([pooled, summed]).astype(float).reset_index()
    out["efr"] = out["errors"] / out["cases"].where(out["cases"] > 0)
    return out


def load_efr_table(run_dir: str | Path) -> pd.DataFrame | None:
    """``efr_table.csv`` written by ``robusttrain check`` (already in the paper's layout)."""
    return _csv(Path(run_dir) / EFR_TABLE)


def load_config_text(run_dir: str | Path) -> str | None:
    path = inside(run_dir, CONFIG)
    return path.read_text() if path is not None else None


def inside(run_dir: str | Path, path: str | Path | None) -> Path | None:
    """``path`` (relative to ``run_dir`` or absolute) as an existing file inside ``run_dir``, else None.

    The report embeds files; which ones must not be up to the contents of a run's files (a path in
    ``failures.jsonl`` could name any file on the machine). Symlinks are resolved first.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.png").write_bytes(b"x")
    >>> inside(d, "a.png") is not None, inside(d, "/etc/passwd"), inside(d, "../a.png")
    (True, None, None)
    """
    if not path:
        return None
    root = Path(run_dir).resolve()
    try:
        p = (root / path).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return p if p.is_relative_to(root) and p.is_file() else None


def load_failures(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """``failures/failures.jsonl`` as FailureRecord dicts (with ``id``, ``drop``, ``thumb``).

    The FailureBank's log is append-only batches: ``{"kind": "failure", "id": ...}`` lines, each
    batch closed by a ``{"kind": "batch"}`` marker; a later line for the same id replaces the
    earlier one. Lines without ``kind`` are taken as plain records. A torn last line is skipped.
    ``thumb`` is the strip ``failures/thumbs/<id>.png`` when it exists (only the worst have one);
    a ``thumb`` written in the file itself is ignored (see :func:`inside`).
    """
    path = Path(run_dir) / FAILURES
    if not path.is_file():
        return None
    by_id: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines()):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being appended right now; the next read gets it
        if not isinstance(rec, dict) or rec.get("kind", "failure") != "failure":
            continue
        rid = str(rec.get("id", n))
        rec.setdefault("drop", _drop(rec))
        rec.pop("thumb", None)
        if isinstance(rec.get("extra"), dict):
            rec["extra"].pop("thumb", None)
        thumb = inside(run_dir, Path("failures") / "thumbs" / f"{rid}.png")
        if thumb is not None:
            rec["thumb"] = str(thumb)
        by_id[rid] = rec
    return list(by_id.values())


def _drop(rec: dict[str, Any]) -> float:
    src, fol = float(rec.get("src_dice", 0.0)), float(rec.get("fol_dice", 0.0))
    return 0.0 if src <= 0 else (src - fol) / src


def dice_columns(history: pd.DataFrame) -> list[str]:
    """Per-class Dice columns, in file order (``dice_rv``, ``dice_myo`` …)."""
    return [c for c in history.columns if c.startswith("dice_")]


def cohort_mean(history: pd.DataFrame, column: str) -> pd.Series:
    """Mean over cases of ``column`` per epoch (index: epoch) — the cohort curve."""
    return history.groupby("epoch")[column].mean().sort_index()


def clean_dice(history: pd.DataFrame) -> pd.DataFrame:
    """Cohort-mean Dice per epoch and class, plus ``mean`` over classes (index: epoch)."""
    cols = dice_columns(history)
    frame = history.groupby("epoch")[cols].mean().sort_index()
    frame.columns = [c[len("dice_"):] for c in cols]
    frame["mean"] = frame.mean(axis=1)
    return frame


@dataclass
class Corners:
    """What reporting needs from ``corner_cases.json``, whatever the writer's exact nesting."""

    cases: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    outlier_epochs: dict[str, list[int]] = field(default_factory=dict)
    balanced_epoch: int | None = None
    least_loss_epoch: int | None = None
    policy: str | None = None
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return None


def _epoch(value: Any) -> int | None:
    # the epoch may be stored bare or as {"epoch": e, ...}
    if isinstance(value, dict):
        value = _first(value, "epoch")
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def parse_corners(obj: dict[str, Any]) -> Corners:
    """Normalise a ``corner_cases.json`` object.

    >>> c = parse_corners({"corner_cases": [{"case_id": "p3", "score": 9.1}],
    ...                    "balanced_epoch": 4, "least_loss_epoch": 7, "policy": "last_inlier"})
    >>> c.cases, c.balanced_epoch, c.least_loss_epoch
    (['p3'], 4, 7)
    """
    out = Corners(raw=obj)
    listed = _first(obj, "corner_cases", "cases")
    if isinstance(listed, dict):  # {"cases": [...], ...} nesting
        listed = _first(listed, "cases", "corner_cases") or []
    for item in listed or []:
        if isinstance(item, dict):
            cid = str(_first(item, "case_id", "case", "id"))
            out.cases.append(cid)
            if _first(item, "score") is not None:
                out.scores[cid] = float(item["score"])
            if _first(item, "outlier_epochs") is not None:
                out.outlier_epochs[cid] = [int(e) for e in item["outlier_epochs"]]
        else:
            out.cases.append(str(item))
    epochs = _first(obj, "outlier_epochs")
    if isinstance(epochs, dict):
        for cid, eps in epochs.items():
            if isinstance(eps, dict):
                eps = _first(eps, "epochs", "outlier_epochs") or []
            out.outlier_epochs.setdefault(str(cid), [int(e) for e in eps])
    chosen = _first(obj, "balanced", "chosen", "selection")
    out.balanced_epoch = _epoch(_first(obj, "balanced_epoch", "chosen_epoch", "epoch")) \
        if _first(obj, "balanced_epoch", "chosen_epoch", "epoch") is not None else _epoch(chosen)
    out.least_loss_epoch = _epoch(_first(obj, "least_loss_epoch", "best_epoch", "least_loss",
                                         "monitored_epoch"))
    src = chosen if isinstance(chosen, dict) else obj
    out.policy = _first(src, "policy") or _first(obj, "policy")
    out.reason = _first(src, "reason") or _first(obj, "reason")
    return out


def load_corners(run_dir: str | Path) -> Corners | None:
    """``corner_cases.json`` → :class:`Corners`, or ``None`` when absent/unreadable."""
    path = Path(run_dir) / CORNERS
    if not path.is_file():
        return None
    try:
        return parse_corners(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        log.warning("cannot read %s: %s", path, err)
        return None
