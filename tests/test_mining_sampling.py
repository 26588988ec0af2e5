"""Failure-driven sampling weights: floor, smoothing, rates from the EFR table."""

from __future__ import annotations

import pandas as pd
import pytest

from robusttrain.metamorphic.records import FailureRecord
from robusttrain.mining.sampling import FailureDrivenWeights, rates_from_efr, rates_from_records


def rec(pert="blur", sigma=1.0, epoch=0):
    return FailureRecord(
        case_id="c",
        split="train",
        perturbation=pert,
        severity=2,
        params={"s": [sigma]},
        seed=0,
        epoch=epoch,
        src_dice=1.0,
        fol_dice=0.0,
        src_iou=1.0,
        fol_iou=0.0,
    )


def test_floor_keeps_every_perturbation():
    w = FailureDrivenWeights(momentum=0.0, floor=0.05)
    out = w.update({"blur": 1.0, "text": 0.0, "contrast": 0.0, "blood": 0.0})
    assert min(out.values()) == pytest.approx(0.05)
    assert sum(out.values()) == pytest.approx(1.0)
    assert out["blur"] == pytest.approx(1 - 3 * 0.05)


def test_floor_capped_and_uniform_without_failures():
    w = FailureDrivenWeights(floor=0.9)
    assert w.update({"a": 0.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}
    assert w.update({"a": 1.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}  # floor 0.9 > 1/P -> 1/P


def test_smoothing_and_state():
    w = FailureDrivenWeights(momentum=0.5, floor=0.0)
    w.update({"a": 1.0, "b": 0.0})
    w.update({"a": 0.0, "b": 1.0})
    assert w.smoothed == {"a": 0.5, "b": 0.5}
    w2 = FailureDrivenWeights(momentum=0.5, floor=0.0)
    w2.load_state_dict(w.state_dict())
    assert w2.weights() == w.weights()


def test_rates_from_efr_and_records():
    rows = []
    for ep in (0, 1):
        for sev, err in ((2, 1), (4, 3)):
            for t in (0.25, 0.5):
                rows.append(
                    dict(
                        epoch=ep,
                        split="train",
                        perturbation="blur",
                        severity=sev,
                        metric="dice",
                        threshold=t,
                        errors=err + ep,
                        cases=10,
                        efr=0,
                    )
                )
    rows.append(
        dict(
            epoch=1,
            split="val",
            perturbation="text",
            severity=2,
            metric="dice",
            threshold=0.25,
            errors=9,
            cases=10,
            efr=0,
        )
    )
    rates = rates_from_efr(pd.DataFrame(rows))
    assert rates == {"blur": pytest.approx((2 + 4) / 20)}
    assert rates_from_records(
        [
            rec(pert="a", epoch=1),
            rec(pert="a", sigma=2, epoch=1),
            rec(pert="b", epoch=1),
            rec(pert="c", epoch=0),
        ],
        1,
    ) == {"a": 1.0, "b": 0.5}
