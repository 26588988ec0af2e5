"""kill -9 a ``fit`` at named points, resume with ``ckpt=last``: the run directory must equal an
uninterrupted run of the same seed -- every file, nothing duplicated, nothing missing, nothing left over.

The kill comes from ``ROBUSTTRAIN_TEST_KILL_AT=NAME:N`` (robusttrain.io.kill_point): SIGKILL the N-th
time the process reaches NAME. Points: mid-epoch (before a training step's metrics row is appended),
inside the metamorphic check's writes (history.csv already replaced, efr.csv not yet), and inside a
checkpoint save (the new last.ckpt fully written to its temp file, not yet renamed), and the end-of-fit
window (after the last epoch's last.ckpt: inside the writes of balanced.ckpt and corner_cases.json, where
Lightning has no epoch left to run on resume). The same with SIGTERM instead of SIGKILL
(``ROBUSTTRAIN_TEST_KILL_SIGNAL=TERM``): exit 143 after the graceful path, then the same resume.

Compared byte for byte: every file except the ``.ckpt`` files and ``config.yaml``. Checkpoints embed
pickled Lightning/optimizer bookkeeping, so their weights, optimizer state, epoch and step are compared
exactly instead; ``config.yaml`` is the config of the fit that started the run (a resume keeps it: issue
46), byte for byte. ``logs/metrics.csv`` is compared byte for byte
without the wall-clock columns (``mr/check_s``, ``mr/train_s``: seconds the MR check took). The
recipe's robustness budget stays on: it plans in work units, not seconds, and in the kills inside an
epoch's work (``UNDER_LOAD``) the killed and resumed runs share the CPU with two busy processes (the
reference does not), so a plan that depended on the clock would show there. The other kills run
without the busy processes: the budget plan is the same code whatever the kill point, and two busy
processes on every kill doubled the wall time of the whole suite on a two-core CI machine. Both runs
use the same run_dir path, so the paths written into files agree. The recipe's augmentations stay on: their random streams, the shuffle order and the
global RNG travel in the checkpoint (the datamodule's state_dict).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "recipe=smoke",
    "seed=3",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "data.n_train=16",
    "data.n_val=6",
    "data.image_size=48",
    "callbacks.metamorphic.suite.perturbations=[blur,contrast,instrument]",
    "callbacks.mining.train_probe_size=8",
]
TIMINGS = {"mr/check_s", "mr/train_s"}  # measured seconds: no two runs agree
KILLS = {
    "mid-epoch": "log:metrics.csv:5",  # epoch 1, after its first training step (see metrics.csv rows)
    "mr-write": "write:efr.csv:2",  # epoch 1's MR check: history.csv replaced, efr.csv not
    "checkpoint-save": "write:last.ckpt:2",  # epoch 1's last.ckpt written to its temp file, not renamed
    "last-epoch-mr-write": "write:mr_cases.csv:3",  # the final epoch, after efr.csv
    # the end-of-fit window: the last epoch's last.ckpt is saved, Lightning has no epoch left to run
    "end-of-fit-balanced-ckpt": "write:balanced.ckpt:1",  # balanced.ckpt complete in its temp file
    "end-of-fit-corner-cases": "write:corner_cases.json:1",  # balanced.ckpt written, corner_cases.json not
    # SIGTERM (docker stop, SLURM preemption, timeout): the graceful path, exit 143, then ckpt=last
    "sigterm-mid-epoch": "TERM:log:metrics.csv:5",
    "sigterm-end-of-fit": "TERM:write:corner_cases.json:1",
}
UNDER_LOAD = {"mid-epoch", "mr-write"}  # the kills inside the epochs whose MR check the budget plans


def _fit(run_dir: Path, *extra: str, kill: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WANDB_MODE="offline")
    env.pop("ROBUSTTRAIN_TEST_KILL_AT", None)
    env.pop("ROBUSTTRAIN_TEST_KILL_SIGNAL", None)
    if kill and kill.startswith("TERM:"):
        env["ROBUSTTRAIN_TEST_KILL_SIGNAL"], kill = "TERM", kill[len("TERM:") :]
    if kill:
        env["ROBUSTTRAIN_TEST_KILL_AT"] = kill
    return subprocess.run(
        [sys.executable, "-m", "robusttrain", "fit", *ARGS, f"run_dir={run_dir}", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The uninterrupted reference run, made at ``<base>/run`` and kept as ``<base>/reference``."""
    base = tmp_path_factory.mktemp("kill")
    proc = _fit(base / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (base / "run").rename(base / "reference")
    return base


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def _without_timings(path: Path) -> list[list[str]]:
    rows = list(csv.reader(path.read_text().splitlines()))
    keep = [i for i, c in enumerate(rows[0]) if c not in TIMINGS]
    return [[r[i] for i in keep] for r in rows]


def _same_checkpoint(a: Path, b: Path) -> None:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert (x["epoch"], x["global_step"]) == (y["epoch"], y["global_step"]), a.name
    assert x["state_dict"].keys() == y["state_dict"].keys()
    for k in x["state_dict"]:
        assert torch.equal(x["state_dict"][k], y["state_dict"][k]), f"{a.name}: {k}"
    # weights-only checkpoints (balanced_average.ckpt, ema.ckpt) carry no optimizer state
    assert ("optimizer_states" in x) == ("optimizer_states" in y), a.name
    for ox, oy in zip(x.get("optimizer_states", []), y.get("optimizer_states", [])):
        for i in ox["state"]:
            for k, v in ox["state"][i].items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(oy["state"][i][k])), (
                    f"{a.name}: opt {i}.{k}"
                )


@pytest.mark.parametrize("where", list(KILLS))
def test_killed_and_resumed_run_equals_uninterrupted(base, where, cpu_hog):
    run, ref = base / "run", base / "reference"
    load = cpu_hog if where in UNDER_LOAD else contextlib.nullcontext
    with load():
        killed = _fit(run, kill=KILLS[where])
    term = KILLS[where].startswith("TERM:")
    if term:  # the graceful path: one line, exit 143, the lock released
        assert killed.returncode == 143, f"rc={killed.returncode}\n{killed.stderr[-2000:]}"
        assert "robusttrain fit: error: stopped by SIGTERM; resume with ckpt=last" in killed.stderr
        assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
        assert not (run / ".robusttrain.owner").exists()
    else:
        assert killed.returncode == -9, (
            f"not killed at {KILLS[where]}: rc={killed.returncode}\n{killed.stderr[-2000:]}"
        )
        assert (run / ".robusttrain.owner").exists()  # what a kill leaves behind
    with load():
        resumed = _fit(run, "ckpt=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert term or "took over the lock of an interrupted run" in resumed.stderr
    try:
        assert _files(run) == _files(ref)  # nothing missing, nothing extra (no .tmp, no lock)
        for name in sorted(_files(ref)):
            a, b = ref / name, run / name
            if name.endswith(".ckpt"):
                _same_checkpoint(a, b)
            elif name == "logs/metrics.csv":
                assert _without_timings(a) == _without_timings(b), (
                    f"{name} differs after a kill at {KILLS[where]}"
                )
            else:
                assert a.read_bytes() == b.read_bytes(), f"{name} differs after a kill at {KILLS[where]}"
    finally:
        shutil.rmtree(run)


# a pretrained BatchNorm network (its verified ImageNet weights at the start, recorded in pretrained.json)
# with every callback of the smoke recipe on, the EMA too: its weights and BN statistics, the balanced
# average's re-estimated statistics and every file end as in an uninterrupted run
BN_MODEL = [
    "model=lite0_unet",
    "model.features=[16,8,8,8,8]",
    "data.image_size=64",
    "callbacks.ema.enabled=true",
]
BN_KILLS = {"mid-epoch": "log:metrics.csv:5", "end-of-fit-balanced-ckpt": "write:balanced.ckpt:1"}


@pytest.fixture(scope="module")
def bn_base(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("kill_bn")
    proc = _fit(base / "run", *BN_MODEL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pretrained weights: efficientnet-lite0-57934424.pth" in proc.stdout
    (base / "run").rename(base / "reference")
    return base


@pytest.mark.parametrize("where", list(BN_KILLS))
def test_a_pretrained_batchnorm_model_killed_and_resumed_equals_uninterrupted(bn_base, where):
    run, ref = bn_base / "run", bn_base / "reference"
    shutil.rmtree(run, ignore_errors=True)  # what an earlier parameter left if it was stopped (a timeout)
    try:
        killed = _fit(run, *BN_MODEL, kill=BN_KILLS[where])
        assert killed.returncode == -9, (
            f"not killed at {BN_KILLS[where]}: rc={killed.returncode}\n{killed.stderr[-2000:]}"
        )
        resumed = _fit(run, *BN_MODEL, "ckpt=last")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _files(run) == _files(ref)
        assert {"ema.ckpt", "balanced_average.ckpt", "pretrained.json"} <= _files(ref)
        for name in sorted(_files(ref)):
            a, b = ref / name, run / name
            if name.endswith(".ckpt"):
                _same_checkpoint(a, b)
            elif name == "logs/metrics.csv":
                assert _without_timings(a) == _without_timings(b), name
            elif name != "config.yaml":
                assert a.read_bytes() == b.read_bytes(), f"{name} differs after a kill at {BN_KILLS[where]}"
        state = torch.load(ref / "ema.ckpt", weights_only=True)["state_dict"]
        assert any(k.endswith("running_var") for k in state)  # the EMA carries BatchNorm statistics
    finally:
        shutil.rmtree(run)
