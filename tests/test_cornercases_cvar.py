"""The ``cvar`` balanced-epoch policy: mean Dice of the worst k % of cases, on hand-made histories."""

import numpy as np
import pandas as pd
import pytest

from robusttrain.cornercases import POLICIES, epoch_table, select_balanced_epoch, worst_fraction_mean
from robusttrain.cornercases.report import corners_report

CLASSES = ("rv", "myo", "lv")


def flat(n_cases=20, n_epochs=10, level=0.85, seed=3):
    """Every case at ``level`` (± 0.003) in every epoch: no trend, so only planted changes matter."""
    rng = np.random.default_rng(seed)
    return {
        (f"p{i:02d}", e): level + 0.003 * rng.standard_normal()
        for e in range(n_epochs)
        for i in range(n_cases)
    }


def frame(values):
    return pd.DataFrame(
        [{"case_id": c, "epoch": e, **{f"dice_{k}": v for k in CLASSES}} for (c, e), v in values.items()]
    )


def test_cvar_is_a_listed_policy():
    assert "cvar" in POLICIES


def test_planted_epoch_helping_the_worst_tenth_is_chosen():
    v = flat()
    for e in range(10):  # two weak cases (10 % of 20), best at epoch 5
        for c in ("p00", "p01"):
            v[(c, e)] = 0.60 if e == 5 else 0.30 + 0.01 * e
    for i in range(2, 20):  # ... where everyone else pays 0.04 (the cohort mean drops ~0.015)
        v[(f"p{i:02d}", 5)] -= 0.04
    h = frame(v)
    sel = select_balanced_epoch(h, "cvar", worst_fraction=0.1)
    assert sel.status == "ok" and sel.epoch == 5
    assert sel.table[5]["cvar"] == pytest.approx(0.60)
    assert sel.table[5]["cohort"] < sel.table[9]["cohort"]  # a real (small) cohort cost
    assert sel.table[9]["cohort"] - sel.table[5]["cohort"] < 0.03
    assert "worst 10 % of cases" in sel.reason
    assert select_balanced_epoch(h, "last_inlier").epoch == 9


def test_cvar_follows_the_worst_fifth_not_one_noisy_case():
    v = flat()
    # p00 alone peaks at epoch 2; p01-p03 (with p00 the worst 20 %) are best at epoch 7
    for e in range(10):
        v[("p00", e)] = 0.50 if e == 2 else 0.35
        for c in ("p01", "p02", "p03"):
            v[(c, e)] = 0.70 if e == 7 else 0.40
    h = frame(v)
    assert select_balanced_epoch(h, "maximin").epoch == 2
    sel = select_balanced_epoch(h, "cvar", worst_fraction=0.2)
    assert sel.epoch == 7 and sel.worst_fraction == 0.2
    assert sel.table[7]["cvar"] == pytest.approx((0.35 + 3 * 0.70) / 4)


def test_ties_go_to_the_later_epoch():
    # every case identical in every epoch: all cvar values tie exactly
    v = {(f"p{i:02d}", e): 0.5 + 0.02 * i for e in range(6) for i in range(10)}
    sel = select_balanced_epoch(frame(v), "cvar")
    assert len({round(r["cvar"], 12) for r in sel.table.values()}) == 1
    assert sel.epoch == 5


def test_worst_fraction_mean_and_validation():
    assert worst_fraction_mean([0.9, 0.8, 0.1, 0.7, 0.3], 0.4) == pytest.approx(0.2)
    assert worst_fraction_mean(np.arange(30) / 30, 0.1) == pytest.approx(1 / 30)  # 3 cases, not 4
    assert worst_fraction_mean([0.4, 0.9], 0.01) == pytest.approx(0.4)  # at least one case
    assert worst_fraction_mean([0.4, 0.9], 1.0) == pytest.approx(0.65)
    assert np.isnan(worst_fraction_mean([], 0.1))
    h = frame(flat(n_cases=6, n_epochs=6))
    for bad in (0, -0.1, 1.5, float("nan"), "a lot"):
        with pytest.raises(ValueError, match="worst_fraction"):
            select_balanced_epoch(h, "cvar", worst_fraction=bad)
    with pytest.raises(ValueError, match="policy=.*: expected one of 'last_inlier'"):
        select_balanced_epoch(h, "cvar@10")


def test_epoch_table_has_cvar_per_epoch():
    v = flat(n_cases=10, n_epochs=3)
    v[("p04", 1)] = 0.1
    tab = epoch_table(frame(v), [f"dice_{k}" for k in CLASSES], [], worst_fraction=0.1)
    assert list(tab.columns) == ["cohort", "worst", "cvar"]
    assert tab.loc[1, "cvar"] == pytest.approx(0.1) and tab.loc[1, "worst"] == pytest.approx(0.1)


def test_corners_report_accepts_cvar():
    # noise-free, so no epoch of another case is flagged as an outlier (which would remove it)
    v = {(f"p{i:02d}", e): 0.8 + 0.005 * i for e in range(10) for i in range(20)}
    for e in range(10):
        v[("p00", e)] = 0.6 if e == 4 else 0.2
    text = corners_report(frame(v), policy="cvar", worst_fraction=0.05)
    assert "balanced epoch (cvar): 4" in text


def test_corners_cli_cvar_and_bad_worst_fraction(tmp_path, capsys):
    from robusttrain.cli import main

    # noise-free, so no epoch of another case is flagged as an outlier (which would remove it)
    v = {(f"p{i:02d}", e): 0.8 + 0.005 * i for e in range(10) for i in range(20)}
    for e in range(10):
        v[("p00", e)] = 0.6 if e == 4 else 0.2
    frame(v).to_csv(tmp_path / "history.csv", index=False)
    assert main(["corners", str(tmp_path), "policy=cvar", "worst_fraction=0.05"]) == 0
    assert "balanced epoch (cvar): 4" in capsys.readouterr().out
    assert main(["corners", str(tmp_path), "policy=cvar", "worst_fraction=lots"]) == 2
    assert "bad value for 'worst_fraction': 'lots' (expected a number in (0, 1])" in capsys.readouterr().err
    assert main(["corners", str(tmp_path), "policy=cvar", "worst_fraction=2"]) == 2
    assert "worst_fraction=2.0: expected a number in (0, 1]" in capsys.readouterr().err


def test_balanced_checkpoint_validates_worst_fraction():
    from robusttrain.callbacks import BalancedCheckpoint

    assert BalancedCheckpoint(policy="cvar", worst_fraction=0.25).worst_fraction == 0.25
    with pytest.raises(ValueError, match=r"worst_fraction=0: expected a number in \(0, 1\]"):
        BalancedCheckpoint(policy="cvar", worst_fraction=0)
