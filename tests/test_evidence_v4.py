"""Evidence v4 infrastructure (issue 34): the pre-registered condition table, argument checks before any
folder exists (issue 32 item 6), seed-level intervals, the report's endpoints / decision / partial
labels, the archive, and (slow) the tiny grid end to end with a CLI re-score of its fp16 weights."""

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_grid import rescore_on_etis

from benchmarks.evidence import run as evidence
from benchmarks.evidence.conditions import (
    MINING_DEFAULTS,
    V4_CONDITIONS,
    V4_EXTRA_FAMILIES,
    V4_MINED,
    V4_MT,
    V4_TEST_SUITE,
    v4_dose,
)
from benchmarks.evidence.paired_stats import mean_difference, paired_bootstrap, seed_interval

REPO = Path(__file__).resolve().parents[1]

# MetamorphicTraining's keyword arguments in the API contract of issue 30 (the lead's)
CONTRACT_KWARGS = {
    "perturbations", "k", "q", "epsilon", "temperature", "severity_caps", "max_cover", "objective",
    "consistency", "divergence", "detach_source", "ramp", "replace_q", "selection", "quantile", "warmup",
    "score_scale", "chain_depth", "mix", "width", "alpha", "hooks", "seed",
}  # fmt: skip


# ----------------------------------------------------------------------------------- the condition table
def test_the_v4_condition_table_is_the_pre_registered_one():
    assert V4_CONDITIONS == (
        "plain",
        "random",
        "hard_consistency",
        "augmix_consistency",
        "random_shift",
        "mined_dose",
    )
    random = {"objective": "replace", "k": 1, "q": 0.5, "epsilon": 1.0}
    assert {
        "random": random,
        "hard_consistency": {
            "objective": "consistency",
            "replace_q": 0.5,
            "q": 0.5,
            "k": 4,
            "selection": "augmax",
            "epsilon": 1.0,
            "consistency": 1.0,
        },
        "augmix_consistency": {
            "objective": "consistency",
            "replace_q": 0.5,
            "q": 0.5,
            "k": 1,
            "mix": "augmix",
            "chain_depth": 3,
            "width": 3,
            "epsilon": 1.0,
            "consistency": 1.0,
        },
        "random_shift": random,
    } == V4_MT
    assert all(set(kw) <= CONTRACT_KWARGS for kw in V4_MT.values())  # no name outside the contract
    assert V4_EXTRA_FAMILIES == {"random_shift": ("shift",)} and V4_TEST_SUITE == (
        "endoscopy",
        "endoscopy_heldout",
    )
    # mined replay at random augmentation's dose, the recipe's mining settings otherwise
    assert V4_MINED == {"replay_ratio": 0.625, **MINING_DEFAULTS}
    assert {c: v4_dose(c) for c in V4_CONDITIONS} == {
        "plain": 0.0,
        "random": 0.5,
        "hard_consistency": 0.5,
        "augmix_consistency": 0.5,
        "random_shift": 0.5,
        "mined_dose": 0.5,
    }
    # the protocol names the same numbers
    protocol = (REPO / "docs" / "evidence_v4" / "PROTOCOL.md").read_text()
    for c in V4_CONDITIONS:
        assert f"`{c}`" in protocol
    assert "replay_ratio=0.625" in protocol and "0.625 × 0.8 = **0.5**" in protocol


def test_held_out_families_are_those_no_condition_trains_on():
    ns = argparse.Namespace(test_perturbations="blur,contrast,motion_blur")
    sets = evidence.v4_family_sets(ns, "plain", ["blur"], ["blur", "contrast", "motion_blur"])
    assert sets["training_families"] == [] and sets["heldout_families"] == ["contrast", "motion_blur"]
    assert sets["infamily_families"] == ["blur"] and sets["test_families_skipped"] == []
    # a family that does not run on the images (usable_families dropped it) is named, not silently lost
    sets = evidence.v4_family_sets(ns, "random", ["blur"], ["blur", "contrast"])
    assert sets["training_families"] == ["blur"] and sets["test_families_skipped"] == ["motion_blur"]


# ----------------------------------------------------------------------------------- arguments, up front
def _refused(tmp_path, capsys, *argv) -> str:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        evidence.main([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists(), "a refused invocation created its output folder"
    return err


def test_polyp_with_a_missing_data_root_fails_before_anything_is_created(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--dataset", "polyp", "--data-root", "/no/such")
    assert "--data-root /no/such: no kvasir_seg/ there" in err
    err = _refused(tmp_path, capsys, "--dataset", "polyp256", "--data-root", str(tmp_path))
    assert f"--data-root {tmp_path}: no polyp_256/kvasir_seg/ there" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seeds", ""], "--seeds: expected comma-separated integers"),
        (["--seeds", "0,x"], "--seeds: expected comma-separated integers"),
        (["--seeds", "1,1"], "a seed is named twice"),
        (["--conditions", "plain,nosuch"], "--conditions: unknown 'nosuch'"),
        (
            ["--protocol", "v4", "--conditions", "mt_random"],
            "--conditions: unknown 'mt_random' for --protocol v4",
        ),
        (["--protocol", "v3", "--conditions", "hard_consistency"], "unknown 'hard_consistency'"),
        (["--epochs", "abc"], "--epochs: expected an integer >= 1"),
        (["--jobs", "0"], "--jobs: expected an integer >= 1"),
        (["--protocol", "v6"], "argument --protocol: invalid choice"),
        (["--efr-policies", "least_loss,bogus"], "--efr-policies: unknown 'bogus'"),
        (["--perturbations", "blurr"], "--perturbations 'blurr'"),
        (["--ema-half-life", "2"], "--ema-half-life: expected a number in (0, 1)"),
        (
            ["--protocol", "v4", "--conditions", "plain", "--perturbations", "blur"]
            + ["--test-perturbations", "blur,motion_blur", "--q", "0.3"],
            "--q does not apply to --protocol v4",
        ),
        (
            [
                "--protocol",
                "v4",
                "--conditions",
                "plain",
                "--perturbations",
                "blur",
                "--test-perturbations",
                "blur",
            ],
            "no family held out from training",
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv, says):
    err = _refused(tmp_path, capsys, "--dataset", "synthetic", "--epochs", "4", *argv)
    assert says in err


def test_lr_tail_is_checked_against_the_library_before_anything_is_created(tmp_path, capsys):
    import inspect

    from robusttrain.models.segmentation import SegmentationModule

    argv = ["--dataset", "synthetic", "--epochs", "4", "--conditions", "plain", "--seeds", "0"]
    assert "--lr-tail 1.5: expected a fraction in [0, 1)" in _refused(
        tmp_path, capsys, *argv, "--lr-tail", "1.5"
    )
    if "lr_tail" in inspect.signature(SegmentationModule.__init__).parameters:  # issue 30's averages merged
        assert evidence.main([*argv, "--lr-tail", "0.25", "--check-only", "--out", str(tmp_path / "o")]) == {}
    else:
        assert "has no lr_tail" in _refused(tmp_path, capsys, *argv, "--lr-tail", "0.25")


def test_check_only_accepts_a_good_v4_grid_and_creates_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "--protocol",
        "v4",
        "--dataset",
        "synthetic",
        "--conditions",
        "plain,mined_dose",
        "--seeds",
        "0,1",
    ]
    argv += ["--perturbations", "blur", "--test-perturbations", "blur,motion_blur", "--epochs", "2"]
    assert evidence.main([*argv, "--min-epoch", "0", "--check-only", "--out", str(out)]) == {}
    assert "arguments OK" in capsys.readouterr().out and not out.exists()


# ----------------------------------------------------------------------------------- statistics
def test_seed_interval_is_a_t_interval_over_per_seed_differences():
    from scipy import stats

    rng = np.random.default_rng(1)
    b = rng.uniform(0.4, 0.9, size=(5, 30))
    shift = np.array([0.01, 0.03, 0.02, -0.01, 0.04])
    a = b + shift[:, None]
    r = seed_interval(a, b, mean_difference)
    half = stats.t.ppf(0.975, 4) * shift.std(ddof=1) / np.sqrt(5)
    assert r["per_seed"] == pytest.approx(shift) and r["n_seeds"] == 5
    assert (r["lo"], r["hi"]) == pytest.approx((shift.mean() - half, shift.mean() + half))
    one = seed_interval(a[:1], b[:1], mean_difference)
    assert one["estimate"] == pytest.approx(0.01) and np.isnan(one["lo"]) and np.isnan(one["hi"])
    with pytest.raises(ValueError, match="same non-empty shape"):
        seed_interval(a, b[:, :3], mean_difference)


def test_one_stalled_seed_widens_the_seed_interval_but_not_the_case_bootstrap():
    """Evidence v3's lesson: per-seed costs -2.2 / -3.6 / -21.4 points look certain when cases are
    resampled, and are not when seeds are the unit."""
    rng = np.random.default_rng(0)
    b = rng.uniform(0.5, 0.9, size=(3, 150))
    a = b + np.array([-0.022, -0.036, -0.214])[:, None] + 0.01 * rng.standard_normal((3, 150))
    cases = paired_bootstrap(a, b, mean_difference, n_boot=300)
    seeds = seed_interval(a, b, mean_difference)
    assert cases["hi"] < 0  # the case bootstrap calls the cost certain
    assert seeds["lo"] < -0.3 and seeds["hi"] > 0  # the seeds do not
    assert seeds["estimate"] == pytest.approx(cases["estimate"])


# ----------------------------------------------------------------------------------- the report
FAMS = ["blur", "contrast", "motion_blur", "jpeg"]
HELD = ["motion_blur", "jpeg"]


def fake_v4_run(cond, seed, shift=0.0, held_shift=None, kvasir_shift=None):
    """A result.json shaped like evidence.py --protocol v4's (6 Kvasir, 8 ClinicDB frames in 2 sequences,
    2 others); Dice drops by family index, so the worst family is the last."""
    rng = np.random.default_rng(100 + seed)  # the same cases for every condition of a seed
    held_shift = shift if held_shift is None else held_shift
    kvasir_shift = shift if kvasir_shift is None else kvasir_shift
    sets = {"kvasir_test": 6, "cvc_clinicdb": 8, "etis": 2}
    base = {
        s: {f"{s[0]}{i}": float(0.7 + 0.1 * rng.standard_normal()) for i in range(n)} for s, n in sets.items()
    }
    dice = {
        s: {c: v + (kvasir_shift if s == "kvasir_test" else shift) for c, v in cs.items()}
        for s, cs in base.items()
    }
    mr = {
        s: {
            c: {
                "tests": 8,
                "errors_dice@0.25": 2,
                "corrupted_dice": v - 0.1,
                "fol_dice_by_perturbation": {
                    f: v - 0.05 * (i + 1) + (held_shift - shift if f in HELD else 0.0)
                    for i, f in enumerate(FAMS)
                },
            }
            for c, v in dice[s].items()
        }
        for s in ("kvasir_test", "cvc_clinicdb")
    }
    return {
        "condition": cond,
        "seed": seed,
        "protocol": "v4",
        "picks": {p: {"epoch": 1, "dice": dice} for p in ("last", "least_loss")},
        "mr_by_policy": {"least_loss": mr},
        "clusters": {f"cvc_clinicdb/c{i}": f"seq{i // 4}" for i in range(8)},
        "heldout_families": HELD,
        "infamily_families": ["blur", "contrast"],
        "test_families": FAMS,
        "test_families_skipped": [],
    }


def _ns(conds="random,hard_consistency", seeds="0,1,2"):
    return argparse.Namespace(
        conditions=conds, seeds=seeds, n_boot=100, epochs=2, size=32, features="4", batch_size=4, lr=1e-3
    )


def test_report_endpoints_decision_and_partial_label():
    from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

    runs = [fake_v4_run("random", s) for s in (0, 1, 2)]
    runs += [fake_v4_run("hard_consistency", s, shift=0.02 + 0.01 * s) for s in (0, 1, 2)]
    s = summarise_v4(runs, _ns())
    assert (s["planned"], s["finished"]) == (6, 6)
    pr = s["paired"]["least_loss"]["hard_consistency"]
    assert pr["clinicdb_dice"]["seed_t"]["per_seed"] == pytest.approx([2.0, 3.0, 4.0])
    assert pr["heldout_dice"]["seed_t"]["estimate"] == pytest.approx(3.0)
    assert (
        pr["clinicdb_dice"]["seed_t"]["lo"] > 0 and pr["clinicdb_dice"]["case_bootstrap"]["n_clusters"] == 2
    )

    # per case, family i's follow-up Dice is the clean Dice - 0.05 (i + 1): the worst family (jpeg) is
    # 20 points below the clean Dice, the held-out pair (motion_blur, jpeg) 17.5 points
    def clean_mean(r):
        mr = r["mr_by_policy"]["least_loss"]
        return np.mean([r["picks"]["least_loss"]["dice"][st][c] for st in mr for c in mr[st]])

    at = s["endpoints"]["least_loss"]
    expect = [100 * (clean_mean(r) - 0.20) for r in runs[:3]]
    assert at["worst_family_dice"]["random"]["mean"] == pytest.approx(np.mean(expect), abs=0.006)
    expect = [100 * (clean_mean(r) - 0.175) for r in runs[:3]]
    assert at["heldout_dice"]["random"]["mean"] == pytest.approx(np.mean(expect), abs=0.006)
    assert at["heldout_dice"]["random"]["seeds"] == [0, 1, 2]
    assert s["decision"]["hard_consistency"]["meets"] and s["decision"]["hard_consistency"]["final"]
    md = write_tables_v4(s, _ns())
    assert "partial" not in md and "| hard + consistency (AugMax, k=4) | 3 |" in md
    # the same gain on ClinicDB, but the held-out families gain nothing: the rule is not met
    flat = [fake_v4_run("random", s) for s in (0, 1, 2)]
    flat += [fake_v4_run("hard_consistency", s, shift=0.03, held_shift=0.0) for s in (0, 1, 2)]
    d = summarise_v4(flat, _ns())["decision"]["hard_consistency"]
    assert not d["meets"] and d["heldout_dice_points"] == pytest.approx(0.0, abs=1e-6)
    # both primary endpoints gain 3 points, but in-domain Dice costs 2: not met
    costly = [fake_v4_run("random", s) for s in (0, 1, 2)]
    costly += [fake_v4_run("hard_consistency", s, shift=0.03, kvasir_shift=-0.02) for s in (0, 1, 2)]
    assert not summarise_v4(costly, _ns())["decision"]["hard_consistency"]["meets"]
    # one seed finished of the second condition: labelled partial, its interval n/a
    part = runs[:3] + [runs[3]]
    sp = summarise_v4(part, _ns())
    md = write_tables_v4(sp, _ns())
    assert "(partial: 4 of 6 runs)" in md and "[n/a: 1 seed]" in md
    assert not sp["decision"]["hard_consistency"]["final"]
    # runs outside the named grid stay out of it
    assert summarise_v4(runs + [fake_v4_run("random", 7)], _ns())["finished"] == 6


def test_the_worst_family_is_named_and_the_worst_held_out_family_is_its_own_endpoint():
    """Evidence v4's worst-family endpoint takes any test family; in the real grid plain's worst was
    always a family random augmentation trains on, which the number alone hid. The tables name each
    seed's worst family, and the worst held-out family is an endpoint of its own (labelled exploratory)."""
    from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

    runs = [fake_v4_run("random", s) for s in (0, 1, 2)]
    plain = [fake_v4_run("plain", s) for s in (0, 1, 2)]
    for r in plain:  # plain collapses on an in-family family (blur: 30 points below the clean Dice)
        for cs in r["mr_by_policy"]["least_loss"].values():
            for v in cs.values():
                v["fol_dice_by_perturbation"]["blur"] -= 0.25
    s = summarise_v4(runs + plain, _ns("plain,random"))
    assert s["worst_families"] == {"plain": ["blur"] * 3, "random": ["jpeg"] * 3}
    pr = s["paired"]["least_loss"]["plain"]
    assert pr["worst_family_dice"]["seed_t"]["estimate"] == pytest.approx(-10.0, abs=1e-6)
    assert pr["worst_heldout_family_dice"]["seed_t"]["estimate"] == pytest.approx(0.0, abs=1e-6)
    assert s["decision"]["plain"]["heldout_dice_points"] == pytest.approx(0.0, abs=1e-6)
    md = write_tables_v4(s, _ns("plain,random"))
    assert "plain: blur, blur, blur; random (k=1, in place): jpeg*, jpeg*, jpeg*" in md
    assert "worst held-out family follow-up Dice" in md and "exploratory (not in the protocol)" in md


def test_checkpoint_rules_are_compared_within_the_same_runs():
    from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

    runs = [fake_v4_run("random", s) for s in (0, 1, 2)]
    runs += [fake_v4_run("plain", s, shift=-0.05) for s in (0, 1, 2)]
    for i, r in enumerate(runs):  # the balanced average gains 1, 2, 3 points over least_loss by seed
        dice = r["picks"]["least_loss"]["dice"]
        gain = 0.01 * (1 + i % 3)
        r["picks"]["balanced_average"] = {
            "epoch": 1,
            "dice": {st: {c: v + gain for c, v in cs.items()} for st, cs in dice.items()},
        }
    s = summarise_v4(runs, _ns("plain,random"))
    ba = s["rules"]["balanced_average"]
    assert ba["random"]["clinicdb_dice"]["seed_t"]["per_seed"] == pytest.approx([1.0, 2.0, 3.0])
    assert ba["all"]["clinicdb_dice"]["seed_t"]["estimate"] == pytest.approx(2.0)
    assert len(ba["all"]["clinicdb_dice"]["seeds"]) == 6  # pooled: one observation per run
    assert ba["all"]["clinicdb_dice"]["seed_t"]["lo"] > 0
    assert "heldout_dice" not in ba["random"]  # no follow-ups were scored at the balanced average
    # the fake runs' last epoch is their least-loss epoch: no difference, and a rule is never compared
    # with the other condition's runs (plain's 5-point deficit does not leak in)
    assert s["rules"]["last"]["all"]["clinicdb_dice"]["seed_t"]["estimate"] == pytest.approx(0.0)
    assert ba["plain"]["kvasir_dice"]["seed_t"]["estimate"] == pytest.approx(2.0)
    md = write_tables_v4(s, _ns("plain,random"))
    assert "(exploratory)" in md and "| all runs | 6 | +2.0 [" in md


def test_report_on_no_finished_run_says_so():
    from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

    s = summarise_v4([], _ns())
    assert s["finished"] == 0 and "(no finished runs yet)" in write_tables_v4(s, _ns())


# ----------------------------------------------------------------------------------- archive
def test_archive_keeps_followups_configs_and_seed_0_weights(tmp_path):
    from benchmarks.evidence.archive import restore, save

    out, arc, back = tmp_path / "out", tmp_path / "arc", tmp_path / "back"
    fol = gzip.compress(b"policy,split\nleast_loss,kvasir_test\n", mtime=0)
    for c, s in (("plain", 0), ("plain", 1)):
        d = out / f"{c}_s{s}"
        (d / "fp16").mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(fake_v4_run(c, s)))
        (d / "followups.csv.gz").write_bytes(fol)
        (d / "config.yaml").write_text(f"seed: {s}\n")
        for w in ("least_loss.ckpt", "last.ckpt", "config.yaml"):
            (d / "fp16" / w).write_bytes(f"{w}{s}".encode())
    assert save(out, arc, weights_seeds=(0,)) == ["plain_s0", "plain_s1"]
    assert (arc / "plain_s0.followups.csv.gz").read_bytes() == fol  # already gzip: as is
    assert gzip.decompress((arc / "plain_s1.config.yaml.gz").read_bytes()) == b"seed: 1\n"
    assert sorted(p.name for p in (arc / "plain_s0").iterdir()) == [
        "config.yaml",
        "last.ckpt",
        "least_loss.ckpt",
    ]
    assert not (arc / "plain_s1").exists()  # weights of seed 0 only
    assert restore(arc, back) == ["plain_s0", "plain_s1"]
    assert (back / "plain_s1" / "followups.csv.gz").read_bytes() == fol
    (out / "plain_s0" / "fp16" / "last.ckpt").unlink()
    with pytest.raises(SystemExit, match="last.ckpt: missing"):
        save(out, tmp_path / "arc2", weights_seeds=(0,))


# ----------------------------------------------------------------------------------- the grid
GRID = ["sh", str(REPO / "benchmarks" / "evidence" / "grid_v4.sh")]


def _env():
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def test_grid_dry_run_is_breadth_first_and_bad_options_exit_2(tmp_path):
    r = subprocess.run(
        [
            *GRID,
            "--dry-run",
            "--seeds",
            "0,1",
            "--conditions",
            "plain,random,mined_dose",
            str(tmp_path / "g"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:6] == ["plain:0", "random:0", "mined_dose:0", "plain:1", "random:1", "mined_dose:1"]
    assert "--protocol v4 --dataset polyp256 --size 128 --epochs 30 --features 16,16,32,64,128,16" in lines[6]
    assert "--batch-size 8 --lr 3e-3" in lines[6] and "--threads 1" in lines[6]
    assert (
        "--lr-tail 0.25" in lines[6]
        and "--mr-every 0 --efr-cases 150 --efr-policies least_loss,last" in lines[6]
    )
    assert not (tmp_path / "g").exists()
    for argv in (["--jobs", "0", "x"], ["--bogus", "x"], []):
        r = subprocess.run([*GRID, *argv], capture_output=True, text=True, env=_env())
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a bad condition is caught by evidence.py's check before any queue starts or folder is made
    r = subprocess.run(
        [*GRID, "--tiny", "--conditions", "plain,nosuch", str(tmp_path / "g")],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert r.returncode == 2 and "unknown 'nosuch'" in r.stderr and not (tmp_path / "g").exists()


@pytest.mark.grid
def test_tiny_grid_runs_resumes_and_its_fp16_weights_rescore_through_the_cli(tmp_path):
    out = tmp_path / "grid"
    argv = [*GRID, "--tiny", "--jobs", "1", "--conditions", "plain", "--seeds", "0", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=900)
    assert r.returncode == 0, (r.stderr, (out / "queue_1.log").read_text()[-3000:])
    run = out / "synthetic_v4" / "plain_s0"
    res = json.loads((run / "result.json").read_text())
    assert res["protocol"] == "v4" and res["heldout_families"] == ["motion_blur"]
    assert sorted(res["mr_by_policy"]) == ["last", "least_loss"]
    rows = gzip.decompress((run / "followups.csv.gz").read_bytes()).decode().splitlines()
    assert rows[0] == ",".join(evidence.FOLLOWUP_COLUMNS)
    n_cases = sum(len(v) for v in res["mr_by_policy"]["least_loss"].values())
    assert len(rows) - 1 == 2 * n_cases * 2  # 2 checkpoints x cases x (blur, motion_blur at severity 2)
    assert "grid end: status=0" in (out / "grid.log").read_text()
    assert "partial" not in (out / "synthetic_v4" / "results.md").read_text()
    # a second start without --resume is refused; with it, the finished run is skipped
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 2 and "--resume" in r.stderr
    r = subprocess.run(
        [*argv[:2], "--resume", *argv[2:]], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert r.returncode == 0 and "skip plain:0 (finished)" in (out / "grid.log").read_text()
    # the fp16 weights, re-scored by the product's CLI on a folder of the run's own "etis" frames
    ckpt = run / "fp16" / "least_loss.ckpt"
    import torch

    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(v.dtype == torch.float16 for v in state.values() if v.is_floating_point())
    printed, cli = rescore_on_etis(ckpt, tmp_path, "check")
    assert "python -m robusttrain check recipe=polyp model=basic_unet data.image_size=32" in printed
    mine = float(np.mean(list(res["picks"]["least_loss"]["dice"]["etis"].values())))
    assert cli == pytest.approx(mine, abs=5e-3)  # fp16 weights: the rounding moves the third decimal at most
    # the run's held-out families go with it: the re-scored tables pool them apart, as the endpoints do
    assert f"heldout={','.join(res['heldout_families'])}" in printed
    assert "| held-out families | yes |" in (tmp_path / "check" / "efr_table.md").read_text()


def _section(md: str, head: str) -> str:
    return md.split(head, 1)[1].split("\n## ", 1)[0]


def test_the_committed_v4_verdict_is_what_the_archive_gives():
    """docs/evidence_v4/results.md's decision is re-computed from the archived runs (nothing restored,
    nothing retrained): the seed-level intervals depend on the runs only, not on the bootstrap."""
    from benchmarks.evidence.report_v4 import report_archive

    s, md = report_archive(REPO / "docs/evidence_v4/runs", ",".join(V4_CONDITIONS), "0,1,2,3,4", n_boot=20)
    committed = (REPO / "docs/evidence_v4/results.md").read_text()
    head = "## Decision (issue 34 item 7, at `least_loss`)"
    assert _section(md, head) == _section(committed, head)
    assert (s["finished"], s["planned"]) == (30, 30)
    assert not any(d["meets"] for d in s["decision"].values())  # what docs/results.md says
    assert s["worst_families"]["plain"] == ["blood"] * 5  # a family random augmentation trains on


def test_report_of_an_archive_refuses_runs_of_two_grids_in_one_line(tmp_path, capsys):
    import yaml

    from benchmarks.evidence.report_v4 import main

    for cond, epochs in (("random", 30), ("plain", 10)):
        r = fake_v4_run(cond, 0)
        (tmp_path / f"{cond}_s0.json.gz").write_bytes(gzip.compress(json.dumps(r).encode()))
        cfg = {
            "evidence": {"args": {"epochs": epochs, "size": 32, "features": "4", "batch_size": 4, "lr": 1e-3}}
        }
        (tmp_path / f"{cond}_s0.config.yaml.gz").write_bytes(gzip.compress(yaml.safe_dump(cfg).encode()))
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--conditions", "plain,random", "--seeds", "0"])
    err = capsys.readouterr().err.strip()
    assert (
        e.value.code == 2
        and "\n" not in err
        and "epochs=10" in err
        and "epochs=30" in err
        and "plain_s0" in err
    )
    (tmp_path / "plain_s0.json.gz").write_bytes(b"not gzip")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--conditions", "plain,random", "--seeds", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "plain_s0.json.gz" in err and "not a gzip JSON result" in err
    # a result without the per-case numbers the endpoints read
    (tmp_path / "plain_s0.config.yaml.gz").unlink()  # (one grid again)
    (tmp_path / "plain_s0.json.gz").write_bytes(
        gzip.compress(json.dumps({"condition": "plain", "seed": 0}).encode())
    )
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--conditions", "plain,random", "--seeds", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "a run lacks what the report reads" in err


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (
            'data: {image_size: 64}\nmodel: {features: [4]}\nevidence: {condition_kwargs: {heldout_families: ["a; rm -rf ~"]}}\n',
            "heldout_families has 'a; rm -rf ~'",
        ),
        ("data: {image_size: big}\nmodel: {features: [4]}\n", "expected data.image_size"),
        (
            "data: {image_size: 64}\nmodel: {features: [4]}\nevidence: {condition_kwargs: {heldout_families: gamma}}\n",
            "heldout_families is str, expected a list",
        ),
        (": : [\n", "ParserError"),
    ],
)
def test_rescore_refuses_a_config_it_cannot_trust_in_one_line(tmp_path, capsys, config, says):
    """The config.yaml beside a kept checkpoint is data: parsed safely, its family names never reach the
    command line unless they are plain names, and a bad one is one line and exit 2 (nothing is run)."""
    from benchmarks.evidence.rescore import main

    (tmp_path / "config.yaml").write_text(config)
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert main([str(tmp_path / "last.ckpt"), str(tmp_path), str(tmp_path / "out")]) == 2
    out = capsys.readouterr()
    assert says in out.err and out.err.count("\n") == 1 and "robusttrain check" not in out.out
    assert not (tmp_path / "out").exists()
