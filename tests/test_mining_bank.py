"""FailureBank: de-duplication, eviction, atomic log, reload, checkpoint state, split rule."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from robusttrain.metamorphic.records import FailureRecord, failure_id
from robusttrain.mining.bank import FailureBank
from robusttrain.rundir.failures import read_batches


def rec(case="c0", pert="blur", sev=4, sigma=3.0, epoch=0, fol=0.3, split="train", index=0):
    return FailureRecord(
        case_id=case,
        split=split,
        perturbation=pert,
        severity=sev,
        params={"sigma": np.array([sigma])},
        seed=1,
        epoch=epoch,
        src_dice=0.9,
        fol_dice=fol,
        src_iou=0.8,
        fol_iou=0.2,
        index=index,
    )


def test_dedup_by_key_and_recency(tmp_path):
    bank = FailureBank(tmp_path)
    assert bank.add(rec(epoch=0))
    assert not bank.add(rec(epoch=0))  # same key, same epoch
    assert bank.add(rec(sigma=5.0))  # different params: a different failure
    assert bank.flush(epoch=0) == 2
    assert not bank.add(rec(epoch=3, fol=0.1))  # seen again, worse
    bank.flush(epoch=3)
    e = bank.entries[failure_id(rec())]
    assert e["last_epoch"] == 3 and e["count"] == 3 and e["record"].fol_dice == 0.1
    back = FailureBank.load(tmp_path)
    assert len(back) == 2
    assert back.entries[failure_id(rec())]["last_epoch"] == 3
    assert back.entries[failure_id(rec())]["record"].fol_dice == 0.1


def test_eviction_keeps_most_severe_and_most_recent(tmp_path):
    bank = FailureBank(tmp_path, max_size=4)
    # epoch 0: two very severe, two mild; epoch 1: three mild new ones
    for i, fol in enumerate([0.0, 0.05, 0.6, 0.6]):
        bank.add(rec(case=f"a{i}", fol=fol, epoch=0))
    bank.flush(0)
    for i in range(3):
        bank.add(rec(case=f"b{i}", fol=0.6 - 0.01 * i, epoch=1))
    bank.flush(1)
    kept = {r.case_id for r in bank.records()}
    assert len(kept) == 4
    assert {"a0", "a1"} <= kept  # most severe survive although old
    assert len(kept & {"b0", "b1", "b2"}) == 2  # the rest: most recent, more severe first
    assert {"b1", "b2"} <= kept  # lower fol_dice = larger drop
    back = FailureBank.load(tmp_path, max_size=4)
    assert {r.case_id for r in back.records()} == kept


def test_torn_tail_is_ignored_and_repaired(tmp_path):
    bank = FailureBank(tmp_path)
    bank.add(rec(case="x"))
    bank.flush(0)
    path = bank.log_path
    good = path.read_bytes()
    # a killed writer: one complete failure line of a new batch plus half a line, no marker
    line = json.dumps({"kind": "failure", "id": "zz", **rec(case="y").to_dict()})
    path.write_bytes(good + line.encode() + b"\n" + line[:20].encode())
    assert len(read_batches(path)) == 1
    assert [r.case_id for r in FailureBank.load(tmp_path).records()] == ["x"]
    bank.add(rec(case="z"))
    bank.flush(1)  # append after repairing the tail
    assert all(json.loads(ln) for ln in path.read_text().splitlines())
    assert sorted(r.case_id for r in FailureBank.load(tmp_path).records()) == ["x", "z"]


def test_state_dict_roundtrip_rewrites_log(tmp_path):
    bank = FailureBank(tmp_path)
    bank.add(rec(case="a"))
    bank.flush(0)
    state = bank.state_dict()
    bank.add(rec(case="b"))
    bank.flush(1)  # files now ahead of the "checkpoint"
    resumed = FailureBank(tmp_path)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # checkpoints may go through JSON-ish
    assert [r.case_id for r in resumed.records()] == ["a"]
    assert [r.case_id for r in FailureBank.load(tmp_path).records()] == ["a"]


def test_val_failures_reported_not_trainable(tmp_path, caplog):
    bank = FailureBank(tmp_path)
    bank.add(rec(case="t"))
    bank.add(rec(case="v", split="val"))
    assert len(bank) == 2 and [r.case_id for r in bank.trainable()] == ["t"]
    with caplog.at_level(logging.WARNING):
        leaky = FailureBank(tmp_path, allow_val_mining=True)
        leaky.add(rec(case="v", split="val"))
    assert "leakage" in caplog.text
    assert [r.case_id for r in leaky.trainable()] == ["v"]


def test_thumbnails_for_worst_n(tmp_path):
    bank = FailureBank(tmp_path, n_thumbs=1)
    img = np.zeros((16, 16, 3), np.uint8)
    msk = np.zeros((16, 16), np.uint8)
    ims = dict(source=img, followup=img, gt=msk, pred_source=msk, pred_followup=msk)
    bank.add(rec(case="mild", fol=0.6), ims)
    bank.add(rec(case="bad", fol=0.0), ims)
    bank.flush(0)
    thumbs = list((tmp_path / "failures" / "thumbs").glob("*.png"))
    assert [p.stem for p in thumbs] == [failure_id(rec(case="bad"))]
    import cv2

    assert cv2.imread(str(thumbs[0])).shape == (96, 5 * 96, 3)


def test_min_size():
    with pytest.raises(ValueError, match="max_size"):
        FailureBank(max_size=1)
