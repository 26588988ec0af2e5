"""Corner cases (ECOD across cases at one epoch) and outlier epochs (ECOD across one case's epochs).

>>> import pandas as pd
>>> rows = [{"case_id": f"p{i}", "epoch": 0, "dice_lv": 0.9 + 0.01 * i, "dice_rv": 0.8 + 0.01 * i}
...         for i in range(9)] + [{"case_id": "bad", "epoch": 0, "dice_lv": 0.3, "dice_rv": 0.2}]
>>> find_corner_cases(pd.DataFrame(rows)).case_ids
['bad']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from .ecod import check_args, ecod_fit
from .history import HistoryLike, load_history, metric_columns

MIN_SAMPLES = 5  # below this an ECDF has too few steps for a tail to mean anything
OK, NOT_ENOUGH = "ok", "not_enough_data"


@dataclass
class CornerCaseResult:
    """Flagged cases (most abnormal first) plus the scores of every analysed case."""

    epoch: int | None
    status: str
    reason: str
    metric: str
    tail: str
    contamination: float
    columns: list[str]
    case_ids: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    contributions: dict[str, dict[str, float]] = field(default_factory=dict)
    threshold: float | None = None
    skipped: list[str] = field(default_factory=list)  # cases with a NaN/missing value at this epoch

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class OutlierEpochResult:
    """Outlier (collapse) epochs of one case, ascending, plus the score of every analysed epoch."""

    case_id: str
    status: str
    reason: str
    tail: str
    contamination: float
    columns: list[str]
    epochs: list[int] = field(default_factory=list)
    scores: dict[int, float] = field(default_factory=dict)
    contributions: dict[int, dict[str, float]] = field(default_factory=dict)
    threshold: float | None = None
    skipped: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return asdict(self)


def _fit_rows(matrix: pd.DataFrame, contamination: float, tail: str):
    """ECOD on the complete rows of ``matrix``; returns (scores, contributions, threshold, flagged)."""
    fit = ecod_fit(matrix.to_numpy(), contamination=contamination, tail=tail)
    keys = list(matrix.index)
    cols = list(matrix.columns)
    scores = {k: float(s) for k, s in zip(keys, fit.scores)}
    contrib = {k: {c: float(v) for c, v in zip(cols, row)} for k, row in zip(keys, fit.contributions)}
    flagged = [k for k, f in zip(keys, fit.labels) if f]
    return scores, contrib, fit.threshold, flagged


def find_corner_cases(
    history: HistoryLike,
    epoch: int | None = None,
    contamination: float = 0.1,
    tail: str = "low",
    metric: str = "dice",
) -> CornerCaseResult:
    """ECOD across cases on their ``<metric>_<class>`` vectors at ``epoch`` (None = last epoch).

    ``tail="low"`` (default) flags only cases in the low-performance tail; ``"both"`` is the paper's
    two-sided PyOD ECOD. Cases with a NaN at that epoch are left out and listed in ``skipped``.
    """
    check_args(contamination, tail)
    return corner_cases_of(load_history(history), epoch, contamination, tail, metric)


def corner_cases_of(
    h: pd.DataFrame, epoch: int | None, contamination: float, tail: str, metric: str
) -> CornerCaseResult:
    """:func:`find_corner_cases` on a history already cleaned by :func:`load_history` (arguments checked):
    a selection analyses one history for the corner cases and each one's epochs, cleaning it once."""
    cols = metric_columns(h, metric)
    res = CornerCaseResult(None, NOT_ENOUGH, "", metric, tail, float(contamination), cols)
    if h.empty:
        res.reason = "history is empty"
        return res
    epoch = int(h["epoch"].max()) if epoch is None else int(epoch)
    res.epoch = epoch
    at = h[h["epoch"] == epoch].set_index("case_id")[cols].sort_index()
    complete = at.dropna(how="any")
    res.skipped = sorted(set(at.index) - set(complete.index))
    if len(complete) < MIN_SAMPLES:
        res.reason = f"not enough data: {len(complete)} complete case(s) at epoch {epoch} (< {MIN_SAMPLES})"
        return res
    res.scores, res.contributions, res.threshold, flagged = _fit_rows(complete, contamination, tail)
    # most abnormal first; ties broken by case id so the order never depends on input order
    res.case_ids = sorted(flagged, key=lambda k: (-res.scores[k], k))
    res.status = OK
    res.reason = f"{len(res.case_ids)} of {len(complete)} case(s) above the ECOD threshold at epoch {epoch}"
    return res


def find_outlier_epochs(
    history: HistoryLike,
    case_id: str,
    contamination: float = 0.1,
    tail: str = "low",
    metric: str = "dice",
    min_epoch: int = 0,
    epochs: list[int] | None = None,
) -> OutlierEpochResult:
    """ECOD across the epochs of one case (epochs × dims); refit from scratch on every call.

    ``tail="low"`` flags collapses only. ``min_epoch`` / ``epochs`` restrict the analysed epochs,
    e.g. to skip warm-up epochs that are low simply because training had just started.
    """
    check_args(contamination, tail)
    return outlier_epochs_of(load_history(history), case_id, contamination, tail, metric, min_epoch, epochs)


def outlier_epochs_of(
    h: pd.DataFrame,
    case_id: str,
    contamination: float,
    tail: str,
    metric: str,
    min_epoch: int = 0,
    epochs: list[int] | None = None,
) -> OutlierEpochResult:
    """:func:`find_outlier_epochs` on a history already cleaned by :func:`load_history` (arguments checked)."""
    cols = metric_columns(h, metric)
    case_id = str(case_id)
    res = OutlierEpochResult(case_id, NOT_ENOUGH, "", tail, float(contamination), cols)
    rows = h[(h["case_id"] == case_id) & (h["epoch"] >= int(min_epoch))]
    if epochs is not None:
        rows = rows[rows["epoch"].isin([int(e) for e in epochs])]
    if rows.empty:
        res.reason = f"case {case_id!r} has no rows in the history"
        return res
    mat = rows.set_index("epoch")[cols].sort_index()
    complete = mat.dropna(how="any")
    res.skipped = sorted(int(e) for e in set(mat.index) - set(complete.index))
    if len(complete) < MIN_SAMPLES:
        res.reason = f"not enough data: {len(complete)} complete epoch(s) for {case_id!r} (< {MIN_SAMPLES})"
        return res
    complete.index = complete.index.astype(int)
    res.scores, res.contributions, res.threshold, flagged = _fit_rows(complete, contamination, tail)
    res.epochs = sorted(int(e) for e in flagged)
    res.status = OK
    res.reason = f"{len(res.epochs)} of {len(complete)} epoch(s) above the ECOD threshold"
    return res
