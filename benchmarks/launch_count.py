"""Kernel launches per metamorphic-training draw: a CPU proxy for its cost on a GPU.

On a GPU the follow-up draws of ``MetamorphicTraining`` are bound by launches (many tiny kernels), not by
arithmetic: the H200 profile of 2026-11-26 (docs/results.md "GPU") measured 80-99 ms per step in the hook
at k=1 and 235-261 ms at k=4 (256 px, batch 16). This counts the top-level aten ops of one ``WorstOfK``
call on CPU tensors (each is one or a few launches on a GPU), for the current code and for the
field-of-view loop as an accelerator ran it before that day (all hc + wc dilations, no early exit).
Measured then: 11 227 ops (k=1) and 35 326 (k=4), i.e. ~7 us per op against the H200 times.

    OMP_NUM_THREADS=1 python benchmarks/launch_count.py [--size 256] [--batch 16] [--calls 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import robusttrain.perturbations.border as border  # noqa: E402
import robusttrain.perturbations.placement as placement  # noqa: E402
from robusttrain.perturbations.suites import SUITES  # noqa: E402
from robusttrain.training.worst_of_k import WorstOfK  # noqa: E402


def ops_per_call(k: int, size: int, batch: int, calls: int) -> float:
    torch.manual_seed(0)
    x = torch.rand(batch, 3, size, size)
    m = torch.zeros(batch, size, size, dtype=torch.long)
    m[:, size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 1
    w = WorstOfK(families=SUITES["endoscopy"], k=k, q=0.5, epsilon=1.0, seed=0, severity_caps=4)
    score = lambda c, mm: c.mean((1, 2, 3))  # noqa: E731 -- a stand-in: the model's forward is not counted
    for step in range(2):  # first use: op construction, caches
        w(x, m, score, step=step)
    counts = []
    for step in range(2, 2 + calls):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            w(x, m, score, step=step)
        top = [e for e in prof.events() if e.name.startswith("aten::")]
        counts.append(
            sum(1 for e in top if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        )
    return sum(counts) / len(counts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args(argv)
    rows = {}
    for k in (1, 4):
        rows[("now", k)] = ops_per_call(k, args.size, args.batch, args.calls)
    current = border.fov_from_cells
    # the accelerator path before 2026-11-26: every dilation on the device, no early exit
    border.fov_from_cells = placement.fov_from_cells = lambda low: current(low, stop_at_fixed_point=False)
    try:
        for k in (1, 4):
            rows[("before", k)] = ops_per_call(k, args.size, args.batch, args.calls)
    finally:
        border.fov_from_cells = placement.fov_from_cells = current
    print(f"# {args.size} px, batch {args.batch}, q=0.5, endoscopy families; mean of {args.calls} calls")
    print("| k | aten ops per call, now | with the old accelerator field-of-view loop | ratio |")
    print("|---|---|---|---|")
    for k in (1, 4):
        print(
            f"| {k} | {rows[('now', k)]:,.0f} | {rows[('before', k)]:,.0f} | {rows[('before', k)] / rows[('now', k)]:.1f}x |"
        )


if __name__ == "__main__":
    main()
