"""Wall time of the polyp recipe with and without the robustness callbacks, side by side (one run).

Runs ``python -m robusttrain fit recipe=polyp`` (synthetic polyp set, recipe defaults: the pretrained
lite0_unet, 8 epochs, MetamorphicCallback with ``budget: 0.25``, BalancedCheckpoint, BalancedAverage,
EMACheckpoint, RobustnessReporter; FailureMiningCallback as the recipe sets it, off by default) and the same
command with ``callbacks.{metamorphic,balanced,balanced_average,ema,mining,reporting}.enabled=false``, same seed, same
epochs, alternating off/on ``--repeats`` times so both see the same machine load. The target is about
the robustness *monitoring*: ``MetamorphicTraining`` (on in the recipe) is switched off in BOTH runs --
it is a training method, not monitoring, and its cost is measured by ``benchmarks/perf/training_step.py``.

Reports the wall time of each run (process start to exit), the ratio on/off (target <= 1.3 at the
defaults; best of the repeats, and per repeat with their median), the load average before and after (the machine may be
shared), the CPU time of each run (user + system of the child process; with ``OMP_NUM_THREADS=1`` it is
the work done, which other jobs' load does not stretch as it does wall time) and its on/off ratio, and from the "on" run's logs: the training seconds each check followed, the check's own
seconds, the share of its clean pass reused from validation, how many test cases of the suite it
scored and what the final table rests on (``basis``, ``from_epoch``).

    OMP_NUM_THREADS=1 python -m benchmarks.perf.overhead [--epochs 8] [--repeats 1] [--budget 0.25]
                                                    [--only metamorphic] [-- key=value ...]

``--only metamorphic`` toggles just that callback (the others are off in both runs): the cost
of the checks alone. Extra ``key=value`` overrides after ``--`` go to both runs (e.g. ``data.n_train=80``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.common import Results, add_json_argument

ROBUST = ("metamorphic", "balanced", "balanced_average", "ema", "mining", "reporting")
# a training method, not monitoring: off in both runs (benchmarks/perf/training_step.py measures it)
ALWAYS_OFF = ("metamorphic_training",)


def _children_cpu() -> float:
    """User + system CPU seconds of the finished (waited-for) child processes so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(
    run_dir: Path, on: bool, epochs: int, budget: str, extra: list[str], toggled=ROBUST
) -> tuple[float, float]:
    """One fit as a child process: (wall seconds, the child's CPU seconds, user + system)."""
    cmd = [
        sys.executable,
        "-m",
        "robusttrain",
        "fit",
        "recipe=polyp",
        "seed=0",
        f"run_dir={run_dir}",
        f"trainer.max_epochs={epochs}",
        "trainer.enable_progress_bar=false",
        *extra,
    ]
    cmd += [f"callbacks.{c}.enabled=false" for c in ALWAYS_OFF]
    cmd += [f"callbacks.{c}.enabled=false" for c in ROBUST if c not in toggled]
    if "metamorphic" in toggled:
        cmd += [f"callbacks.metamorphic.budget={budget}"]
    cmd += [] if on else [f"callbacks.{c}.enabled=false" for c in toggled]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    # the child has been waited for, so its CPU time (and its own children's) is in the delta; with
    # OMP_NUM_THREADS=1 it is the work the run did, whatever else the machine is running
    cpu = _children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, cpu


def _ratio_line(what: str, times: dict[bool, list[float]], per: str) -> str:
    """``<what> (best of n): off | on | ratio (target); <per>: pair ratios, median`` for one measure."""
    off, on = min(times[False]), min(times[True])
    ratios = [b / a for a, b in zip(times[False], times[True])]
    return (
        f"{what} (best of {len(ratios)}): off {off:.1f} s | on {on:.1f} s | ratio {on / off:.2f}x "
        f"(target <= 1.3x); {per}: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + f", median {statistics.median(ratios):.2f}x"
    )


def check_log(run_dir: Path) -> pd.DataFrame:
    """Per epoch: training seconds the check was sized for, check seconds, test cases scored / suite."""
    metrics = pd.read_csv(run_dir / "logs" / "metrics.csv")
    cols = [c for c in ("epoch", "mr/train_s", "mr/check_s", "mr/clean_reused") if c in metrics]
    per = metrics[cols].dropna(subset=[c for c in cols if c != "epoch"]).groupby("epoch").last()
    efr = pd.read_csv(run_dir / "efr.csv")
    pooled = efr[
        (efr.perturbation == "all") & (efr.metric == "dice") & (efr.threshold == efr.threshold.min())
    ]
    for split, g in pooled.groupby("split"):
        g = g.set_index("epoch")
        per[f"{split} scored"] = (
            g["cases"].astype(int).astype(str) + "/" + g["suite_cases"].astype(int).astype(str)
        )
    val = pooled[pooled.split == "val"].set_index("epoch")
    for col in ("final", "basis", "from_epoch"):
        if col in val:
            per[col] = val[col]
    return per


def _load() -> str:
    """1/5/15-minute load averages (the machine may be shared: say how busy it was)."""
    try:
        return "/".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8, help="the polyp recipe's default")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--budget", default="0.25", help="the recipe default; 'null' = full suite every epoch")
    ap.add_argument("--only", choices=ROBUST, default=None, help="toggle only this callback")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temp dir)")
    ap.add_argument("extra", nargs="*", help="overrides for both runs (after --)")
    add_json_argument(ap)
    args = ap.parse_args(argv)
    results = Results("benchmarks.perf.overhead", args, argv=argv)
    print(results.header_line())
    root = Path(args.out or tempfile.mkdtemp(prefix="rt_overhead_"))
    toggled = (args.only,) if args.only else ROBUST
    print(
        f"polyp recipe, {args.epochs} epochs, seed 0, budget {args.budget}, toggled: {', '.join(toggled)} "
        f"(others and {', '.join(ALWAYS_OFF)} off in both); OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; runs in {root}",
        flush=True,
    )
    load0 = _load()
    walls: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.repeats):
        for on in (False, True):
            w, c = run(
                root / f"{'on' if on else 'off'}{r}", on, args.epochs, args.budget, args.extra, toggled
            )
            walls[on].append(w)
            cpus[on].append(c)
            print(
                f"  repeat {r}: callbacks {'on ' if on else 'off'} {w:7.1f} s wall, {c:7.1f} s CPU "
                f"(load {_load()})",
                flush=True,
            )
    # the load may drift between repeats: a pair run back to back shares it, the best-of may not
    print(
        "\n"
        + _ratio_line("wall time", walls, "per repeat (off/on back to back)")
        + f"; load average (1/5/15 min) {load0} before, {_load()} after"
    )
    # CPU time (user + system of the child): with one thread per run it is the work done, which other
    # jobs' load does not change (it stretches the wall time only), so it compares runs on a busy machine
    print(
        _ratio_line("CPU time", cpus, "per repeat")
        + (
            ""
            if os.environ.get("OMP_NUM_THREADS") == "1"
            else " (OMP_NUM_THREADS is not 1: CPU time also counts threads that wall time overlaps)"
        )
    )
    cols = ["repeat", "callbacks", "wall (s)", "CPU (s)"]
    rows = [
        [r, "on" if on else "off", walls[on][r], cpus[on][r]]
        for r in range(args.repeats)
        for on in (False, True)
    ]
    results.table("runs", cols, rows, {"wall (s)": "{:.1f}", "CPU (s)": "{:.1f}"})
    results.notes["ratio_wall_best_of"] = min(walls[True]) / min(walls[False])
    results.notes["ratio_cpu_best_of"] = min(cpus[True]) / min(cpus[False])
    per = check_log(root / f"on{args.repeats - 1}")
    print("\nper check, callbacks on (last repeat):")
    print(per.to_string())
    if "mr/check_s" in per and "mr/train_s" in per:
        checks, train = float(per["mr/check_s"].sum()), float(per["mr/train_s"].sum())
        extra = walls[True][-1] - walls[False][-1]
        line = (
            f"\nMR checks {checks:.1f} s = {checks / train:.2f} x the {train:.1f} s of training they follow"
        )
        if not args.only:
            line += (
                f"; the rest of the on-off difference ({extra - checks:.1f} s of {extra:.1f} s): the other "
                "callbacks (corner cases, candidate checkpoints, weight snapshots and average, plots; "
                "failure mining when enabled) and load changes between the two runs"
            )
        print(line)
        results.notes |= {"mr_check_s": checks, "mr_train_s": train}
    results.write(args.json)


if __name__ == "__main__":
    main()
