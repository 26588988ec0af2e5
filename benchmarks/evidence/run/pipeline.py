"""One (condition, seed) run: the protocol's steps in order."""

from __future__ import annotations

import argparse
import json

from benchmarks.evidence.run.pick import pick_checkpoints
from benchmarks.evidence.run.score import score_curve, score_heldout, score_mr
from benchmarks.evidence.run.state import RunState
from benchmarks.evidence.run.summary import dataset_dir
from benchmarks.evidence.run.train import train_run
from benchmarks.evidence.run.write import write_run


def run_one(cond: str, seed: int, args_dict: dict) -> dict:
    """Train one (condition, seed), pick every checkpoint on validation, report on held-out data.

    The protocol's steps, in order: :func:`train_run` (fit), :func:`pick_checkpoints` (validation
    only), :func:`score_heldout` (clean per-case Dice of every pick), :func:`score_mr` (the fixed MR
    suite at the ``--efr-policies`` picks), :func:`write_run` (``result.json`` and artifacts).

    With ``--resume``: a finished run (``result.json``) is read back; an interrupted one (v3: its
    ``fit/last.ckpt``, written after every epoch) continues from its last epoch."""
    args = argparse.Namespace(**args_dict)
    v5 = getattr(args, "protocol", "v3") == "v5"
    v4 = getattr(args, "protocol", "v3") == "v4" or v5
    # the v3 machinery (resumable fit, per-epoch weights, averages, kept checkpoints) serves v4 / v5 too
    v3 = args.dataset in ("polyp256", "pranet256", "synthetic") or v4
    device = "cuda" if getattr(args, "accelerator", "cpu") == "gpu" else "cpu"
    profile = int(getattr(args, "profile_steps", 0) or 0)
    run_dir = dataset_dir(args) / ("profile" if profile else "") / f"{cond}_s{seed}"
    done = run_dir / "result.json"
    if args.resume and done.is_file():  # finished by an earlier, interrupted invocation
        return json.loads(done.read_text())
    run = RunState(cond=cond, seed=seed, args=args, run_dir=run_dir, v3=v3, v4=v4, device=device, v5=v5)
    profiled = train_run(run, profile)
    if profiled is not None:  # timing only (--profile-steps): nothing is scored or tabled
        return profiled
    pick_checkpoints(run)
    score_heldout(run)
    score_mr(run)
    if v5:
        score_curve(run)
    return write_run(run)


def _run_star(job):
    return run_one(*job)
