"""Cost of a metamorphic check vs the model forwards it cannot avoid (CPU, one run).

The from-scratch model of ``recipe=polyp model=basic_unet`` (MONAI BasicUNet, features 16,16,32,64,128,16,
128x128, batch 16), the default suite (nine families x severities 2, 4). "forwards" = the same model on the very
same source and follow-up batches, timed alone; "overhead" = (check - forwards) / forwards,
i.e. perturbation + scoring + bookkeeping + failure records. Target: <= 20 %. The forward
time is also measured inside the check itself, which is robust to a busy machine (the
replayed figure compares two runs that may see different CPU contention).

    python -m benchmarks.perf.mr_overhead [--cases 16] [--size 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import Results, add_json_argument
from robusttrain.metamorphic.batch import BatchHooks, iter_probe
from robusttrain.metamorphic.efr import efr_table
from robusttrain.metamorphic.failures import build_failures
from robusttrain.metamorphic.runner import aggregate, run_probe
from robusttrain.metamorphic.scoring import logits_to_probabilities
from robusttrain.metamorphic.suite import MRSuite


def synthetic(n: int, size: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    out = []
    for i in range(n):
        img = 0.35 + 0.1 * torch.rand(3, size, size, generator=g)
        img[0] += 0.2
        cy, cx, r = (
            torch.rand(3, generator=g) * torch.tensor([0.5, 0.5, 0.15]) + torch.tensor([0.25, 0.25, 0.1])
        ) * size
        m = (((yy - cy) / r) ** 2 + ((xx - cx) / (1.3 * r)) ** 2 <= 1).long()
        img = torch.where(m.bool(), torch.tensor([0.75, 0.45, 0.4]).view(3, 1, 1), img).clamp(0, 1)
        out.append({"image": img, "mask": m, "case_id": f"case{i:03d}", "slice_index": 0})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="checks after the first (params cached)")
    add_json_argument(ap)
    args = ap.parse_args(argv)
    results = Results("benchmarks.perf.mr_overhead", args, argv=argv)
    from monai.networks.nets import BasicUNet

    torch.manual_seed(0)
    model = BasicUNet(
        spatial_dims=2, in_channels=3, out_channels=2, features=(16, 16, 32, 64, 128, 16)
    ).eval()
    data = synthetic(args.cases, args.size)
    suite = MRSuite(seed=0)
    hooks = BatchHooks()
    inputs: list[torch.Tensor] = []
    in_check = [0.0]

    def predict(x: torch.Tensor) -> torch.Tensor:
        inputs.append(x)  # the exact batches the check forwards, replayed below
        t0 = time.perf_counter()
        out = logits_to_probabilities(model(x))
        in_check[0] += time.perf_counter() - t0  # same contention as the rest of the check
        return out

    def check() -> float:
        t0 = time.perf_counter()
        # a list of samples is a map-style dataset (__len__ / __getitem__)
        batches = iter_probe(data, range(len(data)), args.batch_size, hooks)  # type: ignore[arg-type]
        res = run_probe(predict, batches, suite, "val", path="numpy")
        _, cases = aggregate(res, ["polyp"], 0, suite)
        efr_table(cases)
        build_failures(res, cases, suite, data, hooks, predict, "numpy", 0.25, 16, 0)
        return time.perf_counter() - t0

    def forwards() -> float:
        t0 = time.perf_counter()
        for x in inputs:
            logits_to_probabilities(model(x))
        return time.perf_counter() - t0

    print(results.header_line())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.cases} cases at "
        f"{args.size}px, {len(suite.names)} families x severities {suite.severities}"
    )
    rows = []
    with torch.no_grad():
        for rep in range(1 + args.repeats):
            inputs.clear()
            in_check[0] = 0.0
            t_check = check()
            t_fwd = forwards()
            rest = t_check - in_check[0]
            label = "first check (samples params)" if rep == 0 else f"check {rep} (cached params)"
            print(
                f"{label:30s}: check {t_check:6.2f} s | forwards replayed alone {t_fwd:6.2f} s "
                f"({len(inputs)} batches): overhead {100 * (t_check - t_fwd) / t_fwd:5.1f} % | "
                f"forwards inside the check {in_check[0]:6.2f} s, rest {rest:5.2f} s: "
                f"overhead {100 * rest / in_check[0]:5.1f} %"
            )
            overheads = (100 * (t_check - t_fwd) / t_fwd, in_check[0], rest, 100 * rest / in_check[0])
            rows.append([label, t_check, t_fwd, len(inputs), *overheads])
    cols = [
        "check",
        "check (s)",
        "forwards alone (s)",
        "batches",
        "overhead vs alone (%)",
        "forwards inside (s)",
        "rest (s)",
        "overhead vs inside (%)",
    ]
    results.table(
        "checks",
        cols,
        rows,
        {c: "{:.2f}" for c in cols[1:3] + cols[5:7]} | {cols[4]: "{:.1f}", cols[7]: "{:.1f}"},
    )
    results.write(args.json)


if __name__ == "__main__":
    main()
