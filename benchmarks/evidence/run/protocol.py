"""What a protocol version fixes for a run: the follow-up archive's columns, the kept fp16
checkpoints, each condition's training keywords, model and family sets (v4 / v5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.evidence.run.state import RunState

# the archive of every follow-up's Dice (per case, test and scored checkpoint): a re-analysis needs no re-run
FOLLOWUP_COLUMNS = ("policy", "split", "case_id", "perturbation", "severity", "src_dice", "fol_dice")
KEPT_FP16 = ("least_loss", "last")  # the checkpoints kept as fp16 state dicts (seed 0 committed)
KEPT_FP16_V5 = ("least_loss", "ema")  # v5: the two checkpoints its decisions rest on (seeds 0, 1 committed)


def v4_condition_kwargs(cond: str, v5: bool = False) -> dict:
    """What the v4 (v5) condition trains with (recorded in config.yaml and result.json)."""
    from benchmarks.evidence.conditions import V4_MINED, V4_MT, v4_dose, v5_condition_kwargs

    if v5:
        return v5_condition_kwargs(cond)
    if cond == "mined_dose":
        return {"failure_mining": dict(V4_MINED), "dose": v4_dose(cond)}
    if cond in V4_MT:
        return {"metamorphic_training": dict(V4_MT[cond]), "dose": v4_dose(cond)}
    return {"dose": 0.0}


def run_model(run: RunState, feats) -> dict:
    """The SegmentationModule keywords of a run besides its data's (v5: the condition's model, fixed by the
    protocol; earlier protocols: BasicUNet with ``--features`` / ``--lr`` / ``--lr-tail``)."""
    if run.v5:
        from benchmarks.evidence.conditions import v5_model

        return v5_model(run.cond)
    tail = {"lr_tail": run.args.lr_tail} if getattr(run.args, "lr_tail", 0.0) > 0 else {}  # v3: no lr_tail
    return {"lr": run.args.lr, "features": feats, **tail}


def v4_family_sets(args, cond: str, perts: list[str], test_fams: list[str]) -> dict:
    """The families a v4 run trains on and is tested on: held-out = test families no v4 condition
    ever draws (``--perturbations`` + every condition's extra suites); in-family = the rest."""
    from benchmarks.evidence.conditions import V4_CONDITIONS, V5_CONDITIONS, v4_training_families
    from robusttrain.perturbations.suites import resolve

    v5 = getattr(args, "protocol", "v3") == "v5"
    trained_anywhere: set[str] = set()
    for c in V5_CONDITIONS if v5 else V4_CONDITIONS:
        try:
            trained_anywhere |= set(v4_training_families(c, perts))
        except ValueError:  # a suite not in this library (yet) holds no family of the test suite either
            continue
    requested = resolve(args.test_perturbations.split(","))
    return {
        "training_families": v4_training_families(cond, perts),
        "test_families": list(test_fams),
        "heldout_families": [f for f in test_fams if f not in trained_anywhere],
        "infamily_families": [f for f in test_fams if f in trained_anywhere],
        "test_families_skipped": [f for f in requested if f not in test_fams],  # do not run on RGB
    }
