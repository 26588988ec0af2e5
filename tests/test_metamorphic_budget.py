"""The robustness budget: stratified, rotating (case, test) subsets sized to training work (never to the
clock); Wilson CIs."""

import time
from collections import Counter

import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader
from toys import COLOUR, Blobs, Tiny, quiet_trainer

from robusttrain.callbacks import MetamorphicCallback
from robusttrain.metamorphic.batch import BatchHooks, iter_probe
from robusttrain.metamorphic.budget import CheckBudget, final_reserve
from robusttrain.metamorphic.efr import efr_table, wilson_interval
from robusttrain.metamorphic.runner import aggregate, run_probe
from robusttrain.metamorphic.suite import MRSuite

IDS = [f"c{i}" for i in range(10)]


def _budget(seed=0, budget=0.5):
    return CheckBudget(budget, seed=seed, clean_cost=1.0, followup_cost=1.0)  # one unit per sample


def _seconds_for(pairs, n_val=10):  # training work units that buy ``pairs`` follow-ups at budget 0.5
    return (n_val * 1.0 + pairs * 1.0 + 0.5) / 0.5


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, "0.25", True, float("nan")])
def test_budget_is_validated_at_construction(bad):
    with pytest.raises(ValueError, match=r"budget must be a fraction of training time in \(0, 1\]"):
        MetamorphicCallback(suite=MRSuite(["blur"]), budget=bad)


def test_plan_is_stratified_and_rotates_through_every_pair():
    b = _budget()
    seen = Counter()
    for _ in range(5):  # 8 pairs per check over 4 tests: 2 cases each; 10 cases -> 5 checks cover all
        plan = b.plan(_seconds_for(8), {"val": IDS}, n_tests=4)["val"]
        assert sorted(len(v) for v in plan.values()) == [2, 2, 2, 2]
        seen.update((c, k) for k, cases in plan.items() for c in cases)
    assert len(seen) == 40 and set(seen.values()) == {1}  # every (case, test) pair exactly once
    # seeded: the same sequence for the same seed, another for another seed
    again, other = _budget(), _budget(seed=1)
    p0 = b.plan(_seconds_for(8), {"val": IDS}, 4)["val"]
    first = again.plan(_seconds_for(8), {"val": IDS}, 4)["val"]
    assert first != other.plan(_seconds_for(8), {"val": IDS}, 4)["val"]
    assert p0 == first  # after a full rotation the cursor is back at the start


def test_remainder_rotates_over_tests_and_every_test_gets_at_least_one_case():
    b = _budget()
    counts = [
        [len(v) for _, v in sorted(b.plan(_seconds_for(6), {"val": IDS}, 4)["val"].items())] for _ in range(2)
    ]
    assert sorted(counts[0]) == [1, 1, 2, 2] and counts[0] != counts[1]  # the extra pairs move on
    tiny = b.plan(0.0, {"val": IDS}, 4)["val"]
    assert [len(v) for v in tiny.values()] == [1, 1, 1, 1]
    assert b.plan(_seconds_for(40), {"val": IDS}, 4)["val"] is None  # affordable: the whole suite


def test_train_probe_shares_the_budget_and_reserve_is_set_aside():
    b = _budget()
    train = [f"t{i}" for i in range(30)]
    plan = b.plan(_seconds_for(40), {"val": IDS, "train": train}, n_tests=2)
    n = {s: sum(len(v) for v in p.values()) for s, p in plan.items()}
    # 40 pairs' worth: val pairs cost 1 unit, train pairs 2 (their clean pass too), split by pair counts
    assert n["val"] == 10 and n["train"] == 15
    with_reserve = b.plan(_seconds_for(40), {"val": IDS}, 4, reserve=20.0)["val"]
    assert sum(len(v) for v in with_reserve.values()) == 20
    assert final_reserve(10, 4, 0.01, 0.01, 2, 8) == pytest.approx((0.1 + 0.4) * 2 / 8)


def test_budget_state_round_trips():
    b = _budget()
    b.plan(_seconds_for(8), {"val": IDS}, 4)
    c = _budget()  # costs are settings (constructor), the rotation is state
    c.load_state_dict(b.state_dict())
    assert c.plan(_seconds_for(8), {"val": IDS}, 4) == b.plan(_seconds_for(8), {"val": IDS}, 4)


def test_selected_follow_ups_score_exactly_as_in_the_full_suite():
    ds = Blobs(8, slices=2)
    predict = lambda x: torch.cat([1 - (x[:, :1] > 0.6).float(), (x[:, :1] > 0.6).float()], 1)
    full_suite, part_suite = MRSuite(COLOUR, (2, 4), seed=0), MRSuite(COLOUR, (2, 4), seed=0)
    full = run_probe(predict, iter_probe(ds, range(8), 4, BatchHooks()), full_suite, "val")
    sel = {0: {0, 1}, 3: {2, 3, 6, 7}}  # dataset indices: cases p0 / p1, p3 (both slices each)
    part = run_probe(predict, iter_probe(ds, range(8), 4, BatchHooks()), part_suite, "val", selection=sel)
    assert part.tested.sum() == 6 and np.array_equal(part.src, full.src)
    for k, rows in sel.items():
        assert np.array_equal(part.fol[sorted(rows), k], full.fol[sorted(rows), k])
    hist, cases = aggregate(part, ["polyp"], 0, part_suite)
    assert len(hist) == 4  # the clean pass is complete
    assert sorted(zip(cases.case_id, cases.severity, cases.perturbation)) == [
        ("p0", 2, "saturation"),
        ("p1", 4, "contrast"),
        ("p3", 4, "contrast"),
    ]
    _, full_cases = aggregate(full, ["polyp"], 0, full_suite)
    merged = cases.merge(full_cases, on=["case_id", "perturbation", "severity"], suffixes=("", "_full"))
    assert np.allclose(merged.fol_dice, merged.fol_dice_full)
    assert part.extra["timing"]["n_followup"] == 6 and part.extra["timing"]["n_clean"] == 8


def test_efr_rows_carry_a_wilson_interval_and_suite_coverage():
    cases = pd.DataFrame(
        {
            "perturbation": ["blur"] * 4,
            "severity": [2, 2, 4, 4],
            "src_dice": 0.8,
            "fol_dice": [0.7, 0.2, 0.1, 0.8],
            "src_iou": 0.6,
            "fol_iou": 0.5,
        }
    )
    t = efr_table(cases, thresholds=(0.25,), metrics=("dice",), suite_cases=10)
    row = t[(t.perturbation == "all")].iloc[0]
    assert (row.errors, row.cases, row.suite_cases) == (2, 4, 20)
    assert (row.efr_low, row.efr_high) == pytest.approx(wilson_interval(2, 4))
    # and the interval's value itself, worked out by hand (Wilson, 2 of 4, z = 1.96): 0.5 -/+ 0.3499
    assert (row.efr_low, row.efr_high) == pytest.approx((0.1500, 0.8500), abs=2e-4)
    assert row.efr_low < 0.5 < row.efr_high and row.efr_high - row.efr_low > 0.5  # 4 cases: wide
    assert t[t.severity == 2].suite_cases.tolist() == [10]


class SlowTiny(Tiny):
    """Tiny with a fixed sleep per training batch: a slower (or busier) machine, same work."""

    def __init__(self, sleep):
        super().__init__()
        self.sleep = sleep

    def training_step(self, b, i):
        time.sleep(self.sleep)
        return super().training_step(b, i)


class StopAfter(L.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epoch:
            trainer.should_stop = True


def _fit(tmp_path, cb, sleep, epochs, extra=(), n_train=8):
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=epochs,
        callbacks=[cb, *extra],
        logger=CSVLogger(tmp_path, name="logs"),
        log_every_n_steps=1,
    )
    trainer.fit(
        SlowTiny(sleep),
        DataLoader(Blobs(n_train, slices=1), batch_size=4),
        DataLoader(Blobs(8, slices=1), batch_size=4),
    )
    return trainer


def _pooled(d):
    efr = pd.read_csv(d / "efr.csv")
    return efr[(efr.perturbation == "all") & (efr.metric == "dice") & (efr.threshold == 0.25)].set_index(
        "epoch"
    )


@pytest.mark.slow
def test_budget_plans_with_work_not_seconds_and_an_early_stop_still_ends_with_the_whole_suite(tmp_path):
    runs = {}
    for name, sleep, n_train in (("fast", 0.0, 8), ("slow", 0.3, 8), ("more", 0.0, 64)):
        d = tmp_path / name
        cb = MetamorphicCallback(suite=MRSuite(COLOUR, (2, 4)), dirpath=d, budget=0.5, class_names=["polyp"])
        _fit(d, cb, sleep, epochs=5, extra=[StopAfter(1)], n_train=n_train)
        runs[name] = d
        hist = pd.read_csv(d / "history.csv")
        assert hist.groupby("epoch").size().tolist() == [8, 8]  # clean history complete every epoch
        logged = pd.read_csv(d / "logs" / "version_0" / "metrics.csv")
        assert {"mr/check_s", "mr/train_s"} <= set(logged.columns)  # seconds are still reported
    fast, more = _pooled(runs["fast"]), _pooled(runs["more"])
    # a slower machine (0.3 s per batch) trains the same work: the very same subsets and files
    for name in ("efr.csv", "mr_cases.csv", "history.csv"):
        assert (runs["fast"] / name).read_bytes() == (runs["slow"] / name).read_bytes(), name
    # 8 training images (24^2, as the probe) at budget 0.5 = 12 units, less than 8 clean forwards + the reserve:
    # the minimum (one case per test); 64 images buy more pairs
    assert fast.loc[0, "cases"] == 6 and fast.loc[0, "suite_cases"] == 48 and not fast.loc[0, "final"]
    assert more.loc[0, "cases"] > fast.loc[0, "cases"]
    # stopped after epoch 1 of 5: the final check (on_train_end) re-scored epoch 1 with the whole suite
    assert fast.loc[1, "cases"] == fast.loc[1, "suite_cases"] == 48 and fast.loc[1, "final"]
    assert len(_pooled(runs["fast"]).loc[[1]]) == 1  # replaced, not appended
