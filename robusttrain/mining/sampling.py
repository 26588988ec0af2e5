"""Failure-driven sampling: which perturbation replay draws, in proportion to recent failure rates.

Paper 001 found that synthesising training data where the model fails beats random synthesis.
Here the failure rate of each perturbation on the *train probe* (errors / test cases, all its
severities pooled) is smoothed with an exponential moving average, and turned into draw
weights with a floor so that no perturbation disappears from replay:

    s_p <- momentum * s_p + (1 - momentum) * rate_p        (first time: s_p = rate_p)
    w_p  = floor + (1 - P * floor) * s_p / sum_q s_q       (uniform while every s_p is 0)

so every ``w_p >= floor`` and the weights sum to 1 (``floor`` is capped at ``1/P``).

>>> w = FailureDrivenWeights(momentum=0.5, floor=0.1)
>>> w.update({"blur": 0.4, "text": 0.0, "contrast": 0.0})
{'blur': 0.8, 'contrast': 0.1, 'text': 0.1}
>>> w.update({"blur": 0.0, "text": 0.4, "contrast": 0.0})["text"]
0.45
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from robusttrain.metamorphic.efr import VIOLATION_THRESHOLD, family_rates
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.validate import check_fraction


class FailureDrivenWeights:
    """Smoothed per-perturbation failure rates -> draw weights with a floor (see module doc)."""

    def __init__(self, momentum: float = 0.5, floor: float = 0.05):
        self.momentum = check_fraction("momentum", momentum, hi_open=True)
        self.floor = check_fraction("floor", floor)
        self.smoothed: dict[str, float] = {}

    def update(self, rates: Mapping[str, float]) -> dict[str, float]:
        """Fold in one epoch's failure rates; perturbations absent from ``rates`` decay to 0."""
        for p in sorted(set(self.smoothed) | set(rates)):  # sorted: same order in every process
            r = float(rates.get(p, 0.0))
            old = self.smoothed.get(p)
            self.smoothed[p] = r if old is None else self.momentum * old + (1 - self.momentum) * r
        return self.weights()

    def weights(self) -> dict[str, float]:
        names = sorted(self.smoothed)
        if not names:
            return {}
        floor = min(self.floor, 1.0 / len(names))
        tot = sum(self.smoothed[p] for p in names)
        if tot <= 0:
            return {p: 1.0 / len(names) for p in names}
        return {p: round(floor + (1 - len(names) * floor) * self.smoothed[p] / tot, 12) for p in names}

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "floor": self.floor, "smoothed": dict(self.smoothed)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.smoothed = {str(k): float(v) for k, v in state.get("smoothed", {}).items()}


def rates_from_efr(
    efr: Any,
    split: str = "train",
    metric: str = "dice",
    threshold: float = VIOLATION_THRESHOLD,
    epoch: int | None = None,
) -> dict[str, float]:
    """Per-perturbation failure rate (errors / cases over severities) of one epoch of ``split`` of the
    MetamorphicCallback's ``efr`` table: :func:`robusttrain.metamorphic.efr.family_rates` (the one
    computation), the training probe's by default."""
    return family_rates(efr, split, metric, threshold, epoch)


def rates_from_records(records: Iterable[FailureRecord], epoch: int) -> dict[str, float]:
    """Fallback without an EFR table: failures per perturbation seen at ``epoch``, relative to the
    most frequent one (the weights only need proportions)."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        if r.epoch == epoch:
            counts[r.perturbation] += 1
    top = max(counts.values(), default=0)
    return {p: c / top for p, c in counts.items()} if top else {}
