"""What ``torch.compile`` does to a whole metamorphic-training draw as the code stands (no refactor).

``compiled_render.py`` compiles each family's render alone and finds it fuses; the draw around the
renders (sampling, placement, row bookkeeping) is the other half of ``launch_count.py``'s ops. This wraps
one ``WorstOfK`` call (256 px, batch 16, k=1, the endoscopy families, as ``launch_count``) in
``torch.compile`` and prints, per step: an eager call's seconds, the compiled first call's (a new step brings new row counts and
severities: does it recompile?), the compiled pieces a second call of the same step runs, and the most
frequent graph-break reasons over all steps. The backend is ``aot_eager`` (dynamo's tracing and guards
without Inductor's C++ compile, which takes minutes a graph on this CPU): it says how the draw splits
into graphs, not what the graphs' kernels would cost.

    OMP_NUM_THREADS=1 python -m benchmarks.perf.compiled_draw [--steps 4] [--batch 16] [--size 256] [--json PATH]
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import Results, add_json_argument, markdown_row, markdown_table
from benchmarks.perf.launch_count import warmed_draw


def _reason(text: str) -> str:
    """A graph break's reason, short: its first line, what it called if it names it."""
    first = text.strip().splitlines()[0]
    called = re.search(r"call_method \S+\((\w+)\) (\w+)|UserDefinedObjectVariable\((\w+)\)", text)
    return first + (f" ({' '.join(g for g in called.groups() if g)})" if called else "")


def main(argv=None) -> None:
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=256)
    add_json_argument(ap)
    args = ap.parse_args(argv)
    results = Results("benchmarks.perf.compiled_draw", args, argv=argv)
    print(results.header_line())
    dynamo.config.cache_size_limit = 64  # let it recompile rather than fall back to eager after 8
    b, s = args.batch, args.size
    w, x, m, score = warmed_draw(1, s, b)  # launch_count's setting
    eager = {}
    for step in range(2, 2 + args.steps):
        t0 = time.perf_counter()
        w(x, m, score, step=step)
        eager[step] = time.perf_counter() - t0
    fn = torch.compile(w.__call__, backend="aot_eager")
    print(f"# torch.compile(WorstOfK.__call__, backend='aot_eager'), {s} px, batch {b}, k=1")
    cols = ["step", "eager call (s)", "compiled: first call (s)", "compiled pieces a second call runs"]
    fmts = {cols[1]: "{:.2f}", cols[2]: "{:.1f}"}
    print(markdown_table(cols, [], fmts))
    rows = []
    for step in range(2, 2 + args.steps):
        t0 = time.perf_counter()
        fn(x, m, score, step=step)
        first = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(x, m, score, step=step)
        pieces = sum(1 for e in prof.events() if e.name.startswith("Torch-Compiled Region"))
        rows.append([step, eager[step], first, pieces])
        print(markdown_row(cols, rows[-1], fmts), flush=True)
    results.table("steps", cols, rows, fmts)
    reasons: Counter = Counter()
    for text, n in counters["graph_break"].items():
        reasons[_reason(text)] += n
    print("\nmost frequent graph breaks (all steps):")
    for reason, n in reasons.most_common(6):
        print(f"  {n:4d}  {reason}")
    results.table(
        "graph breaks",
        ["count", "reason (the 6 most frequent, all steps)"],
        [[n, reason] for reason, n in reasons.most_common(6)],
    )
    results.write(args.json)


if __name__ == "__main__":
    main()
