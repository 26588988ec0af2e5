"""Every policy's choice on one history, next to the per-epoch cohort mean and worst-k mean.

This is what the trade-off plot (cohort mean vs worst-k Dice, one point per epoch) draws, and
what an evaluation compares on held-out data: the epochs each policy would have picked.

>>> import pandas as pd
>>> rows = [{"case_id": f"p{c}", "epoch": e, "dice_lv": 0.5 + 0.04 * e + 0.001 * c}
...         for c in range(6) for e in range(8)]
>>> rows[-1]["dice_lv"] = 0.05   # p5 collapses at the last epoch
>>> t = policy_tradeoff(pd.DataFrame(rows), reference_epoch=7)
>>> t.choices["last_inlier"], t.choices["least_loss"], list(t.table.columns)
(6, 7, ['cohort', 'worst', 'cvar'])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from .balanced import POLICIES, Selection, epoch_table, select_balanced_epoch
from .history import HistoryLike, load_history, metric_columns


@dataclass
class Tradeoff:
    """``table``: per analysed epoch ``cohort`` / ``worst`` (corner cases) / ``cvar``;
    ``choices``: policy → epoch, plus ``least_loss`` (the reference) and ``last``."""

    table: pd.DataFrame
    choices: dict[str, int | None] = field(default_factory=dict)
    selections: dict[str, Selection] = field(default_factory=dict)
    worst_fraction: float = 0.1


def policy_tradeoff(
    history: HistoryLike,
    reference_epoch: int | None = None,
    candidates: Iterable[int] | None = None,
    contamination: float = 0.1,
    tail: str = "low",
    metric: str = "dice",
    min_epoch: int = 0,
    worst_fraction: float = 0.1,
    policies: Iterable[str] = POLICIES,
) -> Tradeoff:
    """Run :func:`select_balanced_epoch` once per policy on the same history and arguments."""
    h = load_history(history)
    cands = None if candidates is None else list(candidates)
    epochs = sorted(int(e) for e in h["epoch"].unique() if e >= min_epoch)
    ref = reference_epoch if reference_epoch in set(h["epoch"].tolist()) else None
    sels = {
        p: select_balanced_epoch(
            h,
            p,
            reference_epoch=ref,
            candidates=cands,
            contamination=contamination,
            tail=tail,
            metric=metric,
            min_epoch=min_epoch,
            worst_fraction=worst_fraction,
        )
        for p in policies
    }
    corner = next(iter(sels.values())).corner_cases.case_ids if sels else []
    table = epoch_table(h, metric_columns(h, metric), corner, worst_fraction).loc[epochs]
    choices: dict[str, int | None] = {"least_loss": ref, "last": epochs[-1] if epochs else None}
    choices.update({p: s.epoch for p, s in sels.items()})
    return Tradeoff(table, choices, sels, float(worst_fraction))
