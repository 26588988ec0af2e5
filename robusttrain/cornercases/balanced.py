"""Balanced-epoch selection: drop the corner cases' outlier epochs, then apply a policy.

Policies (all choose among *inlier* candidate epochs, ties go to the later epoch):
- ``last_inlier`` — paper 004: the last remaining epoch.
- ``maximin`` — the epoch whose worst corner case (mean Dice over classes) is best.
- ``pareto`` — among epochs on the Pareto front of (cohort mean, worst-case), the one closest
  to the utopia point (best cohort mean, best worst-case) — both are Dice, so no rescaling.
- ``cvar`` — the epoch with the best mean Dice over the worst ``worst_fraction`` of *all* cases
  (CVaR of the per-case Dice; ``ceil(k·n)`` cases, at least one, re-ranked at every epoch). Unlike
  ``maximin`` it does not hang on one corner case, so one noisy case cannot decide the epoch.
"Worst case" is over the corner cases; when there are none, over all cases.

>>> import pandas as pd
>>> rows = [{"case_id": f"p{c}", "epoch": e, "dice_lv": 0.5 + 0.04 * e + 0.001 * c}
...         for c in range(6) for e in range(8)]
>>> rows[-1]["dice_lv"] = 0.05   # p5 collapses at the last epoch
>>> s = select_balanced_epoch(pd.DataFrame(rows))
>>> (s.epoch, s.corner_cases.case_ids, s.outlier_epochs)
(6, ['p5'], {'p5': [7]})
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from robusttrain.validate import check_choice, check_fraction

from .detect import NOT_ENOUGH, OK, CornerCaseResult, corner_cases_of, outlier_epochs_of
from .ecod import check_args
from .history import HistoryLike, case_scores, load_history, metric_columns

POLICIES = ("last_inlier", "maximin", "pareto", "cvar")
NO_INLIER = "no_inlier_epoch"


@dataclass
class Selection:
    epoch: int | None
    policy: str
    status: str  # ok | not_enough_data | no_inlier_epoch
    reason: str
    reference_epoch: int | None
    corner_cases: CornerCaseResult
    outlier_epochs: dict[str, list[int]] = field(default_factory=dict)
    candidates: list[int] = field(default_factory=list)
    inlier_epochs: list[int] = field(default_factory=list)
    # per candidate epoch: {"cohort": mean over cases, "worst": worst-case mean,
    # "cvar": mean of the worst ``worst_fraction`` of cases}
    worst_fraction: float = 0.1
    table: dict[int, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["corner_cases"] = self.corner_cases.to_dict()
        return d


def check_worst_fraction(worst_fraction: float) -> float:
    """``worst_fraction`` as a float in (0, 1]; ValueError naming the value otherwise."""
    return check_fraction("worst_fraction", worst_fraction, 0.0, 1.0, lo_open=True)


def worst_fraction_mean(scores, worst_fraction: float = 0.1) -> float:
    """Mean of the lowest ``ceil(k·n)`` (at least one) finite scores: the CVaR of per-case Dice.

    >>> worst_fraction_mean([0.9, 0.8, 0.1, 0.7, 0.3], 0.4)
    0.2
    """
    k = check_worst_fraction(worst_fraction)
    v = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan")
    n = max(1, int(np.ceil(k * v.size - 1e-9)))  # 1e-9: 0.1·30 must be 3, not 4
    return float(v[:n].mean())


def epoch_table(
    history: pd.DataFrame, columns: list[str], worst_of: list[str], worst_fraction: float = 0.1
) -> pd.DataFrame:
    """Per epoch: cohort mean of per-case mean Dice, the minimum over ``worst_of`` (or all cases)
    and ``cvar``, the mean over the worst ``worst_fraction`` of all cases."""
    h = history.assign(_score=case_scores(history, columns).to_numpy())
    cohort = h.groupby("epoch")["_score"].mean()
    sub = h[h["case_id"].isin(worst_of)] if worst_of else h
    worst = sub.groupby("epoch")["_score"].min().reindex(cohort.index)
    cvar = h.groupby("epoch")["_score"].apply(lambda s: worst_fraction_mean(s, worst_fraction))
    return pd.DataFrame({"cohort": cohort, "worst": worst, "cvar": cvar.reindex(cohort.index)})


def _pareto_pick(tab: pd.DataFrame) -> tuple[int, str]:
    vals = tab.fillna(-np.inf)
    front = []
    for e, r in vals.iterrows():
        dominated = (
            (vals["cohort"] >= r["cohort"])
            & (vals["worst"] >= r["worst"])
            & ((vals["cohort"] > r["cohort"]) | (vals["worst"] > r["worst"]))
        ).any()
        if not dominated:
            front.append(int(e))
    f = vals.loc[front]
    utopia = (f["cohort"].max(), f["worst"].max())
    dist = np.hypot(utopia[0] - f["cohort"], utopia[1] - f["worst"])
    best = int(max(front, key=lambda e: (-round(float(dist[e]), 12), e)))
    return best, (
        f"Pareto front {sorted(front)}; epoch {best} is closest to utopia "
        f"(cohort {utopia[0]:.4f}, worst {utopia[1]:.4f})"
    )


def select_balanced_epoch(
    history: HistoryLike,
    policy: str = "last_inlier",
    *,
    reference_epoch: int | None = None,
    candidates: Iterable[int] | None = None,
    contamination: float = 0.1,
    tail: str = "low",
    metric: str = "dice",
    min_epoch: int = 0,
    worst_fraction: float = 0.1,
) -> Selection:
    """Pick the balanced epoch.

    Corner cases are found at ``reference_epoch`` (the least-loss epoch; None = last epoch), their
    outlier epochs over all epochs ``>= min_epoch``; only ``candidates`` (default: every epoch
    ``>= min_epoch`` in the history, e.g. the epochs whose weights were kept) can be chosen.
    ``worst_fraction`` is the share of cases the ``cvar`` policy averages (in (0, 1]).
    Fewer than 5 cases → ``status="not_enough_data"`` and the last candidate epoch.
    """
    check_choice("policy", policy, POLICIES)
    worst_fraction = check_worst_fraction(worst_fraction)
    h = load_history(history)
    cols = metric_columns(h, metric)
    all_epochs = sorted(int(e) for e in h["epoch"].unique() if e >= min_epoch)
    cands = all_epochs if candidates is None else sorted({int(e) for e in candidates} & set(all_epochs))
    check_args(contamination, tail)
    cc = corner_cases_of(h, reference_epoch, contamination, tail, metric)  # h is clean: not re-loaded
    sel = Selection(
        None, policy, NOT_ENOUGH, "", cc.epoch, cc, candidates=cands, worst_fraction=worst_fraction
    )
    if not cands:
        sel.reason = "not enough data: no candidate epoch in the history"
        return sel
    if not cc.ok:
        sel.epoch = cands[-1]
        sel.reason = f"{cc.reason}; falling back to the last candidate epoch {cands[-1]}"
        return sel
    bad: dict[int, int] = {}
    for case in cc.case_ids:
        oe = outlier_epochs_of(h, case, contamination, tail, metric, min_epoch)
        sel.outlier_epochs[case] = oe.epochs
        for e in oe.epochs:
            bad[e] = bad.get(e, 0) + 1
    sel.inlier_epochs = [e for e in cands if e not in bad]
    tab = epoch_table(h, cols, cc.case_ids, worst_fraction).loc[cands]
    sel.table = {int(e): {k: float(v) for k, v in r.items()} for e, r in tab.iterrows()}
    pool, sel.status = sel.inlier_epochs, OK
    prefix = ""
    if not pool:
        # every candidate collapses for some corner case: take those flagged by the fewest
        fewest = min(bad[e] for e in cands)
        pool = [e for e in cands if bad[e] == fewest]
        sel.status = NO_INLIER
        prefix = f"no inlier candidate epoch; using the {len(pool)} flagged for the fewest corner cases. "
    nflag = sum(len(v) for v in sel.outlier_epochs.values())
    what = (
        f"{len(cc.case_ids)} corner case(s) at epoch {cc.epoch}, "
        f"{len(bad)} distinct outlier epoch(s) ({nflag} flags) removed"
    )
    if policy == "last_inlier":
        sel.epoch = pool[-1]
        sel.reason = f"{prefix}{what}; last remaining epoch is {sel.epoch}"
    elif policy == "maximin":
        sub = tab.loc[pool]
        worst = sub["worst"].fillna(-np.inf)
        sel.epoch = int(
            max(pool, key=lambda e: (round(float(worst[e]), 12), round(float(sub["cohort"][e]), 12), e))
        )
        sel.reason = (
            f"{prefix}{what}; epoch {sel.epoch} has the best worst-case Dice {float(worst[sel.epoch]):.4f}"
        )
    elif policy == "cvar":
        cv = tab.loc[pool, "cvar"].fillna(-np.inf)
        # ties (to 1e-12) go to the later epoch, as for every policy
        sel.epoch = int(max(pool, key=lambda e: (round(float(cv[e]), 12), e)))
        sel.reason = (
            f"{prefix}{what}; epoch {sel.epoch} has the best mean Dice "
            f"{float(cv[sel.epoch]):.4f} over the worst {100 * worst_fraction:g} % of cases"
        )
    else:
        sel.epoch, why = _pareto_pick(tab.loc[pool, ["cohort", "worst"]])
        sel.reason = f"{prefix}{what}; {why}"
    return sel
