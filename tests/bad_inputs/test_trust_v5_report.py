"""Issue 46 finding 7: ``report`` refuses values a run cannot have in one line, like a torn CSV.

A run directory is untrusted: a well-formed file can still hold numbers no run writes -- a count of
``1e308`` (an ``int`` cast shows it as -9223372036854775808), averaged epochs ``[0, 1e300, -7]`` of a
1-epoch run, a checkpoint named outside the run directory. Each is refused by the file's one reader
(``robusttrain/rundir/``) with a line naming the file, the key and the value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reporting_helpers import make_run_dir

from robusttrain.cli import main

STATS = "epoch,family,candidates,chosen,rejected\n0,blur,8,4,0\n0,jpeg,4,2,1\n"
AVERAGE = {
    "status": "ok",
    "window": "lr_tail",
    "rule": "lr_tail",
    "window_epochs": [0],
    "averaged_epochs": [0],
    "excluded_epochs": [],
    "missing_epochs": [],
    "checkpoint": "balanced_average.ckpt",
}


def _run_dir(tmp_path: Path) -> Path:
    run = make_run_dir(tmp_path / "run", epochs=1)
    (run / "metamorphic_training.csv").write_text(STATS)
    (run / "balanced_average.json").write_text(json.dumps(AVERAGE))
    return run


def _report(run: Path, capsys) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main(["report", str(run)])
    _, err = capsys.readouterr()
    assert "Traceback" not in err, err[-3000:]
    return code, [x for x in err.splitlines() if x.startswith("robusttrain report: error:")], err


def test_a_run_directory_with_possible_values_still_reports(tmp_path, capsys):
    run = _run_dir(tmp_path)
    code, errors, err = _report(run, capsys)
    assert code == 0 and not errors, err[-2000:]
    assert "<td>8</td>" in (run / "report.html").read_text()  # blur's 8 candidates, as an integer


def _edit_json(run: Path, name: str, **values) -> None:
    obj = json.loads((run / name).read_text())
    obj.update(values)
    (run / name).write_text(json.dumps(obj))


CASES = {
    # metamorphic_training.csv: counts
    "candidates-1e308": (
        lambda run: (run / "metamorphic_training.csv").write_text(STATS.replace("0,blur,8", "0,blur,1e308")),
        ["metamorphic_training.csv' line 2: candidates holds 1e+308, which no run writes"],
    ),
    "chosen-negative": (
        lambda run: (run / "metamorphic_training.csv").write_text(STATS.replace("8,4,0", "8,-3,0")),
        ["metamorphic_training.csv' line 2: chosen holds -3"],
    ),
    "rejected-fraction": (
        lambda run: (run / "metamorphic_training.csv").write_text(STATS.replace("4,2,1", "4,2,0.5")),
        ["metamorphic_training.csv' line 3: rejected holds 0.5"],
    ),
    # balanced_average.json: epochs and the checkpoint
    "averaged-epochs-impossible": (
        lambda run: _edit_json(run, "balanced_average.json", averaged_epochs=[0, 1e300, -7]),
        ["balanced_average.json': averaged_epochs holds 1e+300, which no run writes"],
    ),
    "averaged-epoch-outside-the-window": (
        lambda run: _edit_json(run, "balanced_average.json", averaged_epochs=[0, 5]),
        [
            "balanced_average.json': averaged_epochs holds epoch 5, which is not one of the window_epochs ([0])"
        ],
    ),
    "average-checkpoint-outside-the-run": (
        lambda run: _edit_json(run, "balanced_average.json", checkpoint="../../elsewhere/weights.ckpt"),
        ["balanced_average.json': checkpoint is '../../elsewhere/weights.ckpt', which no run writes"],
    ),
    "average-window-not-a-setting": (
        lambda run: _edit_json(run, "balanced_average.json", window="<b>w</b>", averaged_epochs="all"),
        [
            "balanced_average.json': averaged_epochs holds 'all', which no run writes (expected a list of epoch"
        ],
    ),
    # corner_cases.json: epochs, the chosen checkpoint, the other policies' weights
    "balanced-epoch-huge": (
        lambda run: _edit_json(run, "corner_cases.json", balanced_epoch=1e308),
        ["corner_cases.json': balanced_epoch holds 1e+308, which no run writes"],
    ),
    "least-loss-epoch-negative": (
        lambda run: _edit_json(run, "corner_cases.json", least_loss_epoch=-7),
        ["corner_cases.json': least_loss_epoch holds -7"],
    ),
    "balanced-epoch-not-a-candidate": (
        lambda run: _edit_json(run, "corner_cases.json", balanced_epoch=0, candidate_epochs=[3, 4]),
        ["corner_cases.json': balanced_epoch holds epoch 0, which is not one of the candidate_epochs"],
    ),
    "balanced-checkpoint-outside-the-run": (
        lambda run: _edit_json(run, "corner_cases.json", checkpoint="/etc/passwd"),
        ["corner_cases.json': checkpoint is '/etc/passwd', which no run writes"],
    ),
    "policy-checkpoint-outside-the-run": (
        lambda run: _edit_json(
            run, "corner_cases.json", policy_checkpoints={"cvar": "balanced_picks/../../x.ckpt"}
        ),
        [
            "corner_cases.json': policy_checkpoints['cvar'] is 'balanced_picks/../../x.ckpt', which no run writes"
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_report_refuses_a_value_no_run_writes_in_one_line(case, tmp_path, capsys):
    run = _run_dir(tmp_path)
    edit, texts = CASES[case]
    edit(run)
    code, errors, err = _report(run, capsys)
    assert code == 2, err[-2000:]
    assert len(errors) == 1, err[-2000:]
    for text in texts:
        assert text in errors[0], errors[0]
    assert not (run / "report.html").exists()  # nothing rendered from it
