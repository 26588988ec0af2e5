"""Two real commands on one run directory at the same time (issue 10, "two runs on one run directory
at once both crash and leave a mixture").

The first command is a real ``fit`` in a subprocess. It is kept in progress -- lock held, epoch 0's
files written, epoch 1 not started -- by ``hold_callback.HoldAtEpoch`` (added on the command line),
which waits for a file the test creates. Waiting for a file rather than for a long enough run keeps
the test independent of the machine's load. While it waits, real ``fit``, ``validate``, ``test`` and
``check`` commands start on the same run directory; each must be refused (exit 2, one line naming
the run directory and the first command's pid) and must change nothing in it. Released, the first
run must finish (exit 0) with the same files as an undisturbed run of the same command: compared as
in ``test_kill_resume.py`` (checkpoints tensor by tensor, ``logs/metrics.csv`` without its wall-clock
columns, every other file byte for byte, ``config.yaml`` included), with no lock or ``.tmp`` left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_kill_resume import _files, _same_checkpoint, _without_timings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TINY = [
    "recipe=smoke",
    "seed=3",
    "trainer.enable_progress_bar=false",
    "data.n_train=8",
    "data.n_val=4",
    "data.image_size=32",
    "data.batch_size=4",
    "callbacks.metamorphic.max_cases=4",
    "callbacks.mining.train_probe_size=4",
    "callbacks.metamorphic.suite.perturbations=[blur,contrast]",
    "callbacks.metamorphic.budget=null",
]  # a budget plans from measured times, which no rerun repeats
LOCK = ".robusttrain.lock"
WAIT_S = 300  # generous: 2 shared cores, several Python processes importing torch at once


def _env() -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
        OMP_NUM_THREADS="1",
        WANDB_MODE="offline",
    )
    env.pop("ROBUSTTRAIN_TEST_KILL_AT", None)
    return env


def _fit_argv(base: Path) -> list[str]:
    """The first command: a 2-epoch fit that holds at the start of epoch 1 until ``base/release``."""
    return [
        sys.executable,
        "-m",
        "robusttrain",
        "fit",
        *TINY,
        "trainer.max_epochs=2",
        f"run_dir={base / 'run'}",
        "+callbacks.hold._target_=hold_callback.HoldAtEpoch",
        "+callbacks.hold.epoch=1",
        f"+callbacks.hold.paused={base / 'paused'}",
        f"+callbacks.hold.release={base / 'release'}",
    ]


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    """Output to files, not pipes: a full pipe would block a process nobody reads yet."""
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(argv, stdout=out, stderr=err, env=_env(), cwd=log.parent)


def _err(log: Path) -> str:
    return log.with_suffix(".err").read_text()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The undisturbed run (``release`` present from the start), made at ``<base>/run`` and kept as
    ``<base>/reference``; every test then runs at ``<base>/run``, so paths written into files agree."""
    base = tmp_path_factory.mktemp("concurrent")
    (base / "release").touch()
    proc = subprocess.run(_fit_argv(base), capture_output=True, text=True, env=_env(), cwd=base, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (base / "paused").exists()  # released from the start: it never waited
    (base / "run").rename(base / "reference")
    (base / "release").unlink()
    return base


def _snapshot(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in sorted(_files(run))}


def _wait_until(cond, what: str, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                pytest.fail(f"{what}: a process ended first (rc={p.returncode})\n{_err(log)[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {WAIT_S} s")
        time.sleep(0.1)


def _assert_refused(command: str, rc: int, err: str, run: Path, holder: int) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert rc == 2, f"{command}: rc={rc}\n{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.startswith(f"robusttrain {command}: error:")]
    assert len(lines) == 1, err[-3000:]
    assert f"run_dir '{run}' is in use by another robusttrain command (pid {holder} on " in lines[0], lines[0]
    assert ", fit since " in lines[0], lines[0]


def _assert_equals_reference(run: Path, ref: Path) -> None:
    assert _files(run) == _files(ref)  # nothing missing, nothing extra (no lock, no .tmp)
    for name in sorted(_files(ref)):
        a, b = ref / name, run / name
        if name.endswith(".ckpt"):
            _same_checkpoint(a, b)
        elif name == "logs/metrics.csv":
            assert _without_timings(a) == _without_timings(b), name
        else:
            assert a.read_bytes() == b.read_bytes(), f"{name} differs from the undisturbed run"


def _finish(proc: subprocess.Popen, base: Path, log: Path) -> None:
    (base / "release").touch()
    proc.wait(timeout=600)
    assert proc.returncode == 0, _err(log)[-3000:]
    assert "Traceback" not in _err(log)


def _cleanup(procs: list[subprocess.Popen], base: Path) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(base / "run", ignore_errors=True)
    for name in ("paused", "release"):
        (base / name).unlink(missing_ok=True)


def test_commands_on_a_run_in_progress_are_refused_and_change_nothing(base):
    run, logs = base / "run", base / "logs"
    logs.mkdir(exist_ok=True)
    first_log = logs / "first"
    first = _start(_fit_argv(base), first_log)
    seconds: list[subprocess.Popen] = []
    try:
        _wait_until(
            lambda: (base / "paused").exists() and (run / LOCK).exists(),
            "first fit holding epoch 1",
            [first],
            [first_log],
        )
        assert (base / "paused").read_text() == str(first.pid)
        before = _snapshot(run)
        assert {"config.yaml", "history.csv", "efr.csv", "checkpoints/last.ckpt", LOCK} <= set(before)
        ckpt = run / "checkpoints" / "last.ckpt"
        others = {  # started together, while the first fit holds the run directory
            "fit": ["fit", *TINY, "trainer.max_epochs=2", f"run_dir={run}"],
            "validate": ["validate", *TINY, f"run_dir={run}", "ckpt=last"],
            "test": ["test", *TINY, f"run_dir={run}", "ckpt=last"],
            "check": ["check", *TINY, f"run_dir={run}", f"ckpt={ckpt}"],
        }
        seconds = [
            _start([sys.executable, "-m", "robusttrain", *argv], logs / name) for name, argv in others.items()
        ]
        for name, p in zip(others, seconds):
            p.wait(timeout=WAIT_S)
            _assert_refused(name, p.returncode, _err(logs / name), run, first.pid)
        assert first.poll() is None  # still holding: the refusals did not disturb it
        after = _snapshot(run)
        assert after.keys() == before.keys()  # no config.<command>.yaml, logs/<command>/, efr_table.csv
        changed = [name for name in before if before[name] != after[name]]
        assert not changed, f"refused commands changed {changed}"
        _finish(first, base, first_log)
        _assert_equals_reference(run, base / "reference")
    finally:
        _cleanup([first, *seconds], base)


def test_two_fits_started_together_one_trains_and_one_is_refused(base):
    """Both start at once on a fresh run directory: the OS-level lock (``flock``) lets exactly one
    through. The other exits 2 with one line: in use by the winner's pid or, if it looked in the instant
    between the winner's lock and its owner record, by an owner not yet known. The winner's files equal
    the undisturbed run's."""
    run, logs = base / "run", base / "logs2"
    logs.mkdir(exist_ok=True)
    names = [logs / "a", logs / "b"]
    procs = [_start(_fit_argv(base), log) for log in names]
    try:
        deadline = time.monotonic() + WAIT_S
        while all(p.poll() is None for p in procs):  # the refused one ends; the winner holds at epoch 1
            assert time.monotonic() < deadline, "neither fit ended"
            time.sleep(0.1)
        lost = next(i for i, p in enumerate(procs) if p.poll() is not None)
        winner, wlog = procs[1 - lost], names[1 - lost]
        err = _err(names[lost])
        assert procs[lost].returncode == 2, err[-3000:]
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("robusttrain fit: error:")]
        assert len(lines) == 1, err[-3000:]
        assert (
            f"is in use by another robusttrain command (pid {winner.pid} on " in lines[0]
            or f"run_dir '{run}' is in use by another robusttrain command (owner unknown)" in lines[0]
        ), lines[0]
        _wait_until(lambda: (base / "paused").exists(), "the winner holding epoch 1", [winner], [wlog])
        assert (base / "paused").read_text() == str(winner.pid)
        _finish(winner, base, wlog)
        _assert_equals_reference(run, base / "reference")
    finally:
        _cleanup(procs, base)
