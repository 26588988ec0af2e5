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
from pyod.utils.stat_models import column_ecdf

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
    det = ECOD(contamination=contamination)
    with warnings.catch_warnings():
        # constant columns make scipy's skew warn; PyOD maps the NaN skew to 0, which is what we want
        warnings.simplefilter("ignore", RuntimeWarning)
        det.fit(X)
    if tail == "both":
        contrib = np.asarray(det.O, dtype=np.float64)
        return EcodFit(
            det.decision_scores_.astype(np.float64), contrib, float(det.threshold_), det.labels_.astype(bool)
        )
    # PyOD keeps the left-tail matrix as U_l; recompute it if a future version drops the attribute.
    left = getattr(det, "U_l", None)
    if left is None or np.shape(left) != X.shape:
        left = -np.log(column_ecdf(X))
    contrib = np.asarray(left, dtype=np.float64)
    scores = contrib.sum(axis=1)
    threshold = float(np.percentile(scores, 100.0 * (1.0 - contamination)))
    return EcodFit(scores, contrib, threshold, scores > threshold)


def max_flagged(n: int, contamination: float) -> int:
    """Upper bound on how many of ``n`` samples one fit can flag (PyOD's percentile rule)."""
    return int(np.floor(1.0 + contamination * max(n - 1, 0) + 1e-9)) if n > 0 else 0
