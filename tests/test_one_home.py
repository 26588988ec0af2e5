"""Issue 33 §1/§6: the callbacks keep hooks, state and files; each concept they shared has one home."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pandas as pd
import pytest
from lightning.pytorch import Callback

import robusttrain.callbacks as cbs
from robusttrain.callbacks.context import RobustnessContext
from robusttrain.metamorphic import efr as efr_mod
from robusttrain.metamorphic.efr import THRESHOLDS, VIOLATION_THRESHOLD, efr_table, family_rates
from robusttrain.mining.sampling import rates_from_efr


def _cases(rates: dict[str, float], n: int = 20) -> pd.DataFrame:
    """Scored test cases whose Dice drops by 0.5 (a violation) for ``rates[p]`` of ``p``'s cases."""
    rows = []
    for p, r in rates.items():
        for sev in (2, 4):
            for i in range(n):
                bad = i < round(r * n)
                rows.append(
                    {
                        "case_id": f"c{i}",
                        "perturbation": p,
                        "severity": sev,
                        "src_dice": 0.9,
                        "fol_dice": 0.4 if bad else 0.9,
                        "src_iou": 0.8,
                        "fol_iou": 0.3 if bad else 0.8,
                    }
                )
    return pd.DataFrame(rows)


def _efr(split_rates: dict[str, dict[str, float]], epoch: int = 3) -> pd.DataFrame:
    parts = []
    for split, rates in split_rates.items():
        t = efr_table(_cases(rates), THRESHOLDS)
        t.insert(0, "split", split)
        t.insert(0, "epoch", epoch)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def _training_rates(efr: pd.DataFrame) -> dict[str, float] | None:
    mt = cbs.MetamorphicTraining(perturbations=["blur", "contrast"])
    ctx = RobustnessContext()
    ctx.violation_threshold, ctx.efr = VIOLATION_THRESHOLD, efr
    mt._ctx = ctx
    return mt._rates()


def test_the_mining_and_the_training_weight_families_by_one_rate():
    efr = _efr({"train": {"blur": 0.25, "contrast": 0.5}, "val": {"blur": 0.75, "contrast": 0.0}})
    want = {"blur": 0.25, "contrast": 0.5}
    assert family_rates(efr, "train") == want
    assert rates_from_efr(efr, "train", "dice", VIOLATION_THRESHOLD) == want
    assert _training_rates(efr) == want  # the training probe's rates when there is one


def test_a_table_without_pooled_rows_gives_the_training_the_mining_rates():
    # before: the training read only the pooled (severity 0) rows, the mining summed every row
    efr = _efr({"val": {"blur": 0.25, "contrast": 0.5}})
    per_severity = efr[efr["severity"] != 0]
    assert (
        _training_rates(per_severity)
        == rates_from_efr(per_severity, "val")
        == {"blur": 0.25, "contrast": 0.5}
    )


def test_the_thresholds_have_one_home():
    from robusttrain.reporting import plots

    assert plots.THRESHOLDS is THRESHOLDS and VIOLATION_THRESHOLD in THRESHOLDS
    defaults = [
        inspect.signature(cbs.MetamorphicCallback).parameters["violation_threshold"].default,
        inspect.signature(rates_from_efr).parameters["threshold"].default,
        inspect.signature(family_rates).parameters["threshold"].default,
    ]
    assert all(d is VIOLATION_THRESHOLD for d in defaults)
    assert inspect.signature(cbs.MetamorphicCallback).parameters["thresholds"].default is efr_mod.THRESHOLDS


def test_budget_and_reuse_live_in_metamorphic_with_one_to_indices():
    from robusttrain.metamorphic import budget, check

    for gone in ("robusttrain.callbacks._mr_budget", "robusttrain.callbacks._mr_reuse"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)
    assert not hasattr(budget, "to_indices") and callable(check.to_indices)
    assert callable(budget.plan_check) and importlib.import_module("robusttrain.metamorphic.reuse")


def test_the_pure_parts_import_no_lightning():
    code = (
        "import sys\n"
        "import robusttrain.training.settings, robusttrain.training.accounting, robusttrain.training.averaging\n"
        "import robusttrain.metamorphic.budget, robusttrain.metamorphic.reuse\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "cls",
    [
        cbs.MetamorphicCallback,
        cbs.MetamorphicTraining,
        cbs.FailureMiningCallback,
        cbs.BalancedCheckpoint,
        cbs.BalancedAverage,
        cbs.EMACheckpoint,
        cbs.RobustnessReporter,
    ],
)
def test_every_lightning_hook_a_callback_overrides_is_marked_override(cls):
    hooks = {n for n in dir(Callback) if not n.startswith("_")}
    own = {n: f for n, f in vars(cls).items() if n in hooks and callable(f)}
    assert own, cls
    unmarked = sorted(n for n, f in own.items() if not getattr(f, "__override__", False))
    assert not unmarked, f"{cls.__name__}: {unmarked}"
