"""Overhead of :class:`BatchAugmentation` over the functional ``apply_batch`` it wraps, per family.

Side by side in one run (median over ``--repeats`` rounds, variants back to back within a round), images/s of

* ``apply_batch``  — ``get(name, severity=3).apply_batch(x, m)``: sample + apply, the whole batch;
* ``aug p=1``      — ``BatchAugmentation(name, severity=3, p=1)``: the same work plus the Bernoulli /
  severity draws and the bookkeeping (the ratio to ``apply_batch`` is the wrapper's overhead);
* ``aug p=.5 1-5`` — ``BatchAugmentation(name, severity=(1, 5), p=0.5)``: about half the samples, in up to
  five severity groups gathered from and scattered back into the batch.

On the CPU unless ``--device cuda``. Run: ``python -m benchmarks.perf.augment_overhead [--size 256] [--batch 16]``
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch

import robusttrain.perturbations as P
from benchmarks.common import Results, add_json_argument
from robusttrain.perturbations.augment import BatchAugmentation


def batch(b: int, s: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(float(s)), torch.arange(float(s)), indexing="ij")
    x = torch.stack([0.6 + 0.2 * torch.sin(xx / 20), 0.35 + 0.15 * torch.cos(yy / 15), 0.25 + 0 * xx])
    x = (x[None].repeat(b, 1, 1, 1) + 0.03 * torch.randn(b, 3, s, s, generator=g)).clamp(0, 1)
    m = torch.zeros(b, s, s, dtype=torch.long)
    m[:, s // 3 : s // 2, s // 3 : s // 2] = 1
    return x.to(device), m.to(device)


def seconds(fn, sync, min_time: float) -> float:
    """Seconds per call of ``fn``, calling it until ``min_time`` has passed (after one warm-up call)."""
    fn()
    sync()
    calls, t0 = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - t0 < min_time:
        fn()
        calls += 1
        sync()
    return (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--min-time", type=float, default=0.1, help="seconds per variant and round")
    ap.add_argument("--families", nargs="*", default=None)
    add_json_argument(ap)
    a = ap.parse_args(argv)
    results = Results("benchmarks.perf.augment_overhead", a, device=a.device, argv=argv)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    rgb, m = batch(a.batch, a.size, a.device)
    grey, colour = rgb.mean(1, keepdim=True), set(P.available(channels=3))
    names = a.families or [
        f for f in P.available() if "model" not in inspect.signature(P.family_class(f).__init__).parameters
    ]
    print(results.header_line())
    print(
        f"images/s, {a.batch} x C x {a.size} x {a.size} on {a.device}, median of {a.repeats}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"{'family':14s} {'apply_batch':>12s} {'aug p=1':>10s} {'ratio':>6s} {'aug p=.5 1-5':>13s}")
    rows = []
    for name in names:
        x = rgb if name in colour else grey  # MRI / X-ray families take single-channel batches
        pert = P.get(name, severity=3)
        aug1 = BatchAugmentation(name, severity=3, p=1.0)
        aug_mix = BatchAugmentation(name, severity=(1, 5), p=0.5)
        variants = {
            "fn": lambda: pert.apply_batch(x, m),
            "p1": lambda: aug1(x, mask=m),  # noqa: B023
            "mix": lambda: aug_mix(x, mask=m),
        }  # noqa: B023 (used within this iteration only)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(a.repeats):
            for k, fn in variants.items():
                times[k].append(seconds(fn, sync, a.min_time))
        r = {k: a.batch / statistics.median(v) for k, v in times.items()}
        print(f"{name:14s} {r['fn']:12.1f} {r['p1']:10.1f} {r['p1'] / r['fn']:6.2f} {r['mix']:13.1f}")
        rows.append([name, r["fn"], r["p1"], r["p1"] / r["fn"], r["mix"]])
    cols = ["family", "apply_batch (images/s)", "aug p=1 (images/s)", "ratio", "aug p=.5 1-5 (images/s)"]
    results.table("families", cols, rows, {c: "{:.1f}" for c in cols[1:]} | {"ratio": "{:.2f}"})
    results.write(a.json)


if __name__ == "__main__":
    main()
