"""Hand-made histories where the corner cases, collapse epochs and balanced epoch are known."""

import numpy as np
import pandas as pd
import pytest

from robusttrain.cornercases import (
    MIN_SAMPLES,
    find_corner_cases,
    find_outlier_epochs,
    load_history,
    select_balanced_epoch,
)

CLASSES = ("rv", "myo", "lv")
# 10 cases at contamination 0.1: PyOD's percentile rule flags at most one, so answers are exact.


def cohort(n=10, epoch=0, seed=0, centre=0.85, spread=0.03):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        r = {"case_id": f"p{i:02d}", "epoch": epoch}
        r.update(
            {f"dice_{c}": float(np.clip(centre + spread * rng.standard_normal(), 0, 1)) for c in CLASSES}
        )
        rows.append(r)
    return rows


def set_case(rows, case, value, epoch=None):
    for r in rows:
        if r["case_id"] == case and (epoch is None or r["epoch"] == epoch):
            r.update({f"dice_{c}": v for c, v in zip(CLASSES, np.broadcast_to(value, 3))})
    return rows


def curves(n_cases=10, n_epochs=10, seed=1):
    """Every case improves 0.60 → 0.87 with small noise; epoch is 0-based."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n_epochs):
        for i in range(n_cases):
            base = 0.6 + 0.03 * e
            r = {"case_id": f"p{i:02d}", "epoch": e}
            r.update({f"dice_{c}": base + 0.005 * rng.standard_normal() for c in CLASSES})
            rows.append(r)
    return rows


def test_planted_low_patient_is_flagged_both_tails():
    rows = set_case(cohort(), "p07", [0.20, 0.44, 0.35])
    for tail in ("low", "both"):
        res = find_corner_cases(pd.DataFrame(rows), tail=tail)
        assert res.ok and res.case_ids == ["p07"], (tail, res.case_ids)
        assert res.scores["p07"] == max(res.scores.values())
        assert set(res.contributions["p07"]) == {"dice_rv", "dice_myo", "dice_lv"}
        assert res.scores["p07"] == pytest.approx(sum(res.contributions["p07"].values()))


def test_unusually_good_patient_only_flagged_two_sided():
    rows = set_case(set_case(cohort(seed=3), "p03", 0.99), "p08", 0.30)
    low = find_corner_cases(pd.DataFrame(rows), tail="low", contamination=0.2)
    both = find_corner_cases(pd.DataFrame(rows), tail="both", contamination=0.2)
    assert "p03" not in low.case_ids and "p08" in low.case_ids
    assert low.contributions["p03"] == {f"dice_{c}": 0.0 for c in CLASSES}
    assert set(both.case_ids) == {"p03", "p08"}


def test_planted_collapse_epoch_and_last_inlier():
    rows = set_case(curves(), "p05", [0.05, 0.10, 0.08], epoch=9)  # collapse at the last epoch
    h = pd.DataFrame(rows)
    assert find_corner_cases(h).case_ids == ["p05"]
    oe = find_outlier_epochs(h, "p05")
    assert oe.ok and oe.epochs == [9]
    sel = select_balanced_epoch(h)
    assert (sel.epoch, sel.status, sel.outlier_epochs) == (8, "ok", {"p05": [9]})
    assert 9 not in sel.inlier_epochs and "last remaining epoch is 8" in sel.reason


def test_mid_training_collapse_with_least_loss_reference():
    rows = set_case(curves(), "p02", 0.15, epoch=7)
    h = pd.DataFrame(rows)
    sel = select_balanced_epoch(h, reference_epoch=7)
    assert sel.corner_cases.case_ids == ["p02"] and sel.outlier_epochs == {"p02": [7]}
    assert sel.epoch == 9  # later epochs are fine: last inlier is the last epoch
    sel = select_balanced_epoch(h, reference_epoch=7, candidates=[5, 6, 7])
    assert sel.epoch == 6  # pruned weights cannot be chosen


def test_maximin_and_pareto_prefer_the_corner_case_peak():
    rows = curves()
    # p04 peaks at epoch 4, drifts down, and collapses at epoch 9
    for e, v in {4: 0.80, 5: 0.70, 6: 0.62, 7: 0.58, 8: 0.55, 9: 0.05}.items():
        set_case(rows, "p04", v, epoch=e)
    h = pd.DataFrame(rows)
    last = select_balanced_epoch(h, "last_inlier")
    mm = select_balanced_epoch(h, "maximin")
    par = select_balanced_epoch(h, "pareto")
    assert last.epoch == 8 and mm.epoch == 4
    # epochs 0-3 are below epoch 4 on both cohort and worst case, 9 is the collapse: the front is 4-8, where
    # the cohort rises as p04 falls; epoch 4 is nearest the utopia point (best cohort 0.81, best worst 0.80)
    assert par.epoch == 4 and par.epoch in par.inlier_epochs
    assert "Pareto front [4, 5, 6, 7, 8]" in par.reason
    assert "Pareto front" in par.reason
    assert mm.table[4]["worst"] == pytest.approx(0.80)


def test_deterministic_under_row_order_and_ties():
    rows = set_case(cohort(n=10), "p01", 0.3)
    rows = set_case(rows, "p02", 0.3)  # exact tie with p01
    h = pd.DataFrame(rows)
    a = find_corner_cases(h, contamination=0.2)
    b = find_corner_cases(h.sample(frac=1.0, random_state=5), contamination=0.2)
    assert a.case_ids == b.case_ids and a.scores == b.scores
    assert a.case_ids == sorted(a.case_ids)  # equal scores → ordered by id


def test_constant_columns():
    rows = cohort(n=10)
    for r in rows:
        r["dice_rv"] = 1.0
    set_case(rows, "p06", [1.0, 0.2, 0.3])
    res = find_corner_cases(pd.DataFrame(rows))
    assert res.case_ids == ["p06"] and res.contributions["p06"]["dice_rv"] == 0.0
    flat = pd.DataFrame([{"case_id": f"c{i}", "epoch": 0, "dice_a": 0.5, "dice_b": 0.5} for i in range(8)])
    res = find_corner_cases(flat)
    assert res.ok and res.case_ids == []


def test_nan_and_missing_cases():
    rows = set_case(curves(), "p05", 0.05, epoch=9)
    rows = [r for r in rows if not (r["case_id"] == "p05" and r["epoch"] == 3)]  # p05 missing at epoch 3
    rows[0]["dice_lv"] = float("nan")  # p00 NaN at epoch 0
    h = pd.DataFrame(rows)
    res = find_corner_cases(h, epoch=0)
    assert "p00" in res.skipped and "p00" not in res.scores
    oe = find_outlier_epochs(h, "p05")
    assert oe.epochs == [9] and 3 not in oe.scores
    assert select_balanced_epoch(h).epoch == 8


def test_not_enough_data_is_explicit():
    tiny = pd.DataFrame(cohort(n=MIN_SAMPLES - 1))
    res = find_corner_cases(tiny)
    assert res.status == "not_enough_data" and res.case_ids == [] and "not enough data" in res.reason
    short = pd.DataFrame(curves(n_epochs=4))
    assert find_outlier_epochs(short, "p00").status == "not_enough_data"
    sel = select_balanced_epoch(pd.DataFrame(curves(n_cases=3)))
    assert sel.status == "not_enough_data" and sel.epoch == 9
    assert select_balanced_epoch(pd.DataFrame(curves()), candidates=[]).epoch is None
    assert find_outlier_epochs(short, "nobody").status == "not_enough_data"


def test_no_inlier_candidate_falls_back():
    rows = set_case(curves(), "p05", 0.05, epoch=9)
    sel = select_balanced_epoch(pd.DataFrame(rows), candidates=[9])
    assert sel.status == "no_inlier_epoch" and sel.epoch == 9


def test_min_epoch_skips_warmup():
    rows = set_case(curves(), "p05", 0.05, epoch=9)
    sel = select_balanced_epoch(pd.DataFrame(rows), min_epoch=3)
    assert sel.candidates[0] == 3 and sel.epoch == 8


def test_inputs_csv_rundir_and_errors(tmp_path):
    h = pd.DataFrame(set_case(cohort(), "p07", 0.2))
    h["iou_lv"] = h["dice_lv"] / (2 - h["dice_lv"])
    h.to_csv(tmp_path / "history.csv", index=False)
    assert find_corner_cases(tmp_path).case_ids == ["p07"]
    assert find_corner_cases(tmp_path / "history.csv", metric="iou").columns == ["iou_lv"]
    dup = pd.concat([h, h.assign(dice_lv=0.0)])  # a resumed run re-logged epoch 0: last row wins
    assert (load_history(dup)["dice_lv"] == 0.0).all()
    with pytest.raises(ValueError, match="epoch"):
        find_corner_cases(h.drop(columns="epoch"))
    with pytest.raises(ValueError, match="hd_"):
        find_corner_cases(h, metric="hd")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        find_corner_cases(tmp_path / "nope.csv")
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError, match="history.csv"):
        find_corner_cases(tmp_path / "run")
    with pytest.raises(ValueError, match="tail"):
        find_corner_cases(h, tail="high")
    with pytest.raises(ValueError, match="contamination"):
        find_corner_cases(h, contamination=0.7)
    with pytest.raises(ValueError, match="policy"):
        select_balanced_epoch(h, policy="best")
