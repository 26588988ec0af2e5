"""Mining v2 (issue 44): failure conditions steer MetamorphicTraining's random draws on fresh images."""

from __future__ import annotations

import json

import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from toys import quiet_trainer

from robusttrain.callbacks import (
    FailureMiningCallback,
    MetamorphicCallback,
    MetamorphicTraining,
    RobustnessConfigError,
)
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.mining.conditions import ConditionBank, lesion_anchor
from robusttrain.rundir import metamorphic_training as mt_files
from robusttrain.training import WorstOfK
from robusttrain.training.steering import SteeredDraws


def _cond(case, family, severity=3, placement=None):
    return {
        "family": family,
        "severity": severity,
        "weight": 1.0,
        "placement": placement,
        "params": {},
        "case_id": case,
        "drop": 0.5,
        "epoch": 0,
        "first_epoch": 0,
    }


def _batch(n=4, size=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, size, size, generator=g) * 0.5 + 0.25
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):  # lesions at different places in every image
        y0, x0 = 4 + 6 * i % 24, 20 - 4 * i % 16
        m[i, y0 : y0 + 12, x0 : x0 + 10] = 1
    return x, m


def _steered_rows(bank, steer, steps, families=("contrast", "blur"), jitter=0.0):
    wok = WorstOfK(list(families), k=1, q=0.5, epsilon=1.0, seed=0)
    draws = SteeredDraws(steer=steer, jitter=jitter, seed=0)
    x, m = _batch(8)
    out = []
    for step in range(steps):
        fol = draws(wok(x, m, None, step=step), x, m, bank, wok, step=step)
        out.append(fol)
    return out, x, m


@pytest.mark.parametrize("n_conditions", [1, 3, 40])
def test_steered_share_equals_steer_at_any_bank_size(n_conditions):
    bank = ConditionBank()
    bank.conditions = {f"c{i}|contrast|3": _cond(f"c{i}", "contrast") for i in range(n_conditions)}
    steer, steps = 0.3, 60
    fols, _, _ = _steered_rows(bank, steer, steps)
    flags = [s for f in fols for s in f.extra["steered"]]
    n = len(flags)
    assert n == steps * 4  # the perturbed share is the random augmentation's q (4 of 8 rows), steered or not
    share = sum(flags) / n
    assert abs(share - steer) < 3 * np.sqrt(steer * (1 - steer) / n), share
    # every steered row drew the failing family; the others stay the uniform draws of both families
    steered_fams = [f.families[i][0] for f in fols for i, s in enumerate(f.extra["steered"]) if s]
    assert set(steered_fams) == {"contrast"}
    other = [f.families[i][0] for f in fols for i, s in enumerate(f.extra["steered"]) if not s]
    assert {"contrast", "blur"} <= set(other)


def test_one_family_at_one_placement_steers_that_family_near_that_place_relative_to_the_lesion():
    bank = ConditionBank()
    placement = {"abs": [0.1, 0.1], "rel": [0.0, 1.5]}  # 1.5 lesion widths right of the lesion's centre
    bank.conditions = {"c|instrument|3": _cond("c", "instrument", 3, placement)}
    jitter = 0.02
    fols, x, m = _steered_rows(bank, 1.0, 5, families=("contrast", "instrument"), jitter=jitter)
    for f in fols:
        assert all(f.extra["steered"]) and {r[0] for r in f.families} == {"instrument"}
        for i, pos in enumerate(f.index.tolist()):
            a = lesion_anchor(m[pos].numpy())
            target = np.array(a["yx"]) + np.array([0.0, 1.5]) * np.array(a["hw"])
            centre = f.params[i][0]["center_rel"].reshape(2).numpy()
            assert np.abs(centre - np.clip(target, 0, 1)).max() < 4 * jitter, (centre, target)
        assert torch.equal(f.replay(x, m), f.images)  # each steered follow-up re-created from its recipe


def test_an_empty_bank_draws_exactly_the_uniform_random_augmentation():
    x, m = _batch(8)
    wok = WorstOfK(["contrast", "blur"], k=1, q=0.5, epsilon=1.0, seed=3)
    for bank in (None, ConditionBank()):
        for step in range(3):
            plain = WorstOfK(["contrast", "blur"], k=1, q=0.5, epsilon=1.0, seed=3)(x, m, None, step=step)
            fol = SteeredDraws(steer=1.0, seed=3)(wok(x, m, None, step=step), x, m, bank, wok, step=step)
            assert torch.equal(fol.images, plain.images) and fol.families == plain.families
    # a bank of families the run does not train on steers nothing either
    bank = ConditionBank()
    bank.conditions = {"c|text|2": _cond("c", "text", 2)}
    fol = SteeredDraws(steer=1.0)(wok(x, m, None, step=0), x, m, bank, wok, step=0)
    assert "steered" not in fol.extra


def _rec(case, fam, sev=3, drop_to=0.1, epoch=0):
    return FailureRecord(case, "train", fam, sev, {"sigma_rel": [0.1]}, 0, epoch, 0.9, drop_to, 0.8, 0.1)


def test_repaired_conditions_decay_out_and_new_failures_on_passing_cases_are_counted():
    bank = ConditionBank(decay=0.5)
    tested = [("a", "blur", 3), ("b", "blur", 3), ("c", "blur", 3)]
    first = bank.update(0, [(_rec("a", "blur"), None)], tested)
    assert (first["bank_size"], first["new_failures"], first["repaired"]) == (1, 0, 0)
    # "a" passes from now on: its weight halves each check and it leaves below 0.1 (after 4 passes)
    sizes = []
    for e in range(1, 5):
        row = bank.update(e, [(_rec("b", "blur", epoch=e), None)], tested)
        sizes.append(bank.conditions.get("a|blur|3", {}).get("weight"))
        assert row["repaired"] == 1 and row["removed"] == (e == 4)
    assert sizes == [0.5, 0.25, 0.125, None]
    # "b" failed at epoch 1 having passed at epoch 0: one new failure (overfitting); "c" never failed
    assert [c["new_failures"] for c in bank.checks] == [0, 1, 0, 0, 0]
    row = bank.update(5, [(_rec("c", "blur", epoch=5), None), (_rec("a", "blur", epoch=5), None)], tested)
    assert row["new_failures"] == 2 and bank.conditions["a|blur|3"]["weight"] == 1.0
    # decay=0: repaired conditions leave at once
    quick = ConditionBank(decay=0.0)
    quick.update(0, [(_rec("a", "blur"), None)], tested)
    assert quick.update(1, [], tested)["removed"] == 1 and len(quick) == 0


def test_family_balance_keeps_a_rare_failing_family_in_play():
    bank = ConditionBank(balance=0.5)
    bank.conditions = {f"c{i}|blur|3": _cond(f"c{i}", "blur") for i in range(9)}
    bank.conditions["d|contrast|3"] = _cond("d", "contrast")
    p = bank.family_probs()
    assert p["contrast"] == pytest.approx(0.5 * 0.1 + 0.25) and p["blur"] == pytest.approx(0.5 * 0.9 + 0.25)
    rng = np.random.default_rng(0)
    drawn = [bank.draw(rng)["family"] for _ in range(2000)]
    assert abs(drawn.count("contrast") / 2000 - p["contrast"]) < 0.04


def test_mode_defaults_keep_replay_for_replay_ratio_and_steer_otherwise():
    assert FailureMiningCallback().mode == "steer" and FailureMiningCallback().replay_ratio == 0.0
    assert FailureMiningCallback(replay_ratio=0.3).mode == "replay"
    assert FailureMiningCallback(mode="replay").replay_ratio == 0.2


# ------------------------------------------------------------------------------------- real fits
def _fit(run, epochs=3, *, mining=None, mt=None, ckpt=None, crash=None, extra=(), devices=1):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from mining_models import BrightnessModel

    from robusttrain.datamodules.polyp import PolypDataModule

    L.seed_everything(0, workers=True)
    dm = PolypDataModule(image_size=48, n_train=16, n_val=4, batch_size=4, num_workers=0)
    fams = ["contrast", "instrument"]
    cbs = [MetamorphicCallback(suite=MRSuite(fams, severities=(5,)), max_cases=4, dirpath=run, verbose=False)]
    cbs.append(
        MetamorphicTraining(
            **{
                "perturbations": fams,
                "k": 1,
                "q": 0.5,
                "epsilon": 1.0,
                "record_every": 1,
                "record_per_step": 4,
                "dirpath": run,
                **(mt or {}),
            }
        )
    )
    if mining is not None:
        mine = FailureMiningCallback(dirpath=run, train_probe_size=8, **mining)
        dm.wrap_train(mine.wrap)
        cbs.append(mine)
    if crash is not None:
        from test_metamorphic_training import CrashAt

        cbs += [ModelCheckpoint(dirpath=run / "ckpt", save_last=True, save_top_k=-1), CrashAt(crash)]
    elif ckpt is not None:
        cbs.append(ModelCheckpoint(dirpath=run / "ckpt", save_last=True, save_top_k=-1))
    model = BrightnessModel()
    trainer = quiet_trainer(
        max_epochs=epochs,
        callbacks=[*cbs, *extra],
        default_root_dir=run,
        num_sanity_val_steps=0,
        enable_checkpointing=crash is not None or ckpt is not None,
        devices=devices,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=None if ckpt is True else ckpt)
    return model


@pytest.mark.slow
def test_steering_in_a_fit_keeps_the_loaders_stream_and_steers_the_share_asked(tmp_path):
    model = _fit(tmp_path, mining={"mode": "steer", "steer": 1.0})
    rows = pd.read_csv(tmp_path / "failures" / "mining.csv")
    assert rows["conditions"].iloc[0] > 0 and rows["steered"].iloc[0] == 0  # empty bank in epoch 0
    assert (rows["steered_share"].iloc[1:] == 1.0).all() and (rows["perturbed"] == 8).all()  # q = 0.5 of 16
    # the bound: every case exactly as often as the loader shows it (once per epoch), steered or not
    for epoch, seen in model.seen.items():
        assert sorted(c for c, _ in seen) == sorted(f"synpolyp_{i:04d}" for i in range(16)), epoch
    samples = mt_files.read_samples(tmp_path)
    late = [s for s in samples if s["epoch"] >= 1]
    assert late and {s["family"] for s in late} <= {"contrast", "instrument"}
    failing = {
        c["family"]
        for c in json.loads((tmp_path / "failures" / "conditions.json").read_text())["conditions"].values()
    }
    assert {s["family"] for s in late} <= failing
    # the report's training section shows the mining curves
    from robusttrain.reporting.html import write_report

    html = write_report(tmp_path, tmp_path / "report.html").read_text()
    section = html[html.index("<h3>Failure mining</h3>") :]
    assert "steered share" in section and "new failures (passed before)" in section


@pytest.mark.slow
def test_an_empty_bank_fit_trains_on_exactly_the_random_augmentations_images(tmp_path):
    plain = _fit(tmp_path / "plain", epochs=2)
    # min_clean_dice=1: nothing is ever mined, the bank stays empty: the same draws, the same images
    steered = _fit(
        tmp_path / "steer", epochs=2, mining={"mode": "steer", "steer": 1.0, "min_clean_dice": 1.0}
    )
    for e in plain.seen:
        assert all(c1 == c2 and torch.equal(a, b) for (c1, a), (c2, b) in zip(plain.seen[e], steered.seen[e]))
    assert (tmp_path / "plain" / mt_files.SAMPLES).read_bytes() == (
        tmp_path / "steer" / mt_files.SAMPLES
    ).read_bytes()


@pytest.mark.slow
def test_kill_and_resume_equals_an_uninterrupted_steered_run(tmp_path):
    from test_metamorphic_training import Crash

    mining = {"mode": "steer", "steer": 0.5}
    full = _fit(tmp_path / "full", mining=mining, ckpt=True)
    with pytest.raises(Crash):
        _fit(tmp_path / "cut", mining=mining, crash=2)
    resumed = _fit(tmp_path / "cut", mining=mining, ckpt=str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    for name in ("failures/mining.csv", "failures/conditions.json", mt_files.SAMPLES, mt_files.STATS):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes(), name
    e = 2  # the epoch after the kill: the same images, steered the same way
    assert all(c1 == c2 and torch.equal(a, b) for (c1, a), (c2, b) in zip(full.seen[e], resumed.seen[e]))


@pytest.mark.slow
def test_steer_mode_without_a_steerable_metamorphic_training_is_one_line_before_training(tmp_path):
    with pytest.raises(RobustnessConfigError, match=r"has none to steer; use objective='replace', k=1"):
        _fit(tmp_path / "a", epochs=1, mining={"mode": "steer"}, mt={"k": 3})


def test_the_benchmark_conditions_are_random_augmentation_with_and_without_steering():
    from benchmarks.evidence.conditions import V4_RANDOM, training_callbacks
    from robusttrain.datamodules.polyp import PolypDataModule

    for cond, steer in (("random_probed", 0.0), ("steered", 0.5)):
        dm = PolypDataModule(image_size=32, batch_size=4, n_train=20, n_val=4)
        dm.setup("fit")
        cbs, _ = training_callbacks(
            cond, dm, ["blur", "contrast"], (2, 4), seed=0, ratio=0.0, probe=4, train_seed=3
        )
        (mt,) = [c for c in cbs if isinstance(c, MetamorphicTraining)]
        (mine,) = [c for c in cbs if isinstance(c, FailureMiningCallback)]
        assert {k: getattr(mt.settings, k) for k in V4_RANDOM} == V4_RANDOM and mt.settings.seed == 3
        assert (mine.mode, mine.steer, mine.train_probe_size) == ("steer", steer, 4)


def test_volumes_are_steered_slice_wise_and_re_created_exactly():
    bank = ConditionBank()
    bank.conditions = {
        "v|instrument|2": _cond("v", "instrument", 2, {"abs": [0.3, 0.7], "rel": [0.0, 1.0]}),
        "v|contrast|2": _cond("v", "contrast", 2),
    }
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 32, 32, 4, generator=g) * 0.5 + 0.25
    m = torch.zeros(2, 32, 32, 4, dtype=torch.long)
    m[:, 10:18, 10:18, :] = 1
    wok = WorstOfK(["instrument", "contrast"], k=1, q=1.0, seed=0)
    fol = SteeredDraws(steer=1.0, jitter=0.0)(wok(x, m, None, step=0), x, m, bank, wok, step=0)
    assert all(fol.extra["steered"]) and fol.images.shape == x.shape
    assert torch.equal(fol.replay(x, m), fol.images)
