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

What the budget plans with is counted during training: pixels of the training batches since the last
check (:class:`TrainWork`: deterministic) and, reported only, wall seconds (:class:`TrainClock`).
:func:`plan_check` assembles one check's plan from them (rank 0 of the MetamorphicCallback calls it).

>>> import torch
>>> work = TrainWork(); work.add({"image": torch.zeros(4, 3, 16, 16)}); work.add((torch.zeros(2, 3, 8, 8), None))
>>> work.take()   # 4 x 16 x 16 + 2 x 8 x 8 pixels
1152
>>> clock = TrainClock(); clock.start(0.0); clock.step(2.0); clock.pause(); clock.resume(10.0); clock.step(11.0)
>>> clock.take()   # 2 s + 1 s of batches; the 8 s in between (validation) do not count
3.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from .batch import BatchHooks, iter_probe
from .check import prepare_suite, rng_preserved
from .rotation import complete_plan
from .suite import MRSuite, stable_seed

if TYPE_CHECKING:
    from .check import Probe

# one training sample = forward + backward: ~3 forwards (backward ~2x forward, per layer FLOPs)
TRAIN_FACTOR = 3.0
# a follow-up = its forward plus the perturbation, scoring and bookkeeping (benchmarks/perf/mr_overhead.py:
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


Plan = dict[str, "dict[int, set[str]] | None"]


def plans_subset(budget: CheckBudget, final: str, full: bool) -> bool:
    """Whether a check is planned at all (else it scores the whole suite): with a budget, every check
    but a final one of ``final="suite"`` (the rotation's final check completes a plan)."""
    return budget.enabled and (not full or final == "rotation")


def plan_check(
    budget: CheckBudget,
    probes: Mapping[str, Probe],
    train_pixels: Sequence[int],
    suite: MRSuite,
    hooks: BatchHooks,
    *,
    epoch: int,
    last_check_epoch: int,
    max_epochs: int | None,
    final: str,
    full: bool,
    cases: pd.DataFrame,
) -> Plan:
    """Per split, the cases to test under each test (None: all), for a check after ``epoch``.

    Work, not seconds: ``train_pixels`` are every rank's training pixels since the last check (ranks
    train on their own shards), counted in forwards of one probe sample, so the plan is the same under
    any load (module doc). ``final="suite"`` sets aside this check's share of the whole-suite check at
    the end; the rotation's final check (``full``) adds every (case, test) pair of the validation probe
    that ``cases`` (the run's scored pairs) lacks. Advances ``budget``'s cursors (call on one rank)."""
    first = probes.get("val", next(iter(probes.values())))
    probe_px = sample_pixels(first.dataset, first.indices, hooks)
    work = training_work(sum(train_pixels), probe_px)
    clean, fol = budget.costs()
    n_val = len(probes["val"].indices) if "val" in probes else 0
    since = epoch - last_check_epoch if last_check_epoch >= 0 else epoch + 1
    if suite.in_channels is None:  # the number of tests depends on the data's channels
        prepare_suite(suite, first, hooks)
    # the rotation's final table needs no whole suite at the end: nothing to set aside for it
    reserve = (
        0.0 if final == "rotation" else final_reserve(n_val, len(suite.tests), clean, fol, since, max_epochs)
    )
    plan = budget.plan(work, {s: p.case_ids for s, p in probes.items()}, len(suite.tests), reserve=reserve)
    if full and final == "rotation" and "val" in probes:  # the last check completes the rotation
        done = cases[cases["split"] == "val"] if len(cases) else cases
        plan["val"] = complete_plan(plan.get("val"), probes["val"].case_ids, suite.tests, done)
    return plan


def sample_pixels(ds: Any, idx: Sequence[int], hooks: BatchHooks) -> int:
    """Pixels (voxels) of one probe sample: the unit of the budget's work."""
    if not len(idx):
        return 1
    with rng_preserved():  # reading must not shift the seeded stream the check's samples are read with
        x = next(iter_probe(ds, list(idx[:1]), 1, hooks)).images
    return max(1, int(x[0, 0].numel()))


class TrainWork:
    """Pixels (voxels) of the training images seen since the last :meth:`take`.

    ``get_images`` reads a batch's images (the MR hooks); a batch it cannot read (lists of crops,
    custom containers) is counted through every floating tensor of >= 3 dims in it, and a batch with
    none counts 0 (the budget then affords only its minimum)."""

    def __init__(self, get_images: Callable[[Any], torch.Tensor] | None = None) -> None:
        self.pixels = 0
        self.get_images = get_images

    def add(self, batch: Any) -> None:
        x = None
        if self.get_images is not None:
            try:
                x = self.get_images(batch)
            except Exception:  # noqa: BLE001 -- the fallback below counts any image-like tensor
                x = None
        self.pixels += _pixels(x) if torch.is_tensor(x) else sum(_pixels(t) for t in _image_tensors(batch))

    def take(self) -> int:
        out, self.pixels = self.pixels, 0
        return out


def _pixels(x: torch.Tensor) -> int:
    # (B,C,H,W[,D]) -> B*H*W[*D]; a 3-dim tensor is one (C,H,W) image
    if x.ndim < 3:
        return 0
    return int(x.numel() // x.shape[1]) if x.ndim >= 4 else int(x.numel() // x.shape[0])


def _image_tensors(batch: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if torch.is_tensor(batch):
        if batch.is_floating_point() and batch.ndim >= 4:
            yield batch
    elif depth < 4 and isinstance(batch, Mapping):
        for v in batch.values():
            yield from _image_tensors(v, depth + 1)
    elif depth < 4 and isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _image_tensors(v, depth + 1)


class TrainClock:
    """Wall time spent in training batches (data loading included, validation excluded); reported only."""

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
