"""The runner's argument types and checks: every value a run needs, checked before any folder is
created (one line on stderr, exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.evidence.run.data import REQUIRED


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit 2 (no usage block above them)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v

    return parse


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {v}")
    return v


def _seeds(text: str) -> str:
    """``0,1,2`` -> the same text; every item a distinct integer >= 0, at least one."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 (e.g. 0,1,2), got {text!r}")
    if len(set(map(int, items))) != len(items):
        raise argparse.ArgumentTypeError(f"a seed is named twice in {text!r}")
    return ",".join(str(int(t)) for t in items)


POLICIES = ("least_loss", "last", "best_val_dice", "last_inlier", "maximin", "pareto", "cvar")
AVERAGE_POLICIES = ("balanced_average", "ema")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Every value the runs will need, checked before any folder is created (one line, exit 2)."""
    from benchmarks.evidence.conditions import CONDITIONS, V4_CONDITIONS, V5_CONDITIONS

    known = {"v4": V4_CONDITIONS, "v5": V5_CONDITIONS}.get(args.protocol, CONDITIONS)
    conds = args.conditions.split(",")
    bad = [c for c in conds if c not in known]
    if bad or not args.conditions:
        ap.error(
            f"--conditions: unknown {bad[0] if bad else ''!r} for --protocol {args.protocol}; "
            f"expected a comma list of {', '.join(known)}"
        )
    if len(set(conds)) != len(conds):
        ap.error(f"--conditions names a condition twice: {args.conditions!r}")
    if args.protocol in ("v4", "v5") and args.dataset not in ("polyp256", "synthetic"):
        ap.error(
            f"--protocol {args.protocol} runs on --dataset polyp256 (or synthetic for a dry run), got {args.dataset}"
        )
    if args.protocol == "v5":
        # the model and its schedule come with the condition (conditions.V5_MODELS): an override would be unused
        for flag in ("features", "lr", "lr_tail", "probe", "mine_every"):
            if getattr(args, flag) != ap.get_default(flag):
                ap.error(
                    f"--{flag.replace('_', '-')} does not apply to --protocol v5 (each condition's model, "
                    "schedule and mining are fixed in conditions.V5_MODELS / V5_STEER)"
                )
        from benchmarks.evidence.conditions import V5_MODELS

        args.lr_tail = float(V5_MODELS["pretrained"]["lr_tail"])  # both models' (the averages' window)
    if args.report_only:
        return
    if not 0.0 <= args.lr_tail < 1.0:
        ap.error(f"--lr-tail {args.lr_tail}: expected a fraction in [0, 1) (0 = no constant-LR tail)")
    if args.lr_tail > 0:
        import inspect

        from robusttrain.models.segmentation import SegmentationModule

        if "lr_tail" not in inspect.signature(SegmentationModule.__init__).parameters:
            ap.error(
                f"--lr-tail {args.lr_tail}: this library's SegmentationModule has no lr_tail (issue 30's "
                "averages not merged); --lr-tail 0 trains v3's plain cosine"
            )
    if not args.profile_steps and args.min_epoch >= args.epochs:
        # the balanced policies would have no epoch to choose from (and the run dies after training)
        ap.error(f"--min-epoch {args.min_epoch} must be below --epochs {args.epochs}")
    v3 = args.dataset in ("polyp256", "pranet256", "synthetic") or args.protocol in ("v4", "v5")
    allowed = POLICIES + (AVERAGE_POLICIES if v3 else ())
    bad = [p for p in args.efr_policies.split(",") if p not in allowed]
    if bad:
        ap.error(f"--efr-policies: unknown {bad[0]!r}; expected a comma list of {', '.join(allowed)}")
    try:
        [int(f) for f in args.features.split(",")]
        [int(v) for v in args.severities.split(",")]
    except ValueError:
        ap.error(
            f"--features / --severities: expected comma-separated integers, got "
            f"{args.features!r} / {args.severities!r}"
        )
    root = Path(args.data_root)
    missing = [f for f in REQUIRED[args.dataset] if not (root / f).is_dir()]
    if missing:
        ap.error(
            f"--data-root {root}: no {missing[0]}/ there (--dataset {args.dataset} reads "
            f"{', '.join(f + '/' for f in REQUIRED[args.dataset])} under it)"
        )
    from robusttrain.perturbations.suites import resolve

    for flag, spec in (
        ("--perturbations", args.perturbations),
        ("--test-perturbations", args.test_perturbations),
    ):
        try:
            resolve(spec.split(","))
        except (ValueError, TypeError, KeyError) as e:
            ap.error(f"{flag} {spec!r}: {str(e).strip().splitlines()[0]}")
    if args.protocol in ("v4", "v5"):
        # the v4 / v5 conditions are pre-registered (conditions.V4_* / V5_*): an override would be unused
        for flag in ("q", "jitter", "fresh_image", "clean_mix"):
            if getattr(args, flag) is not None:
                ap.error(
                    f"--{flag.replace('_', '-')} does not apply to --protocol {args.protocol} (its conditions "
                    "are fixed in conditions.py)"
                )
        check_v4_conditions(ap, args, conds)


def check_v4_conditions(ap, args, conds) -> None:
    """Every v4 condition constructs with today's library (the MetamorphicTraining API of issue 30, the
    shift families), and no held-out test family is drawn in training."""
    from benchmarks.evidence.conditions import (
        V4_MT,
        V4_RANDOM,
        V5_STEER,
        V5_TRAINING,
        v4_training_families,
        v5_model,
    )
    from robusttrain.callbacks import MetamorphicTraining
    from robusttrain.models.segmentation import SegmentationModule
    from robusttrain.perturbations.suites import resolve

    perts = args.perturbations.split(",")
    trained = set()
    for c in conds:
        try:
            fams = v4_training_families(c, perts)
            if args.protocol == "v4" and c in V4_MT:
                MetamorphicTraining(perturbations=fams, severity_caps=4, **V4_MT[c])
            if args.protocol == "v5":  # its model builds (the pretrained weights verified) and it trains
                SegmentationModule(in_channels=3, num_classes=2, **v5_model(c))
                if V5_TRAINING[c] != "plain":
                    MetamorphicTraining(perturbations=fams, severity_caps=4, **V4_RANDOM)
                if V5_TRAINING[c] == "steer":  # mining v2's callback takes the protocol's settings
                    from robusttrain.callbacks import FailureMiningCallback

                    FailureMiningCallback(mode="steer", **V5_STEER)
        except (ValueError, TypeError, KeyError) as e:
            ap.error(
                f"condition {c!r} does not construct with this library: {str(e).strip().splitlines()[0]}"
            )
        trained |= set(fams)
    test = resolve(args.test_perturbations.split(","))
    if not [f for f in test if f not in trained and f not in resolve(perts)]:
        ap.error(
            f"--test-perturbations {args.test_perturbations!r}: no family held out from training "
            f"(every one is drawn by a condition)"
        )
