"""The report states what each table rests on and reads as a report, not a warning list (issue 48 item 4):
the final EFR table's basis, integers as integers, the recipes' ``window: lr_tail``, features the recipe
left off as one quiet line, the check table's clean row apart from the EFR columns, and where each
checkpoint policy's weights are (item 7)."""

from __future__ import annotations

import json
import re

import pandas as pd
from test_reporting_helpers import make_run_dir

from robusttrain.reporting.html import render_report


def _text(html: str, section: str) -> str:
    part = html[html.index(f'<section id="{section}">') :]
    return part[: part.index("</section>")]


def test_the_final_efr_table_says_it_rests_on_the_rotation_and_why_check_differs(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=4, endpoints=True)
    efr = pd.read_csv(run / "efr.csv")
    last = efr["epoch"] == 3
    efr["final"], efr["basis"], efr["from_epoch"] = last, "subset", efr["epoch"]
    efr.loc[last, "basis"], efr.loc[last, "from_epoch"] = "rotation", 1
    efr.to_csv(run / "efr.csv", index=False)
    section = _text(render_report(run), "efr-table")
    assert "basis=rotation, from_epoch=1" in section
    assert "weights of epochs 1-3 (not the final weights alone)" in section
    assert "robusttrain check on the final checkpoint scores every pair with epoch 3&#39;s weights" in section


def test_the_balanced_average_shows_lr_tail_and_counts_as_integers(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=4)
    average = {
        "status": "ok",
        "window": "lr_tail",
        "rule": "lr_tail",
        "window_epochs": [2, 3],
        "averaged_epochs": [2, 3],
        "checkpoint": "balanced_average.ckpt",
    }
    (run / "balanced_average.json").write_text(json.dumps(average))
    section = _text(render_report(run), "training")
    assert "<td>lr_tail: the epochs of the constant-LR tail</td>" in section
    assert "<td>?</td>" not in section
    rows = re.findall(r"<th>averaged epochs \(mean\)</th>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>", section)
    assert rows == [("2", "8")]  # epochs, cases: not 2.0000 / 8.0000
    average["rule"] = "fraction"  # the run had no tail: BalancedAverage fell back to the last half
    (run / "balanced_average.json").write_text(json.dumps(average))
    assert "lr_tail: the run had no constant-LR tail, so the last 50 %" in _text(
        render_report(run), "training"
    )


def test_features_the_recipe_left_off_are_one_quiet_line(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=3)
    config = "recipe: polyp\ncallbacks:\n  ema: {enabled: false}\n  mining: {enabled: false}\n"
    config += "  metamorphic_training: {enabled: true}\n  balanced_average: {enabled: true}\n"
    (run / "config.yaml").write_text(config)
    section = _text(render_report(run), "training")
    assert "Off in this run: EMA, failure mining -- switch on with" in section
    assert "<code>callbacks.ema.enabled=true</code>" in section
    assert "ema.ckpt missing" not in section
    # what the recipe has on but the run did not write is still news
    assert "not available: metamorphic_training.csv missing" in section
    assert "not available: balanced_average.json missing" in section


def test_the_check_table_says_the_clean_dice_apart_from_the_efr_columns(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=2)
    rows = [
        {
            "threshold": t,
            "perturbation": p,
            "held out": "",
            "val/Dice": e,
            "val/IoU": e + 1,
            "val/perturbed Dice": 80.0,
        }
        for t in (0.5, 0.25)
        for p, e in (("blur", 10.0), ("all", 12.0))
    ]
    rows += [
        {
            "threshold": t,
            "perturbation": "clean",
            "held out": "",
            "val/Dice": 85.71,
            "val/IoU": 75.0,
            "val/perturbed Dice": 85.71,
        }
        for t in (0.5, 0.25)
    ]
    pd.DataFrame(rows).to_csv(run / "efr_table.csv", index=False)
    section = _text(render_report(run), "efr-table")
    assert "Clean, no perturbation (mean over cases with a lesion): val: Dice 85.71 %, IoU 75.0 %." in section
    assert "<td>clean</td>" not in section  # no row puts the clean Dice under the EFR % header
    assert section.count("<td>blur</td>") == 2


def test_the_tradeoff_table_says_where_each_policys_weights_are(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=6)
    corners = json.loads((run / "corner_cases.json").read_text())
    corners.update(candidate_epochs=[1, 2, 3, 4, 5], checkpoint="balanced.ckpt")
    (run / "corner_cases.json").write_text(json.dumps(corners))
    html = render_report(run)
    picks = json.loads((run / "corner_cases.json").read_text())
    from robusttrain.reporting.plots import run_tradeoff
    from robusttrain.rundir.corner_cases import parse

    trade = run_tradeoff(pd.read_csv(run / "history.csv"), parse(picks))
    other = "cvar"
    e = trade.choices[other]
    (run / "balanced.ckpt").write_bytes(b"x")
    (run / "balanced_picks").mkdir()
    (run / "balanced_picks" / f"epoch={e:04d}.ckpt").write_bytes(b"x")
    picks["policy_checkpoints"] = {
        "last_inlier": "balanced.ckpt",
        other: f"balanced_picks/epoch={e:04d}.ckpt",
    }
    (run / "corner_cases.json").write_text(json.dumps(picks))
    section = _text(render_report(run), "tradeoff")
    assert "This run's policy is <b>last_inlier</b>" in section
    assert f"balanced.ckpt</code> holds its epoch {picks['balanced_epoch']}" in section
    assert "the epochs whose weights the run kept (1, 2, 3, 4, 5)" in section
    assert "<td>balanced.ckpt (this run" in section
    assert f"<td>balanced_picks/epoch={e:04d}.ckpt</td>" in section
    assert "<td>not kept</td>" in _text(html, "tradeoff")  # before the files were there
