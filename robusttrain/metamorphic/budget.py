"""A robustness budget: which (case, test) pairs an epoch's check scores, so that it costs about
``budget`` x the training work since the previous check.

The full suite scores every probe case under every (perturbation, severity) test; at the recipes'
sizes that costs 1-3x the training it checks. A budgeted check keeps the clean pass over the whole
validation probe (the per-case history that corner cases need is cheap and stays complete) and
scores a *stratified* subset of the follow-ups: every test (stratum) gets an equal share of the
pairs the budget affords (at least ``min_per_test``), and within a test the cases come from a
seeded permutation walked by a cursor, so successive checks rotate through all pairs.

Costs are counted in **work units, never in seconds**: one unit is one forward pass of one probe
sample. Training a sample costs :data:`TRAIN_FACTOR` units per probe-sample-sized image (forward +
backward ~ 3 forwards, the usual FLOP count of backpropagation), scaled by its pixel count; a clean
probe sample costs 1 unit, a follow-up :data:`FOLLOWUP_FACTOR` (its forward plus the perturbation,
scoring and bookkeeping). The subset a check scores is therefore a function of (seed, epoch, data,
settings) only: the same under any machine load, after a kill + resume, on any device. Wall-clock
seconds are still *reported* (``mr/check_s``, ``mr/train_s``), never planned with.

Training-set probes (failure mining) share the budget, in proportion to their pair counts; their
clean pass runs only on the selected cases. ``reserve`` lets the caller set aside the cost of the
full-suite check at the end of training (:func:`final_reserve`), so the whole run stays in budget.

>>> b = CheckBudget(0.25, seed=0)
>>> ids = [f"c{i}" for i in range(10)]
>>> plan = b.plan(train_work=600.0, probes={"val": ids}, n_tests=4)
>>> plan["val"] is None   # (0.25 x 600 - 10 x 1) / 1.25 = 112 pairs >= 40: the whole suite
True
>>> plan = b.plan(train_work=100.0, probes={"val": ids}, n_tests=4)   # (25 - 10) / 1.25 = 12 pairs
>>> sorted(len(v) for v in plan["val"].values())
[3, 3, 3, 3]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .suite import stable_seed

# one training sample = forward + backward: ~3 forwards (backward ~2x forward, per layer FLOPs)
TRAIN_FACTOR = 3.0
# a follow-up = its forward plus the perturbation, scoring and bookkeeping (benchmarks/mr_overhead.py:
# 5-20 % of the forward at the recipes' sizes; rounded up)
FOLLOWUP_FACTOR = 1.25


def check_budget(budget: Any) -> float | None:
    """``None`` (the full suite every check) or a fraction of training work in (0, 1].

    >>> check_budget(0.25), check_budget(None)
    (0.25, None)
    """
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < float(budget) <= 1:
        raise ValueError(
            f"budget must be a fraction of training time in (0, 1] (e.g. 0.25) or None "
            f"for the full suite every check, got {budget!r}"
        )
    return float(budget)


def training_work(n_pixels: float, probe_pixels: float) -> float:
    """Work units of training on images with ``n_pixels`` pixels (voxels) in all, counted in
    forwards of one ``probe_pixels``-sized probe sample (conv nets cost ~ linear in pixels).

    >>> training_work(4 * 64 * 64, 128 * 128)   # a batch of four 64^2 crops vs 128^2 probe images
    3.0
    """
    return TRAIN_FACTOR * float(n_pixels) / max(1.0, float(probe_pixels))


def final_reserve(
    n_samples: int,
    n_tests: int,
    clean_cost: float,
    followup_cost: float,
    epochs_covered: float,
    total_epochs: int | None,
) -> float:
    """Share of the end-of-training full-suite check charged to a check covering ``epochs_covered``.

    >>> final_reserve(40, 18, 1.0, 1.25, 1, 8)   # (40 x 1 + 40 x 18 x 1.25) / 8
    117.5
    """
    if not total_epochs or total_epochs <= 0:
        return 0.0
    full = n_samples * (clean_cost + n_tests * followup_cost)
    return round(full * min(1.0, epochs_covered / total_epochs), 6)


class CheckBudget:
    """Plans budgeted checks (module doc); ``budget=None`` plans the full suite every time.

    ``clean_cost`` / ``followup_cost``: work units of one probe sample's clean pass / follow-up
    (defaults 1 and :data:`FOLLOWUP_FACTOR`); fixed numbers, so plans never depend on the clock.
    """

    def __init__(
        self,
        budget: float | None,
        seed: int = 0,
        min_per_test: int = 1,
        clean_cost: float = 1.0,
        followup_cost: float = FOLLOWUP_FACTOR,
    ):
        self.budget = check_budget(budget)
        self.seed, self.min_per_test = int(seed), max(0, int(min_per_test))
        self.clean_cost, self.followup_cost = float(clean_cost), float(followup_cost)
        self.cursors: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.budget is not None

    def costs(self) -> tuple[float, float]:
        """(clean, follow-up) work units per probe sample."""
        return self.clean_cost, self.followup_cost

    def plan(
        self, train_work: float, probes: Mapping[str, Sequence[str]], n_tests: int, reserve: float = 0.0
    ) -> dict[str, dict[int, set[str]] | None]:
        """Per split: ``{test index: case ids}`` to score, or None for the whole suite.

        ``train_work``: work units trained since the last check (:func:`training_work`).
        ``probes``: per split, the case id of every probe sample (several per case for slices).
        The ``"val"`` split's clean pass is paid first (it always runs over the whole probe).
        Advances the rotation cursors: call once per check, on one rank, and share the plan.
        """
        if not self.enabled or n_tests <= 0:
            return {s: None for s in probes}
        c_clean, c_fol = self.costs()
        cases = {s: list(dict.fromkeys(ids)) for s, ids in probes.items()}
        per_case = {s: len(ids) / max(1, len(cases[s])) for s, ids in probes.items()}
        assert self.budget is not None  # enabled (checked above)
        avail = self.budget * max(0.0, train_work) - reserve - len(probes.get("val", ())) * c_clean
        full = {s: len(c) * n_tests for s, c in cases.items()}
        total = sum(full.values()) or 1
        out: dict[str, dict[int, set[str]] | None] = {}
        for s in probes:
            # a train probe's pair also pays its case's clean forward (an upper bound: cases repeat)
            pair_cost = per_case[s] * (c_fol + (0.0 if s == "val" else c_clean))
            afford = int(max(0.0, avail) * full[s] / total / max(pair_cost, 1e-9))
            n_pairs = max(afford, min(self.min_per_test, len(cases[s])) * n_tests)
            out[s] = None if n_pairs >= full[s] else self._select(s, cases[s], n_tests, n_pairs)
        return out

    def _select(self, split: str, cases: list[str], n_tests: int, n_pairs: int) -> dict[int, set[str]]:
        n = len(cases)
        base, extra = divmod(n_pairs, n_tests)
        off = self.cursors.get(f"{split}/extra", 0)  # which tests get the remainder rotates too
        out = {}
        for k in range(n_tests):
            m = min(n, base + (1 if (k - off) % n_tests < extra else 0))
            perm = np.random.default_rng(stable_seed(self.seed, split, k, n, "budget")).permutation(n)
            c = self.cursors.get(f"{split}/{k}", 0)
            out[k] = {cases[int(perm[(c + j) % n])] for j in range(m)}
            self.cursors[f"{split}/{k}"] = (c + m) % n
        self.cursors[f"{split}/extra"] = (off + extra) % n_tests
        return out

    # -- checkpoint state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "units": "work", "cursors": dict(self.cursors)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # costs are constants now (older checkpoints stored measured seconds: ignored)
        self.cursors = {str(k): int(v) for k, v in state.get("cursors", {}).items()}
