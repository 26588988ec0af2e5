"""MetamorphicCallback's robustness budget glue: the training clock and turning a plan into indices.

The plan itself (which pairs, how many) is :class:`robusttrain.metamorphic.budget.CheckBudget`;
here: how long the model trained since the last check (the callback's hooks feed a
:class:`TrainClock`) and which dataset indices a planned set of cases means.

>>> clock = TrainClock(); clock.start(0.0); clock.step(2.0); clock.pause(); clock.resume(10.0); clock.step(11.0)
>>> clock.take()   # 2 s + 1 s of batches; the 8 s in between (validation) do not count
3.0
>>> to_indices({0: {"a"}, 1: {"b"}}, [10, 11, 12], ["a", "a", "b"])
{0: {10, 11}, 1: {12}}
"""
from __future__ import annotations

import time
from typing import Mapping, Sequence


class TrainClock:
    """Wall time spent in training batches (data loading included, validation excluded)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._mark: float | None = None

    def start(self, now: float | None = None) -> None:
        """At the start of a training epoch (and when training resumes after validation)."""
        self._mark = time.perf_counter() if now is None else now

    resume = start

    def step(self, now: float | None = None) -> None:
        """At the end of a training batch: the time since the last mark was training."""
        now = time.perf_counter() if now is None else now
        if self._mark is not None:
            self.seconds += now - self._mark
        self._mark = now

    def pause(self) -> None:
        """At the start of validation: nothing counts until :meth:`resume`."""
        self._mark = None

    def take(self) -> float:
        """Training seconds since the last call (and reset)."""
        out, self.seconds = self.seconds, 0.0
        return out


def to_indices(plan: Mapping[int, set[str]] | None, indices: Sequence[int],
               case_ids: Sequence[str]) -> dict[int, set[int]] | None:
    """A per-test set of case ids -> the dataset indices (every slice of each case)."""
    if plan is None:
        return None
    return {k: {int(i) for i, c in zip(indices, case_ids) if c in cases} for k, cases in plan.items()}
