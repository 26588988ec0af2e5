"""Evidence v2 (issue 12): failure mining and the checkpoint policies under a held-out protocol.

The runner's arguments and ``main``: one run per (condition, seed), or the tables of finished runs
(``--report-only``), or the checks alone (``--check-only``); see the package's docstring."""

from __future__ import annotations

import time

from benchmarks.evidence.run.checks import OneLineParser, _fraction, _int_at_least, _seeds, check_args
from benchmarks.evidence.run.data import DATA, SPLIT_FRACTIONS
from benchmarks.evidence.run.pipeline import _run_star
from benchmarks.evidence.run.summary import dataset_dir, finished, write_summary


def main(argv=None, prog: str | None = None) -> dict:
    ap = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dataset",
        choices=["polyp", "acdc", "polyp256", "pranet256", "synthetic"],
        required=True,
        help="polyp256 = Evidence v3 (issue 22): train on Kvasir-SEG (polyp_256), CVC-ClinicDB held out; "
        "pranet256 = the GPU protocol: train on Kvasir-SEG + CVC-ClinicDB (split by sequence); "
        "synthetic = procedural frames shaped like polyp256 (tiny dry runs, no data folder)",
    )
    ap.add_argument(
        "--protocol",
        choices=["v3", "v4", "v5"],
        default="v3",
        help="v4 = Evidence v4 (issue 34, docs/evidence_v4/PROTOCOL.md): its conditions (conditions.V4_*), "
        "the held-out test families, per-follow-up archive, fp16 weights; v5 = Evidence v5 (issue 45, "
        "docs/evidence_v5/PROTOCOL.md): conditions.V5_* (each picks its model), the check's curve",
    )
    ap.add_argument(
        "--curve-every",
        type=_int_at_least(1),
        default=5,
        help="v5: score every N-th epoch (and the last) on the held-out splits and the MR suite on "
        "--curve-cases validation cases (the check's validity across epochs)",
    )
    ap.add_argument(
        "--curve-cases",
        type=_int_at_least(1),
        default=32,
        help="v5: validation cases of the curve's MR suite",
    )
    ap.add_argument(
        "--test-perturbations",
        default=None,
        help="v4: the MR test suite (suites or families; default endoscopy,endoscopy_heldout); families no "
        "condition trains on are the held-out ones",
    )
    ap.add_argument(
        "--ema-half-life",
        type=_fraction,
        default=0.05,
        help="v4: the EMA's half-life as a fraction of the run's optimiser steps (sets the decay; 0.05 = "
        "the product's EMACheckpoint default)",
    )
    ap.add_argument(
        "--lr-tail",
        type=float,
        default=0.0,
        help="constant-LR tail over the last fraction of the epochs (SegmentationModule(lr_tail=), issue 30; "
        "0 = v3's cosine); v4: the balanced average's window is then the tail",
    )
    ap.add_argument(
        "--data-root",
        default=str(DATA),
        help="folder holding polyp_256/, cvc_colondb/, ... "
        "(the GPU machine: .gpudata from benchmarks/gpu/pack.py)",
    )
    ap.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--precision", default="32-true", help="Lightning precision (GPU: bf16-mixed)")
    ap.add_argument("--seeds", type=_seeds, default="0,1,2", help="training seeds")
    ap.add_argument("--conditions", default="plain,random,mined")
    ap.add_argument("--epochs", type=_int_at_least(1), default=30)
    ap.add_argument(
        "--size", type=_int_at_least(16), default=128, help="training / evaluation image size (px)"
    )
    ap.add_argument("--features", default="16,16,32,64,128,16", help="MONAI BasicUNet widths")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=_int_at_least(1), default=8)
    ap.add_argument("--test-fraction", type=float, default=None, help="held-out share (polyp 0.25, acdc 0.3)")
    ap.add_argument(
        "--val-fraction", type=float, default=None, help="validation share (polyp 0.15, acdc 0.3)"
    )
    ap.add_argument(
        "--perturbations",
        default="",
        help="suite name or comma list of families; '' = endoscopy (polyp) / mri (acdc)",
    )
    ap.add_argument("--severities", default="2,4")
    ap.add_argument("--ratio", type=float, default=0.2, help="extra slots per epoch (all conditions)")
    ap.add_argument("--probe", type=int, default=32, help="training cases probed for failures (mined)")
    ap.add_argument("--mine-every", type=int, default=1, help="probe every N epochs (mined)")
    for flag in ("jitter", "fresh-image", "clean-mix"):
        ap.add_argument(
            f"--{flag}",
            type=float,
            default=None,
            help=f"FailureMiningCallback {flag.replace('-', '_')} (mined; default: conditions.MINING_DEFAULTS)",
        )
    ap.add_argument(
        "--q", type=float, default=None, help="MetamorphicTraining dose (MT conditions; default 0.5)"
    )
    ap.add_argument(
        "--mr-every",
        type=int,
        default=0,
        help="MetamorphicCallback validation check every N epochs (0 = never; it steers the MT families)",
    )
    ap.add_argument("--mr-val-cases", type=int, default=None, help="validation cases the check probes")
    ap.add_argument("--efr-policies", default="least_loss", help="checkpoints scored with the MR suite")
    ap.add_argument(
        "--efr-cases",
        type=int,
        default=None,
        help="MR suite on a fixed seeded subset of at most N cases per held-out set (clean Dice on all)",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="summarise the finished runs of --conditions x --seeds under <out>/<dataset> (no training; "
        "runs of other conditions or seeds in the same folder stay out of the tables)",
    )
    ap.add_argument(
        "--check-only",
        action="store_true",
        help="check every argument (data folders, families, that the conditions construct) and exit",
    )
    ap.add_argument("--min-epoch", type=int, default=3, help="warm-up epochs the balanced policies skip")
    ap.add_argument(
        "--average-window", type=float, default=0.5, help="balanced average: last fraction of epochs"
    )
    ap.add_argument("--ema-decay", type=float, default=0.999, help="EMA decay per optimizer step")
    ap.add_argument("--contamination", type=float, default=0.1)
    ap.add_argument("--worst-fraction", type=float, default=0.1, help="k of the worst-k / cvar numbers")
    ap.add_argument("--data-seed", type=int, default=0, help="split + MR-suite seed (fixed)")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument(
        "--heldout-curve",
        action="store_true",
        help="evaluate every epoch on the held-out sets (trade-off curve), not only the picks",
    )
    ap.add_argument("--jobs", type=_int_at_least(1), default=1, help="runs in parallel (processes)")
    ap.add_argument("--threads", type=_int_at_least(1), default=1, help="torch threads per run")
    ap.add_argument("--out", default="runs/evidence")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="reuse <out>/<dataset>/<cond>_s<seed>/result.json of runs that already finished",
    )
    ap.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="time N training steps of each run with Lightning's SimpleProfiler (where a step's time goes: "
        "data, hooks, forward, backward); runs one at a time under <out>/<dataset>/profile/, nothing scored",
    )
    args = ap.parse_args(argv)
    defaults = SPLIT_FRACTIONS[args.dataset]
    args.test_fraction = defaults[0] if args.test_fraction is None else args.test_fraction
    args.val_fraction = defaults[1] if args.val_fraction is None else args.val_fraction
    args.perturbations = args.perturbations or ("mri" if args.dataset == "acdc" else "endoscopy")
    if args.test_perturbations is None:
        from benchmarks.evidence.conditions import V4_TEST_SUITE

        args.test_perturbations = (
            ",".join(V4_TEST_SUITE) if args.protocol in ("v4", "v5") else args.perturbations
        )
    check_args(ap, args)
    if args.check_only:
        print(f"evidence: arguments OK ({args.conditions} x seeds {args.seeds}, --dataset {args.dataset})")
        return {}

    jobs = [(c, int(s), vars(args)) for s in args.seeds.split(",") for c in args.conditions.split(",")]
    t0 = time.time()
    out = dataset_dir(args)
    if args.profile_steps:  # one after the other, never in parallel: each profile sees the device alone
        args.resume = False
        return {"profiles": [_run_star((c, s, vars(args))) for c, s, _ in jobs]}
    if args.report_only:  # exactly the named grid: later seeds in the same folder do not move its tables
        named = {(c, s) for c, s, _ in jobs}
        results = [r for r in finished(out) if (r["condition"], int(r["seed"])) in named]
        if not results:
            raise SystemExit(
                f"evidence: no finished run of {args.conditions} x seeds {args.seeds} under {out}"
            )
        return write_summary(results, args, out, time.time() - t0)
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(_run_star, jobs, chunksize=1)
    else:
        results = []
        for j in jobs:  # the tables are re-written after every run: partial results are readable
            results.append(_run_star(j))
            if args.dataset in ("polyp256", "pranet256") or args.protocol in ("v4", "v5"):
                write_summary(finished(out), args, out, time.time() - t0)
    if args.dataset in ("polyp256", "pranet256") or args.protocol in ("v4", "v5"):  # every finished run, also
        results = finished(out)  # other invocations' (grid processes share one --out: keep theirs)
    return write_summary(results, args, out, time.time() - t0)
