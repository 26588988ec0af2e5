"""How sure is a balanced-epoch choice? A bootstrap CI of its margin over simply taking the last epoch.

For each per-epoch criterion of :func:`~robusttrain.cornercases.balanced.epoch_table` (``cohort``:
mean per-case Dice; ``worst``: the worst corner case, all cases when there is none; ``cvar``: mean
of the worst ``worst_fraction`` of cases) the margin is ``criterion(chosen) - criterion(last)``;
its CI comes from :func:`scipy.stats.bootstrap` resampling *cases*, paired (a case keeps its two
scores). The policy's own criterion is named in ``criterion``: ``maximin`` -> worst, ``cvar`` ->
cvar, ``pareto`` -> cohort (its other axis, worst, is reported too), ``last_inlier`` -> worst (the
corner cases it drops outlier epochs to protect). A validation set under :data:`MIN_CASES` cases
gets a ``warning``: with so few cases the choice is mostly noise (docs/results.md).

>>> import pandas as pd
>>> from robusttrain.cornercases import select_balanced_epoch
>>> rows = [{"case_id": f"p{c}", "epoch": e, "dice_lv": 0.5 + 0.04 * e + 0.001 * c}
...         for c in range(6) for e in range(8)]
>>> rows[-1]["dice_lv"] = 0.05   # p5 collapses at the last epoch
>>> m = selection_margin(pd.DataFrame(rows), select_balanced_epoch(pd.DataFrame(rows)), n_resamples=200)
>>> m["chosen_epoch"], m["last_epoch"], m["criterion"], round(m["margins"]["worst"]["value"], 3)
(6, 7, 'worst', 0.695)
>>> m["warning"].startswith("the selection rests on 6 validation cases (< 100)")
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from .history import HistoryLike, case_scores, load_history, metric_columns

MIN_CASES = 100
CRITERIA = {"last_inlier": "worst", "maximin": "worst", "cvar": "cvar", "pareto": "cohort"}


def _cvar(k: float) -> Callable[[np.ndarray, int], np.ndarray]:
    def stat(x: np.ndarray, axis: int = -1) -> np.ndarray:
        s = np.sort(np.moveaxis(x, axis, -1), axis=-1)
        m = max(1, int(np.ceil(k * s.shape[-1] - 1e-9)))  # as worst_fraction_mean: ceil(k·n), at least 1
        return s[..., :m].mean(axis=-1)

    return stat


def _interval(
    a: np.ndarray, b: np.ndarray, stat: Callable, confidence: float, n_resamples: int, seed: int
) -> dict[str, Any]:
    value = float(stat(a, -1) - stat(b, -1))
    out = {"value": value, "ci_low": None, "ci_high": None, "n": int(a.size)}
    if np.array_equal(a, b):  # same scores (e.g. chosen = last): every resample gives 0
        out["ci_low"] = out["ci_high"] = 0.0
        return out
    if a.size < 2:  # one case: nothing to resample
        return out
    res = bootstrap(
        (a, b),
        lambda x, y, axis=-1: stat(x, axis) - stat(y, axis),
        paired=True,
        vectorized=True,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    out["ci_low"], out["ci_high"] = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return out


def selection_margin(
    history: HistoryLike,
    selection: Any,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    metric: str = "dice",
) -> dict[str, Any]:
    """The chosen epoch's margin over the last epoch, per criterion, with a paired bootstrap CI.

    ``selection`` is a :class:`~robusttrain.cornercases.Selection` on ``history``. Same inputs and
    ``seed`` -> the same numbers. Returns ``status="not_available"`` (with ``reason``) when no epoch
    was chosen or no case has a score at both epochs.
    """
    h = load_history(history)
    base = {
        "policy": selection.policy,
        "criterion": CRITERIA.get(selection.policy),
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
        "method": "percentile bootstrap over cases, paired",
        "chosen_epoch": selection.epoch,
        "last_epoch": int(h["epoch"].max()) if not h.empty else None,
        "n_cases": 0,
        "margins": {},
        "warning": None,
    }
    if selection.epoch is None or h.empty:
        return {**base, "status": "not_available", "reason": "no epoch was chosen"}
    cols = selection.corner_cases.columns or metric_columns(h, metric)
    scores = h.assign(_s=case_scores(h, cols).to_numpy()).pivot(index="case_id", columns="epoch", values="_s")
    pair = (
        scores[[selection.epoch, base["last_epoch"]]].dropna(how="any") if selection.epoch in scores else None
    )
    if pair is None or pair.empty:
        return {
            **base,
            "status": "not_available",
            "reason": f"no case has a score at both epoch {selection.epoch} and epoch {base['last_epoch']}",
        }
    corners = [c for c in selection.corner_cases.case_ids if c in pair.index]
    groups: dict[str, tuple[pd.DataFrame, Callable[..., Any]]] = {
        "cohort": (pair, np.mean),
        "worst": (pair.loc[corners] if corners else pair, np.min),
        "cvar": (pair, _cvar(selection.worst_fraction)),
    }
    margins = {}
    for name, (sub, stat) in groups.items():
        a, b = (sub.iloc[:, i].to_numpy(np.float64) for i in (0, 1))
        margins[name] = _interval(a, b, stat, confidence, n_resamples, seed)
    n = int(len(pair))
    out = {**base, "status": "ok", "reason": "", "n_cases": n, "margins": margins}
    if n < MIN_CASES:
        m = margins[out["criterion"] or "cohort"]
        ci = (
            "no CI"
            if m["ci_low"] is None
            else f"{100 * confidence:g} % CI [{m['ci_low']:+.4f}, {m['ci_high']:+.4f}]"
        )
        out["warning"] = (
            f"the selection rests on {n} validation cases (< {MIN_CASES}): its margin over the "
            f"last epoch ({out['criterion']} {m['value']:+.4f}, {ci}) is within the noise of a "
            "set this small; treat balanced.ckpt as a diagnostic, not a better model"
        )
    return out
