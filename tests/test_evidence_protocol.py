"""benchmarks/evidence/run.py's data protocol on the real sets: disjoint splits, patients kept together,
every PolypGen frame in exactly one centre. Skips when ../shared/data is absent (lists files only)."""

import argparse
import sys
from pathlib import Path

import pytest

from benchmarks.evidence import run as evidence

pytestmark = pytest.mark.skipif(not (evidence.DATA / "kvasir_seg").is_dir(), reason="no ../shared/data")


def args(dataset, **kw):
    base = dict(
        dataset=dataset,
        size=32,
        batch_size=4,
        data_seed=0,
        test_fraction={"polyp": 0.25, "acdc": 0.3}[dataset],
        val_fraction={"polyp": 0.15, "acdc": 0.3}[dataset],
    )
    return argparse.Namespace(**{**base, **kw})


def test_polyp_split_is_disjoint_and_held_out_sets_are_complete():
    dm, held, in_domain = evidence.build_data(args("polyp"))
    tr, va, te = (set(d.case_ids()) for d in (dm.train_dataset, dm.val_dataset, held["kvasir_test"]))
    assert (len(tr), len(va), len(te)) == (60, 15, 25) and not (tr & va or tr & te or va & te)
    assert in_domain == ["kvasir_test"]
    centres = {k: len(v) for k, v in held.items() if k.startswith("polypgen_")}
    assert sorted(centres) == [f"polypgen_C{i}" for i in range(1, 7)] and sum(centres.values()) == 26
    assert (len(held["cvc_clinicdb"]), len(held["cvc_colondb"]), len(held["etis"])) == (6, 19, 4)
    # the split depends on the data seed only
    dm2, held2, _ = evidence.build_data(args("polyp"))
    assert set(held2["kvasir_test"].case_ids()) == te and set(dm2.val_dataset.case_ids()) == va


def test_acdc_split_keeps_both_phases_of_a_patient_together():
    if not (evidence.DATA / "acdc" / "volumes").is_dir():
        pytest.skip("no ACDC volumes")
    dm, held, _ = evidence.build_data(args("acdc"))
    pats = [
        {c.rsplit("_", 1)[0] for c in d.case_ids()}
        for d in (dm.train_dataset, dm.val_dataset, held["acdc_test"])
    ]
    assert [len(p) for p in pats] == [4, 3, 3]
    assert not (pats[0] & pats[1] or pats[0] & pats[2] or pats[1] & pats[2])
    assert len(held["acdc_test"].case_ids()) == 6  # ED and ES of each held-out patient


# ----------------------------------------------------------------------------------- Evidence v3
POLYP256 = evidence.DATA / "polyp_256"
needs_polyp256 = pytest.mark.skipif(not POLYP256.is_dir(), reason="no ../shared/data/polyp_256")


def args256(dataset="polyp256", **kw):
    base = dict(
        dataset=dataset,
        size=32,
        batch_size=4,
        data_seed=0,
        test_fraction=0.15,
        val_fraction=0.1,
        data_root=str(evidence.DATA),
    )
    return argparse.Namespace(**{**base, **kw})


@needs_polyp256
def test_polyp256_split_sizes_disjoint_and_clinicdb_clustered_by_sequence():
    dm, held, in_domain = evidence.build_data(args256())
    tr, va, te = (set(d.case_ids()) for d in (dm.train_dataset, dm.val_dataset, held["kvasir_test"]))
    assert len(tr) >= 700 and len(va) == 100 and len(te) >= 100 and len(tr | va | te) == 998
    assert not (tr & va or tr & te or va & te) and in_domain == ["kvasir_test"]
    clinic = held["cvc_clinicdb"].case_ids()
    assert len(clinic) == 609 and {s for s, _ in dm.clusters} == {"cvc_clinicdb"}
    seqs = {dm.clusters[("cvc_clinicdb", c)] for c in clinic}
    assert len(seqs) == 29  # every frame mapped to its video sequence
    # the original-resolution Kvasir copy is a subset of the 998: only polyp_256 is read, so no image
    # is on two sides whatever the file ids of ../kvasir_seg are
    old = {p.stem for p in (evidence.DATA / "kvasir_seg" / "images").iterdir()}
    assert old <= tr | va | te


@needs_polyp256
def test_pranet256_keeps_every_clinicdb_sequence_on_one_side():
    seqs = evidence.clinicdb_sequences(POLYP256 / "cvc_clinicdb")
    dm, held, _ = evidence.build_data(args256("pranet256", test_fraction=0.2))
    side = {}
    for name, ds in (("train", dm.train_dataset), ("val", dm.val_dataset), ("test", held["cvc_clinicdb"])):
        for c in ds.case_ids():
            if c.startswith("clinicdb-"):
                side.setdefault(seqs[c.split("-", 1)[1]], set()).add(name)
    assert len(side) == 29 and all(len(v) == 1 for v in side.values())
    assert {n for v in side.values() for n in v} == {"train", "val", "test"}
    kv = [set(d.case_ids()) for d in (dm.train_dataset, dm.val_dataset, held["kvasir_test"])]
    assert sum(len({c for c in s if c.startswith("kvasir-")}) for s in kv) == 998


def test_the_v3_conditions_are_the_issue_s_settings_at_the_same_step_budget():
    from benchmarks.evidence.conditions import CONDITIONS, MT_CONDITIONS, training_callbacks
    from robusttrain.callbacks import MetamorphicTraining
    from robusttrain.datamodules.polyp import PolypDataModule

    expected = {
        "mt_random": (1, 1.0, 0.0),
        "metamorphic": (4, 0.3, 1.0),
        "consistency_only": (1, 0.3, 1.0),
        "worst_of_k_only": (4, 0.3, 0.0),
        "metamorphic_uniform": (4, 1.0, 1.0),
        # the seed-2 stall diagnostics
        "consistency_detached": (1, 0.3, 1.0, True),
        "consistency_paired": (1, 0.3, 1e-9),
        "consistency_light": (1, 0.3, 0.1),
        "metamorphic_detached": (4, 0.3, 1.0, True),
        # robust training v2's seed-2 stall reproducer: the method's draws, the consistency objective
        "metamorphic_consistency": (4, 0.3, 1.0),
    }
    assert set(MT_CONDITIONS) == set(expected) and set(expected) < set(CONDITIONS)
    lengths = {}
    for cond in CONDITIONS:
        if cond == "random":
            continue
        dm = PolypDataModule(image_size=32, batch_size=4, n_train=20, n_val=4)
        dm.setup("fit")
        cbs, _ = training_callbacks(
            cond, dm, ["blur", "contrast"], (2, 4), seed=0, ratio=0.2, probe=4, train_seed=3, mt={"q": 0.5}
        )
        mts = [c for c in cbs if isinstance(c, MetamorphicTraining)]
        if cond in expected:
            (mt,) = mts
            k, eps, lam, *detach = expected[cond]
            s = mt.settings
            assert (s.k, s.epsilon, s.consistency, s.q, s.seed) == (k, eps, lam, 0.5, 3)
            assert s.detach_source == bool(detach)
            # v3 meant the paired objective by consistency > 0, and scored at half size (the class's
            # defaults moved in robust training v2; the conditions spell v3 out); k=1 scores nothing, so
            # its conditions leave the scoring size at the default (an unused argument is refused)
            objective = (
                "consistency" if cond == "metamorphic_consistency" else ("paired" if lam else "replace")
            )
            assert (s.objective, s.score_scale) == (objective, 0.5 if k > 1 else 1.0)
        else:
            assert not mts
        lengths[cond] = len(dm.train_dataloader().dataset)
    assert len(set(lengths.values())) == 1, lengths  # the same samples per epoch -> the same optimiser steps


def test_cluster_bootstrap_resamples_whole_sequences():
    import numpy as np

    from benchmarks.evidence.paired_stats import mean_difference, paired_bootstrap

    rng = np.random.default_rng(0)
    # 6 sequences x 20 frames; the effect is shared within a sequence (frames are not independent)
    effect = np.repeat(rng.normal(0.02, 0.1, size=6), 20)
    b = rng.uniform(0.5, 0.9, size=(1, 120))
    a = b + effect + 0.001 * rng.standard_normal((1, 120))
    labels = [f"s{i // 20}" for i in range(120)]
    per_case = paired_bootstrap(a, b, mean_difference, n_boot=400)
    per_seq = paired_bootstrap(a, b, mean_difference, n_boot=400, clusters=labels)
    assert per_seq["n_clusters"] == 6 and per_case["n_clusters"] == 120
    assert per_seq["estimate"] == pytest.approx(per_case["estimate"])
    # treating 120 correlated frames as independent understates the uncertainty several-fold
    assert (per_seq["hi"] - per_seq["lo"]) > 2.5 * (per_case["hi"] - per_case["lo"])
    with pytest.raises(ValueError, match="labels"):
        paired_bootstrap(a, b, mean_difference, clusters=labels[:-1])


@needs_polyp256
@pytest.mark.grid
def test_v3_run_resumes_after_a_kill_keeps_checkpoints_and_rescores_with_the_cli(tmp_path):
    """One small real run (64 px, 2 epochs): killed after its first epoch, resumed from fit/last.ckpt,
    then its kept checkpoint re-scored by ``python -m robusttrain check`` on a folder: the CLI's
    clean Dice equals the run's own per-case number."""
    import json
    import os
    import subprocess
    import time

    import numpy as np

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.evidence.run",
        "--dataset",
        "polyp256",
        "--seeds",
        "0",
        "--conditions",
        "metamorphic",
        "--size",
        "64",
        "--epochs",
        "2",
        "--min-epoch",
        "0",
        "--efr-cases",
        "4",
        "--n-boot",
        "50",
        "--out",
        str(tmp_path),
        "--resume",
    ]
    run = tmp_path / "polyp256" / "metamorphic_s0"
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while not (run / "fit" / "last.ckpt").is_file() and time.time() < deadline and p.poll() is None:
            time.sleep(0.5)
        assert (run / "fit" / "last.ckpt").is_file(), "no fit/last.ckpt after the first epoch"
    finally:
        p.kill()
        p.wait()
    assert not (run / "result.json").exists()
    subprocess.run(
        cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900
    )
    r = json.loads((run / "result.json").read_text())
    assert r["resumed"] is True and r["optimizer_steps"] == 2 * -(-748 // 8)  # slots replace samples
    assert sorted(r["mr_by_policy"]) == ["least_loss"] and r["mt_kwargs"]["k"] == 4
    assert (run / "checkpoints" / "least_loss.ckpt").is_file() and (run / "rescore.sh").is_file()
    for avg in ("balanced_average", "ema"):  # the weight averages: scored held-out, kept, re-scorable
        assert (run / "checkpoints" / f"{avg}.ckpt").is_file()
        assert r["picks"][avg]["epoch"] is None and r["picks"][avg]["average"]
        assert len(r["picks"][avg]["dice"]["kvasir_test"]) == 150
    assert r["picks"]["ema"]["average"]["steps"] == r["optimizer_steps"]
    assert r["picks"]["balanced_average"]["average"]["window_epochs"] == [1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "check",
            "recipe=polyp",
            "data.image_size=64",
            "model.features=[16,16,32,64,128,16]",
            f"data.root={evidence.DATA / 'etis_larib'}",
            "data.val_fraction=0",
            f"ckpt={run / 'checkpoints' / 'least_loss.ckpt'}",
            f"run_dir={tmp_path / 'check'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("[robusttrain] clean"))
    cli = float(line.split("Dice=")[1].split()[0])
    mine = float(np.mean(list(r["picks"]["least_loss"]["dice"]["etis"].values())))
    assert cli == pytest.approx(mine, abs=1e-3)


def _fake_run(cond, seed, errors, dice):
    """A result.json shaped like evidence.py's (3 Kvasir cases, 4 ClinicDB frames in 2 sequences)."""
    sets = {"kvasir_test": ["k1", "k2", "k3"], "cvc_clinicdb": ["1", "2", "3", "4"], "etis": ["e1"]}
    picks = {
        p: {"epoch": 1, "dice": {s: {c: dice for c in cs} for s, cs in sets.items()}}
        for p in ("last", "least_loss")
    }
    mr = {
        s: {c: {"tests": 18, "errors_dice@0.25": errors, "corrupted_dice": dice - 0.1} for c in cs}
        for s, cs in sets.items()
    }
    return {
        "condition": cond,
        "seed": seed,
        "picks": picks,
        "mr_by_policy": {"least_loss": mr, "last": mr},
        "clusters": {
            "cvc_clinicdb/1": "s1",
            "cvc_clinicdb/2": "s1",
            "cvc_clinicdb/3": "s2",
            "cvc_clinicdb/4": "s2",
        },
    }


def test_v3_summary_checks_the_issue_targets_on_the_numbers():
    from benchmarks.evidence.report_v3 import summarise_v3, write_tables_v3

    ns = argparse.Namespace(
        worst_fraction=0.1, n_boot=100, epochs=2, size=64, features="8", batch_size=4, lr=1e-3
    )
    runs = [_fake_run("mt_random", s, 6, 0.80) for s in (0, 1)] + [
        _fake_run("metamorphic", s, 4, 0.80) for s in (0, 1)
    ]
    s = summarise_v3(runs, ns)
    assert s["groups"]["cvc_clinicdb"] == {"sets": ["cvc_clinicdb"], "cases": 4, "clusters": 2}
    pr = s["paired"]["cvc_clinicdb"]["least_loss"]["metamorphic-mt_random"]
    assert pr["efr_dice@0.25_relative_pct"]["estimate"] == pytest.approx(-100 / 3, abs=0.01)
    assert pr["clean_dice_points"]["n_clusters"] == 2 and pr["seeds"] == [0, 1]
    t = s["targets"]["metamorphic_vs_random/least_loss"]
    assert t["met"] and t["kvasir_test"]["met"] and t["cvc_clinicdb"]["met"]
    assert s["targets"]["dice_floor_0.70_kvasir"]["metamorphic"] == {"clean_dice": 80.0, "met": True}
    # a clean-Dice cost above 1 point fails the target although the EFR fell
    worse = [_fake_run("mt_random", 0, 6, 0.80), _fake_run("metamorphic", 0, 4, 0.75)]
    assert not summarise_v3(worse, ns)["targets"]["metamorphic_vs_random/least_loss"]["met"]
    assert "metamorphic-mt_random" in write_tables_v3(s, ns)
    assert not s["targets"]["balanced_average_vs_last"]["met"]  # no run has one: not measured
    # the balanced average: +2 points on every ClinicDB frame -> met on OOD Dice; the EMA equal to last
    for r in runs:
        last = r["picks"]["last"]["dice"]
        up = {
            st: {c: d + (0.02 if st == "cvc_clinicdb" else 0.0) for c, d in cs.items()}
            for st, cs in last.items()
        }
        r["picks"]["balanced_average"] = {"epoch": None, "dice": up, "average": {"averaged_epochs": [0, 1]}}
        r["picks"]["ema"] = {"epoch": None, "dice": last, "average": {"decay": 0.999}}
    summary = summarise_v3(runs, ns)
    t = summary["targets"]
    tables = write_tables_v3(summary, ns)  # an average names what it holds, not an epoch of None
    assert "| balanced_average | avg of 2 (0-1), avg of 2 (0-1) |" in tables
    assert "| ema | EMA 0.999, EMA 0.999 |" in tables and "None" not in tables
    ba = t["balanced_average_vs_last"]
    assert ba["met"] and ba["judged_on"] == "metamorphic"
    assert ba["conditions"]["metamorphic"]["cvc_clinicdb/d_dice"]["points"] == pytest.approx(2.0)
    assert not ba["conditions"]["metamorphic"]["kvasir_test/d_worst_k"]["met"]
    assert not t["ema_vs_last"]["met"]


def test_archived_results_round_trip_and_never_replace_other_numbers(tmp_path):
    import gzip
    import json

    from benchmarks.evidence.archive import restore, save

    out, arc, back = tmp_path / "out", tmp_path / "arc", tmp_path / "back"
    for c, s in (("plain", 0), ("metamorphic", 1)):
        (out / f"{c}_s{s}").mkdir(parents=True)
        (out / f"{c}_s{s}" / "result.json").write_text(json.dumps(_fake_run(c, s, 4, 0.8)))
    (out / "plain_s1").mkdir()  # an unfinished run: nothing to archive
    (out / "plain_s0" / "efr.csv").write_text("epoch,efr\n0,0.5\n")  # a monitoring table travels with it
    arc.mkdir()
    assert save(out, arc) == ["metamorphic_s1", "plain_s0"]
    assert (arc / "plain_s0.efr.csv.gz").is_file() and not (arc / "metamorphic_s1.efr.csv.gz").exists()
    first = (arc / "plain_s0.json.gz").read_bytes()
    save(out, arc)
    assert (arc / "plain_s0.json.gz").read_bytes() == first  # no timestamp: same result, same bytes
    assert restore(arc, back) == ["metamorphic_s1", "plain_s0"]
    assert json.loads((back / "plain_s0" / "result.json").read_text()) == _fake_run("plain", 0, 4, 0.8)
    assert (back / "plain_s0" / "efr.csv").read_text() == "epoch,efr\n0,0.5\n"
    assert restore(arc, back) == []  # already there, same numbers
    (back / "plain_s0" / "result.json").write_text(json.dumps(_fake_run("plain", 0, 5, 0.8)))
    with pytest.raises(SystemExit, match="other numbers"):
        restore(arc, back)
    (arc / "mined_s0.json.gz").write_bytes(gzip.compress(json.dumps(_fake_run("plain", 0, 4, 0.8)).encode()))
    with pytest.raises(SystemExit, match="expected mined_s0"):
        restore(arc, tmp_path / "again")


@needs_polyp256
def test_profile_steps_times_each_run_and_writes_no_result(tmp_path, capsys):
    """``--profile-steps N`` (how the GPU profile in docs/results.md was taken): N real training steps
    per run under Lightning's SimpleProfiler, the hooks' times printed, nothing scored or tabled."""
    out = evidence.main(
        [
            "--dataset",
            "pranet256",
            "--conditions",
            "plain,mt_random",
            "--seeds",
            "0",
            "--size",
            "32",
            "--features",
            "4,4,8,8,16,4",
            "--batch-size",
            "4",
            "--profile-steps",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    assert [(p["condition"], p["profiled_steps"]) for p in out["profiles"]] == [
        ("plain", 3),
        ("mt_random", 3),
    ]
    text = capsys.readouterr().out
    assert text.count("FIT Profiler Report") == 2
    assert "MetamorphicTraining.on_train_batch_start" in text  # the follow-ups' cost is its own row
    assert "run_training_batch" in text
    runs = tmp_path / "pranet256"
    assert not list(runs.rglob("result.json")) and not (runs / "results.md").exists()
    assert sorted(p.name for p in (runs / "profile").iterdir()) == ["mt_random_s0", "plain_s0"]


def test_a_warm_up_as_long_as_the_run_is_refused_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        evidence.main(["--dataset", "polyp256", "--epochs", "3", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--min-epoch 3 must be below --epochs 3" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_report_only_tables_hold_exactly_the_named_conditions_and_seeds(tmp_path, capsys):
    import json

    from benchmarks.evidence.run import main

    out = tmp_path / "polyp256"
    for c, s in (
        ("mt_random", 0),
        ("mt_random", 1),
        ("metamorphic", 0),
        ("metamorphic", 1),
        ("mt_random", 3),
    ):
        (out / f"{c}_s{s}").mkdir(parents=True)
        (out / f"{c}_s{s}" / "result.json").write_text(json.dumps(_fake_run(c, s, 4, 0.8 - 0.01 * s)))
    argv = ["--dataset", "polyp256", "--conditions", "mt_random,metamorphic", "--out", str(tmp_path)]
    payload = main([*argv, "--seeds", "0,1", "--report-only", "--n-boot", "50"])
    assert sorted((r["condition"], r["seed"]) for r in payload["results"]) == [
        ("metamorphic", 0),
        ("metamorphic", 1),
        ("mt_random", 0),
        ("mt_random", 1),
    ]  # the later seed 3 in the same folder stays out of the tables
    assert json.loads((out / "summary.json").read_text())["args"]["seeds"] == "0,1"
    with pytest.raises(SystemExit, match="no finished run of plain x seeds 0"):
        main(
            [
                "--dataset",
                "polyp256",
                "--conditions",
                "plain",
                "--seeds",
                "0",
                "--out",
                str(tmp_path),
                "--report-only",
            ]
        )


def test_restored_runs_get_their_archived_weights_back_so_the_next_save_keeps_them(tmp_path):
    # a fresh machine restores the archive and resumes the grid; saving its new runs with --weights-seeds 0
    # must find the restored seed-0 runs' fp16 weights where a run keeps them (it refused before)
    import json

    from benchmarks.evidence.archive import restore, save

    out, arc, back = tmp_path / "out", tmp_path / "arc", tmp_path / "back"
    (out / "plain_s0" / "fp16").mkdir(parents=True)
    (out / "plain_s0" / "result.json").write_text(json.dumps(_fake_run("plain", 0, 4, 0.8)))
    for w in ("least_loss.ckpt", "last.ckpt", "config.yaml"):
        (out / "plain_s0" / "fp16" / w).write_bytes(w.encode())
    arc.mkdir()
    assert save(out, arc, weights_seeds=(0,)) == ["plain_s0"]
    (back / "plain_s0").mkdir(parents=True)  # restored once before, without its weights
    (back / "plain_s0" / "result.json").write_text(json.dumps(_fake_run("plain", 0, 4, 0.8)))
    assert restore(arc, back) == []
    assert (back / "plain_s0" / "fp16" / "last.ckpt").read_bytes() == b"last.ckpt"
    assert save(back, arc, weights_seeds=(0,)) == ["plain_s0"]
