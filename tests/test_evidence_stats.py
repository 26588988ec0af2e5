"""benchmarks/evidence/paired_stats.py: paired case-bootstrap CIs used by benchmarks/evidence/run.py."""

from pathlib import Path

import numpy as np
import pytest

from benchmarks.evidence.paired_stats import (
    mean_difference,
    paired_bootstrap,
    relative_change,
    worst_fraction_difference,
)


def test_a_real_paired_shift_is_detected_and_no_shift_is_not():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.9, size=(3, 40))  # 3 seeds x 40 cases, large between-case spread
    shifted = base + 0.05 + 0.01 * rng.standard_normal(base.shape)
    r = paired_bootstrap(shifted, base, mean_difference, n_boot=500)
    assert r["lo"] > 0.03 and r["hi"] < 0.07 and r["lo"] <= r["estimate"] <= r["hi"]
    assert (r["n_seeds"], r["n_cases"]) == (3, 40)
    noise = base + 0.01 * rng.standard_normal(base.shape)
    r0 = paired_bootstrap(noise, base, mean_difference, n_boot=500)
    assert r0["lo"] < 0 < r0["hi"]


def test_relative_change_and_worst_fraction():
    a, b = np.array([[1, 2, 1, 0]]), np.array([[2, 2, 2, 2]])
    assert relative_change(a, b) == pytest.approx(-0.5)
    assert np.isnan(relative_change(a, np.zeros_like(b)))
    worse = np.array([[0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]])
    better = worse.copy()
    better[0, 0] = 0.5
    assert worst_fraction_difference(0.1)(better, worse) == pytest.approx(0.4)
    r = paired_bootstrap(np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]]), relative_change, n_boot=50)
    assert r["estimate"] == 0.0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same non-empty shape"):
        paired_bootstrap(np.ones((2, 3)), np.ones((2, 4)), mean_difference)
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap(np.array([[0.5, np.nan]]), np.ones((1, 2)), mean_difference)


def test_the_committed_evidence_archive_restores_and_git_keeps_it(tmp_path):
    """The archive is how the grid survives a new machine: a file git ignores is silently missing from
    a fresh clone (the ``runs/`` rule once hid the whole folder), and a restore must read every run."""
    import subprocess

    from benchmarks.evidence.archive import restore

    repo = Path(__file__).resolve().parents[1]
    arc = repo / "docs" / "evidence_v3" / "runs"
    files = sorted(p.name for p in arc.iterdir())
    assert any(f.endswith(".json.gz") for f in files), f"{arc}: no archived run"
    try:
        r = subprocess.run(
            ["git", "check-ignore", *[str(arc / f) for f in files]], cwd=repo, capture_output=True, text=True
        )
    except OSError:
        pytest.skip("no git")
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.stdout == "", f"git ignores archived evidence: {r.stdout}"
    names = restore(arc, tmp_path)
    assert sorted(f"{n}.json.gz" for n in names) == sorted(f for f in files if f.endswith(".json.gz"))


def test_per_family_efr_and_training_mix_count_what_the_runs_hold(tmp_path):
    from benchmarks.evidence.report_v3 import efr_by_family, family_mix

    def run(seed, sat_errors):
        # two held-out cases, 2 families x 2 severities = 4 tests each
        cases = {
            c: {"tests": 4, "errors_dice@0.25_by_perturbation": {"blur": 0, "saturation": e}}
            for c, e in zip(("a", "b"), sat_errors)
        }
        return {
            "condition": "metamorphic",
            "seed": seed,
            "picks": {"last": {"dice": {"kvasir_test": cases}}},
            "mr_by_policy": {"least_loss": {"kvasir_test": cases}},
        }

    rs = [run(0, (2, 1)), run(1, (0, 1))]  # saturation: 3 of 4 tests, then 1 of 4
    got = efr_by_family(rs, "kvasir_test", "least_loss")
    assert got["saturation"] == {"mean": 50.0, "std": pytest.approx(35.36, abs=0.01)}
    assert got["blur"] == {"mean": 0.0, "std": 0.0}
    assert efr_by_family(rs, "kvasir_test", "last") == {}  # not scored at that checkpoint
    d = tmp_path / "metamorphic_s0"
    d.mkdir()
    rows = ["epoch,family,chosen", "0,blur,100", "5,blur,30", "5,saturation,10", "6,saturation,60"]
    (d / "metamorphic_training.csv").write_text("\n".join(rows) + "\n")  # a complete file ends its last row
    mix = family_mix(tmp_path, rs)  # seed 1 has no file: left out, not counted as zero
    assert mix["metamorphic"]["saturation"]["mean"] == 70.0 and mix["metamorphic"]["blur"]["mean"] == 30.0


def test_confidence_stats_tell_an_unsure_model_from_a_sure_one():
    import torch

    from benchmarks.evidence.confidence import confidence_stats

    masks = torch.zeros(2, 8, 8, dtype=torch.long)
    masks[:, 2:6, 2:6] = 1
    sure = masks.float() * 0.95 + 0.02
    unsure = masks.float() * 0.3 + 0.35  # 0.65 on the lesion, 0.35 off it: same argmax
    a, b = confidence_stats(sure, masks), confidence_stats(unsure, masks)
    assert a["dice"] == b["dice"] == 1.0 and a["area_ratio"] == b["area_ratio"] == 1.0
    assert a["unsure"] == 0.0 and b["unsure"] == 1.0
    assert b["p_lesion"] == pytest.approx(0.65) and b["p_background"] == pytest.approx(0.35)
    import doctest

    from benchmarks.evidence import confidence as evidence_confidence

    assert doctest.testmod(evidence_confidence).failed == 0
