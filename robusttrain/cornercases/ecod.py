"""ECOD scores with a choice of tail, on top of PyOD's ECOD.

PyOD's ECOD is two-sided: per dimension it keeps the larger of the left-tail score
``-log F(x)``, the right-tail score ``-log(1 - F(x))`` and a skewness-corrected one, then sums.
For Dice a *high* value is never a failure, so ``tail="low"`` keeps only the left-tail term
(``ECOD.U_l``, which PyOD computes during ``fit``): a patient is scored by how far into the
*bottom* of every structure's distribution it sits. The threshold then follows PyOD's own rule
(the ``100·(1-contamination)`` percentile of the scores, flag strictly above it), so both tails
flag at most about ``1 + contamination·(n-1)`` samples.

>>> import numpy as np
>>> X = np.array([[0.9, 0.8], [0.91, 0.82], [0.89, 0.79], [0.92, 0.81], [0.2, 0.1], [0.9, 0.8]])
>>> fit = ecod_fit(X, contamination=0.1, tail="low")
>>> np.flatnonzero(fit.labels).tolist()
[4]
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from pyod.models.ecod import ECOD

from robusttrain.validate import check_choice, check_fraction

TAILS = ("low", "both")
MAX_CONTAMINATION = 0.5  # PyOD's ECOD refuses more


@dataclass
class EcodFit:
    scores: np.ndarray  # (n,) higher = more abnormal
    contributions: np.ndarray  # (n, d) per-dimension terms that sum to ``scores``
    threshold: float
    labels: np.ndarray  # (n,) bool, True = outlier


def check_args(contamination: float, tail: str) -> float:
    """Validate the ECOD arguments; returns ``contamination`` as a float."""
    check_choice("tail", tail, TAILS)
    return check_fraction(
        "contamination",
        contamination,
        0.0,
        MAX_CONTAMINATION,
        lo_open=True,
        why="the share of outliers; PyOD's ECOD accepts at most 0.5",
    )


def ecod_fit(X: np.ndarray, contamination: float = 0.1, tail: str = "low") -> EcodFit:
    """Fit ECOD transductively on ``X`` (n samples × d dims, no NaN) and score the same rows."""
    check_args(contamination, tail)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or not np.isfinite(X).all():
        raise ValueError("ECOD needs a finite 2-D matrix")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"ECOD needs at least one sample and one dimension, got a {X.shape} matrix")
    if tail == "both":
        det = ECOD(contamination=contamination)
        with warnings.catch_warnings():
            # constant columns make scipy's skew warn; PyOD maps the NaN skew to 0, which is what we want
            warnings.simplefilter("ignore", RuntimeWarning)
            det.fit(X)
        contrib = np.asarray(det.O, dtype=np.float64)
        return EcodFit(
            det.decision_scores_.astype(np.float64), contrib, float(det.threshold_), det.labels_.astype(bool)
        )
    # the left-tail term PyOD's fit keeps as U_l (-1 * log of its column ECDF), computed directly: the
    # rest of PyOD's fit (right tail, skewness, its threshold) is not used here, and its ECDF is a numba
    # function whose compilation cost ~0.4 s of CPU in every process that ran an analysis
    left = -1 * np.log(column_ecdf(X))
    contrib = np.asarray(left, dtype=np.float64)
    scores = contrib.sum(axis=1)
    threshold = float(np.percentile(scores, 100.0 * (1.0 - contamination)))
    return EcodFit(scores, contrib, threshold, scores > threshold)


def column_ecdf(X: np.ndarray) -> np.ndarray:
    """Per column, the empirical CDF at each value, ``P(x' <= x)``: the same numbers as PyOD's
    ``pyod.utils.stat_models.column_ecdf`` (its ``linspace`` probabilities; tied values share the
    probability of the last of them in sorted order), in numpy instead of a numba loop.

    >>> column_ecdf(np.array([[3.0], [1.0], [3.0], [2.0]]))[:, 0].tolist()
    [1.0, 0.25, 1.0, 0.5]
    """
    n, d = X.shape
    probabilities = np.linspace(np.ones(d) / n, np.ones(d), n)
    order = np.argsort(X, axis=0)
    ordered = np.take_along_axis(X, order, axis=0)
    # a row ends a run of equal values when the next sorted value differs (or it is the last row);
    # every row takes the probability at the end of its run (PyOD: a backward copy over equal neighbours)
    ends = np.ones((n, d), dtype=bool)
    ends[:-1] = ordered[:-1] != ordered[1:]
    rows = np.where(ends, np.arange(n)[:, None], n)
    run_end = np.minimum.accumulate(rows[::-1], axis=0)[::-1]
    probabilities = np.take_along_axis(probabilities, run_end, axis=0)
    out = np.ones_like(probabilities)
    np.put_along_axis(out, order, probabilities, axis=0)
    return out


def max_flagged(n: int, contamination: float) -> int:
    """Upper bound on how many of ``n`` samples one fit can flag (PyOD's percentile rule)."""
    return int(np.floor(1.0 + contamination * max(n - 1, 0) + 1e-9)) if n > 0 else 0
