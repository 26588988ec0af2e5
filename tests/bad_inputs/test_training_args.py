"""Issue 30 / 32: every MetamorphicTraining value the CLI takes is refused before any epoch -- one line,
exit 2, nothing written into the run directory (severity_caps used to pass construction and fail at the
first training batch with a bare ValueError after config.yaml and logs/ were written).

The values run through the CLI's ``main`` in this process (the refusal is the same code path; a fresh
interpreter per value cost ~8 CPU-s of imports each); one of them also runs as ``python -m robusttrain``,
which is what a user types, to show the process's stderr is that one line and its exit status 2."""

import os
import subprocess
import sys

import pytest

from robusttrain.cli import main

KEY = "callbacks.metamorphic_training."
BAD = [
    ("severity_caps=0", "severity_caps must be an int 1..5 or a mapping family -> 1..5"),
    ("severity_caps=7", "got 7"),
    ("severity_caps=high", "got 'high'"),
    ("severity_caps={blur: 6}", "bad values {'blur': 6}"),
    ("severity_caps={blurr: 2}", "severity_caps names ['blurr'], not families of this run"),
    ("objective=consistency", "give consistency > 0"),
    ("replace_q=0.5", "replace_q=0.5 is for objective='consistency'"),
    ("chain_depth=9", "chain_depth must be 1..5"),
    ("selection=hardest", "selection"),
    ("warmup=1.0", "warmup must be a fraction of the training steps in [0, 1)"),
]


def _refused(code: int, err: str, run, override: str, text: str) -> None:
    assert code == 2, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert f"bad value for '{KEY}{override.split('=')[0]}'" in lines[0] and text in lines[0]
    assert not run.exists() or not any(
        run.iterdir()
    )  # no config.yaml, no logs: a corrected re-run just works


@pytest.mark.parametrize(("override", "text"), BAD)
def test_bad_training_values_stop_before_any_epoch(tmp_path, capsys, monkeypatch, override, text):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    code = main(["fit", "recipe=smoke", f"run_dir={run}", KEY + override])
    _refused(code, capsys.readouterr().err, run, override, text)


@pytest.mark.slow
def test_a_bad_training_value_is_one_line_and_exit_2_from_the_command_line(tmp_path):
    override, text = BAD[0]
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "robusttrain", "fit", "recipe=smoke", f"run_dir={run}", KEY + override],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    _refused(proc.returncode, proc.stderr, run, override, text)
