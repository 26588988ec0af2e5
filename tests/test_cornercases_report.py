"""corners_report: least-loss epoch from corner_cases.json, metrics.csv, or unknown."""

import json

import pandas as pd

from robusttrain.cornercases import corners_report


def curves(n_cases=10, n_epochs=10):
    rows = []
    for e in range(n_epochs):
        for i in range(n_cases):
            v = 0.6 + 0.03 * e + 0.001 * ((7 * i + 3 * e) % 5)
            rows.append(
                {"case_id": f"p{i:02d}", "epoch": e, "dice_rv": v, "dice_myo": v - 0.01, "dice_lv": v + 0.01}
            )
    return rows


def set_case(rows, case, values, epoch):
    for r in rows:
        if r["case_id"] == case and r["epoch"] == epoch:
            r.update(dict(zip(("dice_rv", "dice_myo", "dice_lv"), values)))
    return rows


def planted(tmp_path):
    h = pd.DataFrame(set_case(curves(), "p05", [0.05, 0.10, 0.08], epoch=9))
    h.to_csv(tmp_path / "history.csv", index=False)
    return h


def test_report_from_metrics_csv(tmp_path):
    planted(tmp_path)
    logs = tmp_path / "lightning_logs" / "version_0"
    logs.mkdir(parents=True)
    pd.DataFrame({"epoch": [7, 8, 9, 9], "step": [1, 2, 3, 3], "val/loss": [0.5, 0.4, 0.3, None]}).to_csv(
        logs / "metrics.csv", index=False
    )
    text = corners_report(tmp_path)
    assert "least-loss epoch: 9 (lightning_logs/version_0/metrics.csv:val/loss)" in text
    assert "balanced epoch (last_inlier): 8" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("p05"))
    assert "[9]" in line and "+0." in line  # p05 gains at the balanced epoch


def test_report_prefers_corner_cases_json_and_its_candidates(tmp_path):
    planted(tmp_path)
    (tmp_path / "corner_cases.json").write_text(
        json.dumps({"least_loss_epoch": 9, "candidate_epochs": [5, 9]})
    )
    text = corners_report(tmp_path / "history.csv", policy="maximin")
    assert "least-loss epoch: 9 (corner_cases.json)" in text and "balanced epoch (maximin): 5" in text


def test_report_unknown_least_loss(tmp_path):
    h = planted(tmp_path)
    text = corners_report(h)
    assert "least-loss epoch: unknown" in text and "n/a" in text
    assert "p05" in text  # still flagged at the last epoch


def test_report_uses_min_epoch_from_corner_cases_json(tmp_path):
    planted(tmp_path)
    (tmp_path / "corner_cases.json").write_text(json.dumps({"least_loss_epoch": 9, "min_epoch": 3}))
    text = corners_report(tmp_path)
    assert "balanced epoch (last_inlier): 8" in text
    assert "p05" in text and "[9]" in text
