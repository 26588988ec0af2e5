"""Replay: exact re-creation of a probe follow-up, slot layout, file-shared refresh, baselines."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robusttrain.metamorphic.records import FailureRecord
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.mining.bank import FailureBank
from robusttrain.mining.replay import RandomPerturbationDataset, ReplayDataset, to_uint8_hwc
from robusttrain.rundir import sampling as sampling_file

PERTS = ["saturation", "contrast", "white_balance"]


@pytest.fixture(scope="module")
def train_ds():
    from robusttrain.datamodules.polyp import PolypDataModule

    dm = PolypDataModule(image_size=64, n_train=12, n_val=4, batch_size=4)
    dm.setup("fit")
    return dm.train_dataset


def clean(ds, i):
    """What the metamorphic probe sees for a training sample: the un-augmented view."""
    from robusttrain.mining.replay import CleanView

    img, msk, _ = CleanView(ds).load(i)
    return torch.from_numpy(img).permute(2, 0, 1).float()[None] / 255, torch.from_numpy(msk)[None]


def probe_record(ds, i, k, suite, epoch=0, split="train"):
    img, msk = clean(ds, i)
    case = ds[i]["case_id"]
    params = suite.params_for(split, k, [case], [0], img, msk)
    follow = suite.apply(k, img, msk, params, path="numpy")
    name, sev = suite.tests[k]
    per_sample = {n: v[0].numpy() for n, v in params[0].items()}
    rec = FailureRecord(
        case_id=case,
        split=split,
        perturbation=name,
        severity=sev,
        params=per_sample,
        seed=suite.seed,
        epoch=epoch,
        src_dice=0.9,
        fol_dice=0.2,
        src_iou=0.8,
        fol_iou=0.1,
        index=i,
    )
    return rec, to_uint8_hwc(follow[0])


def test_replay_reproduces_exact_followup(train_ds, tmp_path):
    suite = MRSuite(PERTS, severities=(2, 4), seed=3)
    suite.prepare(in_channels=3)
    ds = ReplayDataset(train_ds, tmp_path)
    for k in range(len(suite.tests)):
        rec, expected = probe_record(train_ds, k % len(train_ds), k, suite)
        rec = FailureRecord.from_dict(json.loads(json.dumps(rec.to_dict())))  # through the log
        out, msk, meta = ds.recreate(rec, jitter=0.0)
        assert np.array_equal(out, expected), suite.tests[k]
        assert meta["case_id"] == rec.case_id
        jit, _, _ = ds.recreate(rec, rng=np.random.default_rng(0), jitter=0.3)
        assert jit.shape == expected.shape
        assert np.abs(jit.astype(int) - expected.astype(int)).mean() < 40  # near the failure


def slot(ds, seed=0):
    """One slot sample (what a replaced index returns), drawn with a fixed generator."""
    return ds._slot(np.random.default_rng(seed))


def test_slots_layout_and_refresh(train_ds, tmp_path):
    ds = ReplayDataset(train_ds, tmp_path, replay_ratio=0.2)
    n = len(train_ds)
    assert len(ds) == n and ds.n_slots == round(n * 0.2)  # same length; ~20 % replaced per epoch
    assert ds[0]["case_id"] == train_ds[0]["case_id"]
    assert ds.n_trainable == 0
    suite = MRSuite(["contrast"], severities=(4,), seed=0)
    suite.prepare(in_channels=3)
    bank = FailureBank(tmp_path)
    rec, _ = probe_record(train_ds, 2, 0, suite)
    bank.add(rec)
    bank.add(probe_record(train_ds, 3, 0, suite, split="val")[0])  # never replayed
    bank.flush(0)
    assert ds.n_trainable == 1  # picked up from the files, no restart
    s = slot(ds)
    assert s["case_id"] == rec.case_id and s["image"].shape == (3, 64, 64)
    assert s["mask"].dtype == torch.int64


def test_val_records_need_opt_in(train_ds, tmp_path):
    suite = MRSuite(["contrast"], severities=(4,), seed=0)
    suite.prepare(in_channels=3)
    bank = FailureBank(tmp_path, allow_val_mining=True)
    bank.add(probe_record(train_ds, 1, 0, suite, split="val")[0])
    bank.flush(0)
    assert ReplayDataset(train_ds, tmp_path).n_trainable == 0
    leaky = ReplayDataset(train_ds, tmp_path, allow_val_mining=True, sources={"val": train_ds})
    assert leaky.n_trainable == 1


def test_weights_file_steers_sampling(train_ds, tmp_path):
    suite = MRSuite(["contrast", "saturation"], severities=(4,), seed=0)
    suite.prepare(in_channels=3)
    bank = FailureBank(tmp_path)
    for k in range(2):
        bank.add(probe_record(train_ds, k, k, suite)[0])
    bank.flush(0)
    sampling_file.path(tmp_path).write_text(json.dumps({"weights": {"contrast": 0.9, "saturation": 0.1}}))
    ds = ReplayDataset(train_ds, tmp_path)
    assert ds.weights() == pytest.approx({"contrast": 0.9, "saturation": 0.1})
    cases = [slot(ds, i)["case_id"] for i in range(40)]
    assert cases.count(train_ds[0]["case_id"]) > 25


def test_random_perturbation_baseline(train_ds):
    ds = RandomPerturbationDataset(train_ds, PERTS, ratio=0.2)
    assert len(ds) == len(train_ds) and ds.n_slots == round(len(train_ds) * 0.2)
    index = {train_ds[i]["case_id"]: i for i in range(len(train_ds))}
    plain = RandomPerturbationDataset(train_ds, [], ratio=0.2)

    def views(case_id):  # the case's clean image under the dataset's augmentations (flips, rot90)
        img = clean(train_ds, index[case_id])[0][0]
        return [torch.rot90(v, r, (1, 2)) for v in (img, img.flip(2)) for r in range(4)]

    changed = 0
    for seed in range(6):
        s, p = slot(ds, seed), slot(plain, seed)
        assert s["image"].shape == (3, 64, 64) and float(s["image"].min()) >= 0
        # the empty baseline's slot is a case as the dataset gives it; the baseline's, its case perturbed
        assert any(torch.allclose(p["image"], v, atol=1e-6) for v in views(p["case_id"]))
        changed += not any(torch.allclose(s["image"], v, atol=2 / 255) for v in views(s["case_id"]))
    assert changed >= 5  # colour families at severity 2 or 4 change (almost) every slot


def test_clean_mix_and_fresh_image(train_ds, tmp_path):
    suite = MRSuite(["contrast"], severities=(4,), seed=0)
    suite.prepare(in_channels=3)
    bank = FailureBank(tmp_path)
    rec, _ = probe_record(train_ds, 2, 0, suite)
    bank.add(rec)
    bank.flush(0)
    # clean_mix=1: every slot is the failing case's clean image (augmentations only: flips/rot90)
    ds = ReplayDataset(train_ds, tmp_path, clean_mix=1.0)
    img, _ = clean(train_ds, 2)
    s = slot(ds)
    assert s["case_id"] == rec.case_id
    assert torch.allclose(s["image"].sum(), img[0].sum(), atol=1e-3)  # same pixels, maybe flipped
    # fresh_image=1: the failing perturbation on random training images
    ds = ReplayDataset(train_ds, tmp_path, fresh_image=1.0)
    cases = {slot(ds, i)["case_id"] for i in range(20)}
    assert len(cases) > 3
    with pytest.raises(ValueError, match="clean_mix"):
        ReplayDataset(train_ds, tmp_path, clean_mix=0.6, fresh_image=0.6)
