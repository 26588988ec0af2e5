"""Kernel launches per metamorphic-training draw: a CPU proxy for its cost on a GPU.

On a GPU the follow-up draws of ``MetamorphicTraining`` are bound by launches (many tiny kernels), not by
arithmetic: the H200 profile of 2026-11-26 (docs/results/evidence_v3.md "GPU") measured 80-99 ms per step in the hook
at k=1 and 235-261 ms at k=4 (256 px, batch 16), ~7 us per aten op. This counts the top-level aten ops of
one ``WorstOfK`` call on CPU tensors (each is one or a few launches on a GPU) at batch 16 and 64, k = 1
and 4, and says whether issue 31's targets hold: <= 300 ops per k=1 draw at batch 16 and <= 1.2x that at
batch 64 (the count should grow with the families drawn, not with the images).

    OMP_NUM_THREADS=1 python -m benchmarks.perf.launch_count [--size 256] [--batches 16 64] [--calls 4]
    OMP_NUM_THREADS=1 python -m benchmarks.perf.launch_count --old-fov   # also the pre-2026-11-26 FOV loop
    OMP_NUM_THREADS=1 python -m benchmarks.perf.launch_count --border    # images with a round black border
    OMP_NUM_THREADS=1 python -m benchmarks.perf.launch_count --device    # also on an emulated accelerator:
        # what runs on the device, what on the host (placement), copies and syncs
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import robusttrain.perturbations.border as border
import robusttrain.perturbations.placement as placement
from benchmarks.common import Results, add_json_argument
from robusttrain.perturbations.suites import SUITES
from robusttrain.training.worst_of_k import WorstOfK

TARGET_K1 = 300  # aten ops per k=1 draw at 256 px, batch 16 (issue 31)
TARGET_GROWTH = 1.2  # batch 64 may cost at most this times the batch-16 target


# aten ops that launch no kernel on a GPU: views and metadata (a new tensor header over the same memory),
# allocations without a fill, and conversions that find nothing to convert. An op counts as a launch in
# ``launches`` when its name is not here or when anything it calls is not (``reshape`` of a non-contiguous
# tensor calls ``clone``; ``to`` of another dtype calls ``_to_copy``).
_VIEWS: tuple[str, ...]
_VIEWS = ("view", "_unsafe_view", "view_as", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "select")
_VIEWS += ("slice", "transpose", "t", "permute", "expand", "expand_as", "alias", "as_strided", "unbind")
_VIEWS += ("split", "split_with_sizes", "chunk", "narrow", "detach", "detach_", "lift_fresh", "flatten")
_VIEWS += ("unflatten", "movedim", "diagonal", "resolve_conj", "resolve_neg")
_NO_OPS = ("to", "contiguous", "empty", "empty_like", "empty_strided", "new_empty")
# (the profiler names what ``aten::detach_`` calls plain "detach_")
NO_KERNEL = frozenset("aten::" + n for n in _VIEWS + _NO_OPS) | {"detach_", "detach"}


def _launches(event) -> bool:
    """Whether a profiled aten op (with what it called) would launch a kernel on a GPU."""
    return event.name not in NO_KERNEL or any(_launches(c) for c in event.cpu_children)


def top_level_aten(events) -> list:
    """The profiled aten ops not called from another aten op (each is one dispatch from Python)."""
    return [
        e
        for e in events
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]


def count_ops(fn) -> tuple[int, int]:
    """(top-level aten ops, of which launch a kernel) that ``fn()`` runs: an aten op not called from another
    aten op is top-level; of those, views, allocations and no-op conversions (:data:`NO_KERNEL`) launch none.

    >>> import torch
    >>> x = torch.rand(2, 3, 4)
    >>> count_ops(lambda: (x.view(6, 4), x.transpose(1, 2).reshape(2, 12), x + 1))  # reshape copies here
    (4, 2)
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    top = top_level_aten(prof.events())
    return len(top), sum(1 for e in top if _launches(e))


def counted_setting(size: int, batch: int, border: bool = False):
    """(images, masks, score) of the counted setting: a seeded (batch, 3, size, size) batch with a square
    lesion; ``score`` stands in for the model (its forward is not counted). ``border``: the images have a
    round black border, as endoscopy frames do (the field-of-view estimate then runs its dilation loop until
    the border stops growing)."""
    torch.manual_seed(0)
    x = torch.rand(batch, 3, size, size)
    if border:
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        r = ((yy - (size - 1) / 2) ** 2 + (xx - (size - 1) / 2) ** 2).sqrt()
        x = x * (r <= 0.46 * size)
    m = torch.zeros(batch, size, size, dtype=torch.long)
    m[:, size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 1
    score = lambda c, mm: c.mean((1, 2, 3))  # noqa: E731 -- a stand-in: the model's forward is not counted
    return x, m, score


def counted_draw(k: int, families=SUITES["endoscopy"]) -> WorstOfK:
    """The counted ``WorstOfK``: q=0.5, uniform families, severities 1..4."""
    return WorstOfK(families=families, k=k, q=0.5, epsilon=1.0, seed=0, severity_caps=4)


def warmed_draw(k: int, size: int, batch: int, families=SUITES["endoscopy"], border: bool = False):
    """(draw, images, masks, score) of :func:`counted_setting` and :func:`counted_draw` after two warm-up
    calls (op construction, caches)."""
    x, m, score = counted_setting(size, batch, border)
    w = counted_draw(k, families)
    for step in range(2):
        w(x, m, score, step=step)
    return w, x, m, score


def counts_per_call(
    k: int, size: int, batch: int, calls: int, families=SUITES["endoscopy"], border: bool = False
) -> tuple[float, float]:
    """Mean (top-level aten ops, of which launch a kernel) of one call of :func:`warmed_draw`'s draw over
    ``calls`` steps after its warm-up."""
    w, x, m, score = warmed_draw(k, size, batch, families, border)
    counts = [count_ops(lambda s=step: w(x, m, score, step=s)) for step in range(2, 2 + calls)]
    return sum(c[0] for c in counts) / calls, sum(c[1] for c in counts) / calls


def device_counts(
    k: int, size: int, batch: int, calls: int, families=SUITES["endoscopy"], border: bool = False
) -> dict[str, float]:
    """Per call of the counted draw (:func:`warmed_draw`'s) with its images on an emulated accelerator
    (:mod:`robusttrain.testing.emulated_device`: the code's accelerator branches, CPU kernels): mean aten ops
    on the device (``device_ops``, of which ``launches`` launch a kernel), host-to-device copies
    (``to_device``, of which ``blocking``), device-to-host reads the host waits for (``syncs``) and aten
    ops on host tensors (``host_ops``: host time, no launch)."""
    from robusttrain.testing.emulated_device import EmulatedDevice

    x, m, score = counted_setting(size, batch, border)
    w = counted_draw(k, families)
    with EmulatedDevice() as dev:
        xd, md = x.to(dev.device), m.to(dev.device)
        for step in range(2):  # the same two warm-up calls as on the CPU
            w(xd, md, score, step=step)
        dev.reset()
        for step in range(2, 2 + calls):
            w(xd, md, score, step=step)
        got = {"device_ops": len(dev.device_ops), "launches": dev.launches, "to_device": dev.to_device}
        got |= {"blocking": dev.blocking_copies, "syncs": dev.syncs, "host_ops": dev.host_ops}
    return {key: v / calls for key, v in got.items()}


def ops_per_call(k: int, size: int, batch: int, calls: int, families=SUITES["endoscopy"]) -> float:
    """Mean top-level aten ops of one ``WorstOfK`` call (the first of :func:`counts_per_call`)."""
    return counts_per_call(k, size, batch, calls, families)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--old-fov", action="store_true", help="also count with the old accelerator FOV loop")
    ap.add_argument("--border", action="store_true", help="images with a round black border (endoscopy)")
    ap.add_argument("--device", action="store_true", help="also count on an emulated accelerator")
    add_json_argument(ap)
    args = ap.parse_args(argv)
    results = Results("benchmarks.perf.launch_count", args, argv=argv)
    print(results.header_line())
    both = {
        (b, k): counts_per_call(k, args.size, b, args.calls, border=args.border)
        for b in args.batches
        for k in (1, 4)
    }
    rows = {key: v[0] for key, v in both.items()}
    images = "a round black border" if args.border else "uniform noise, no border"
    print(
        f"# {args.size} px, q=0.5, endoscopy families, severities 1..4; {images}; mean of {args.calls} calls"
    )
    cols = ["batch", "k", "aten ops per call", "of which launch a kernel on a GPU"]
    table = [[b, k, v, n] for (b, k), (v, n) in both.items()]
    print(results.table("cpu", cols, table, {cols[2]: "{:,.0f}", cols[3]: "{:,.0f}"}))
    # the targets are on all top-level aten ops (issue 31's count), the launch column is for reading only
    if 16 in args.batches:
        ok16 = rows[(16, 1)] <= TARGET_K1
        print(f"target k=1, batch 16: <= {TARGET_K1}: {'met' if ok16 else 'NOT met'} ({rows[(16, 1)]:,.0f})")
    if 64 in args.batches:
        lim = TARGET_GROWTH * TARGET_K1
        ok64 = rows[(64, 1)] <= lim
        print(f"target k=1, batch 64: <= {lim:.0f}: {'met' if ok64 else 'NOT met'} ({rows[(64, 1)]:,.0f})")
    if args.device:
        print("\n# the same draws on an emulated accelerator (robusttrain.testing.emulated_device), per call")
        print(
            "| batch | k | aten ops on the device | of which launch a kernel | host-to-device copies "
            "(blocking) | device-to-host syncs | aten ops on the host |"
        )
        print("|---|---|---|---|---|---|---|")
        dev = {
            (b, k): device_counts(k, args.size, b, args.calls, border=args.border)
            for b in args.batches
            for k in (1, 4)
        }
        for (b, k), d in dev.items():
            print(
                f"| {b} | {k} | {d['device_ops']:,.0f} | {d['launches']:,.0f} | {d['to_device']:.1f} "
                f"({d['blocking']:.1f}) | {d['syncs']:.1f} | {d['host_ops']:,.0f} |"
            )
        keys = ["device_ops", "launches", "to_device", "blocking", "syncs", "host_ops"]  # one value a column
        fmt = {"device_ops": "{:,.0f}", "launches": "{:,.0f}", "host_ops": "{:,.0f}"}
        fmt |= {c: "{:.1f}" for c in ("to_device", "blocking", "syncs")}
        results.table(
            "emulated_device",
            ["batch", "k", *keys],
            [[b, k, *(d[c] for c in keys)] for (b, k), d in dev.items()],
            fmt,
        )
        for b, lim in ((16, TARGET_K1), (64, TARGET_GROWTH * TARGET_K1)):
            if b in args.batches:
                v = dev[(b, 1)]["device_ops"]
                print(
                    f"device target k=1, batch {b}: <= {lim:.0f}: {'met' if v <= lim else 'NOT met'} ({v:,.0f})"
                )
    if args.old_fov:
        current = border.fov_from_cells

        def exhaustive(low: torch.Tensor) -> torch.Tensor:
            # the accelerator path before 2026-11-26: every dilation on the device, no early exit
            return current(low, stop_at_fixed_point=False)

        border.fov_from_cells = placement.fov_from_cells = exhaustive  # type: ignore[assignment]
        try:
            for b in args.batches:
                for k in (1, 4):
                    v = ops_per_call(k, args.size, b, args.calls)
                    print(f"old accelerator field-of-view loop: batch {b}, k={k}: {v:,.0f}")
        finally:
            border.fov_from_cells = placement.fov_from_cells = current
    results.write(args.json)


if __name__ == "__main__":
    main()
