"""What fusion would do to the launch count: each family's render, eager vs ``torch.compile``, on CPU.

``launch_count.py`` shows the eager draw path near 600 aten ops per k=1 draw (256 px, batch 16) after
three batching passes, most of them tiny element-wise ops in the renderers and samplers. Fusing those is
how a GPU pipeline gets below a few hundred launches; this measures how far the renderers are from that
today: for each endoscopy family (severity 3, one call's params sampled eagerly), its pure render
(``_apply_torch``) run eagerly and compiled (``torch.compile``, Inductor's CPU backend), printing

- eager: top-level aten ops and those that launch a kernel (``launch_count.count_ops``);
- compiled: graphs run per call (1 = no graph break), kernels Inductor generated for them plus the aten
  ops still run as aten (outside a graph or as an extern call inside one) -- an upper bound of the
  launches per call on a GPU, where Triton makes one kernel per fused group as the C++ backend does here;
- the first call's compile seconds (a ratio to the eager call, same run) and the largest difference from
  the eager image (fused float32 arithmetic is not bit-identical).

    OMP_NUM_THREADS=1 python -m benchmarks.perf.compiled_render [--size 256] [--batch 8] [--families ...] [--json PATH]

CPU only says what fuses; whether a compiled renderer pays for its compile time and for its recompiles
(a new row count, a new window size) needs a GPU. The samplers are not compiled here: a
``torch.Generator`` argument breaks a graph, so they would first have to take their uniforms pre-drawn.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import Results, add_json_argument, markdown_row, markdown_table
from benchmarks.perf.launch_count import count_ops, top_level_aten
from robusttrain.perturbations.registry import get
from robusttrain.perturbations.suites import SUITES


def _compiled_counts(fn) -> tuple[int, int]:
    """(graphs run, aten ops run as aten: outside the graphs or as their extern calls) of one ``fn()``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    graphs = sum(1 for e in events if e.name.startswith("Torch-Compiled Region"))
    return graphs, len(top_level_aten(events))


def measure(family: str, size: int, batch: int) -> dict:
    """Eager and compiled counts of ``family``'s render at severity 3 on a (batch, 3, size, size) batch."""
    import torch._inductor.metrics as metrics

    torch.manual_seed(0)
    x = torch.rand(batch, 3, size, size)
    m = torch.zeros(batch, size, size, dtype=torch.long)
    m[:, size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 1
    op = get(family, severity=3)
    params = op.sample_params(x, m, generator=torch.Generator().manual_seed(0))
    eager = lambda: op._apply_torch(x, m, params)  # noqa: E731
    y0 = eager()
    t0 = time.perf_counter()
    eager()
    t_eager = time.perf_counter() - t0
    ops, launches = count_ops(eager)
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(op._apply_torch)
    t0 = time.perf_counter()
    with torch._inductor.config.patch(fx_graph_cache=False):  # a cold compile: nothing from an earlier run
        y1 = compiled(x, m, params)
    t_compile = time.perf_counter() - t0
    kernels = metrics.generated_kernel_count
    graphs, aten = _compiled_counts(lambda: compiled(x, m, params))
    return {
        "family": family,
        "ops": ops,
        "launches": launches,
        "graphs": graphs,
        "kernels": kernels + aten,
        "compile_x": t_compile / max(t_eager, 1e-9),
        "max_diff": float((y1.float() - y0.float()).abs().max()),
    }


COLUMNS = {  # the table's column: measure()'s key
    "family": "family",
    "eager aten ops": "ops",
    "eager launches": "launches",
    "compiled graphs": "graphs",
    "compiled kernels + aten ops": "kernels",
    "first compiled call / eager call": "compile_x",
    "max abs diff": "max_diff",
}
FORMATS = {"first compiled call / eager call": "{:,.0f}x", "max abs diff": "{:.1e}"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--families", nargs="+", default=list(SUITES["endoscopy"]))
    add_json_argument(ap)
    args = ap.parse_args(argv)
    results = Results("benchmarks.perf.compiled_render", args, argv=argv)
    print(results.header_line())
    print(
        f"# {args.size} px, batch {args.batch}, severity 3, Inductor CPU backend, torch {torch.__version__}"
    )
    cols = list(COLUMNS)
    print(markdown_table(cols, [], FORMATS))
    rows = []
    for fam in args.families:  # each row as it is measured (a cold compile takes seconds to minutes)
        r = measure(fam, args.size, args.batch)
        rows.append([r[k] for k in COLUMNS.values()])
        print(markdown_row(cols, rows[-1], FORMATS), flush=True)
    results.table("renders", cols, rows, FORMATS)
    results.write(args.json)


if __name__ == "__main__":
    main()
