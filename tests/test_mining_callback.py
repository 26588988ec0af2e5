"""A real tiny fit: MetamorphicCallback mines train failures, FailureMiningCallback replays them in
the next epoch through a DataLoader with 2 (persistent) workers; state survives a checkpoint."""

from __future__ import annotations

import lightning.pytorch as L
import pandas as pd
import pytest
from mining_models import BrightnessModel, n_perturbed
from toys import quiet_trainer

from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
from robusttrain.datamodules.polyp import PolypDataModule
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.mining import CleanDataset, FailureBank

pytestmark = pytest.mark.slow


def fit(tmp_path, epochs, ckpt=None, **mining):
    L.seed_everything(0, workers=True)  # which samples a replay replaces is random; fix it
    dm = PolypDataModule(image_size=48, n_train=16, n_val=4, batch_size=4, num_workers=2)
    mr = MetamorphicCallback(
        suite=MRSuite(["contrast"], severities=(5,)), max_cases=4, dirpath=str(tmp_path), verbose=False
    )
    mine = FailureMiningCallback(train_probe_size=8, **mining)
    dm.wrap_train(mine.wrap)  # the explicit replay wiring: the train loader reads mine.wrap(train_dataset)
    model = BrightnessModel()
    trainer = quiet_trainer(
        max_epochs=epochs, callbacks=[mr, mine], default_root_dir=tmp_path, num_sanity_val_steps=0
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return trainer, dm, model, mine


def test_failures_replayed_next_epoch_with_workers(tmp_path):
    trainer, dm, model, mine = fit(tmp_path, epochs=2, replay_ratio=0.2)
    bank = FailureBank.load(tmp_path)
    assert len(bank.trainable()) > 0, "the fixed brightness rule must fail under low contrast"
    assert all(r.split in ("train", "val") for r in bank.records())
    assert "train_dataloader" not in vars(dm)  # the user's datamodule is never patched
    clean = CleanDataset(dm.train_dataset)
    clean_by_case = {clean[i]["case_id"]: clean[i]["image"] for i in range(len(clean))}
    slots = mine.replay.n_slots
    assert slots == 3 and len(model.seen[0]) == len(model.seen[1]) == 16  # the epoch length never changes
    assert n_perturbed(model.seen[0], clean_by_case) == 0  # bank empty in epoch 0
    assert n_perturbed(model.seen[1], clean_by_case) > 0  # replayed failures in epoch 1
    rows = pd.read_csv(tmp_path / "failures" / "mining.csv")
    assert list(rows["replayed"]) == [0, slots]
    assert rows["bank_size"].iloc[0] == len(bank)
    assert (tmp_path / "failures" / "sampling.json").exists()
    assert trainer.callback_metrics["mining/replayed"] == slots
    assert "mining/weight/contrast" in trainer.callback_metrics
    state = mine.state_dict()
    assert len(state["bank"]["entries"]) == len(bank)

    # resume: the log is rewritten to the checkpoint's bank even if the files ran ahead of it
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    extra = FailureBank(tmp_path)
    extra.add(bank.records()[0].__class__(**{**bank.records()[0].__dict__, "case_id": "ahead"}))
    extra.flush(9)
    assert len(FailureBank.load(tmp_path)) == len(bank) + 1
    _, _, _, resumed = fit(tmp_path, epochs=2, ckpt=str(tmp_path / "last.ckpt"), replay_ratio=0.2)
    assert len(resumed.bank) == len(bank)
    assert {r.case_id for r in FailureBank.load(tmp_path).records()} == {r.case_id for r in bank.records()}
    assert resumed.rows == mine.rows


def test_disabled(tmp_path):
    trainer, dm, model, mine = fit(tmp_path, epochs=1, enabled=False, replay_ratio=0.2)
    assert mine.bank is None and not (tmp_path / "failures").exists()
    assert len(model.seen[0]) == 16
