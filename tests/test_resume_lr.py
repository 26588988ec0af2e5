"""Resuming with a larger max_epochs continues on a longer cosine schedule instead of at LR 0."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from toys import quiet_trainer

from robusttrain.datamodules import PolypDataModule
from robusttrain.models import SegmentationModule


class LRLog(pl.Callback):
    def __init__(self):
        self.lrs = {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.lrs[trainer.current_epoch] = trainer.optimizers[0].param_groups[0]["lr"]


def _fit(tmp_path, max_epochs, ckpt=None, warmup=0, stop_after=None):
    pl.seed_everything(0)
    log = LRLog()
    extra = [StopAfter(stop_after)] if stop_after is not None else []
    trainer = quiet_trainer(
        max_epochs=max_epochs,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[log, ModelCheckpoint(dirpath=tmp_path, save_last=True), *extra],
        enable_checkpointing=True,
    )
    model = SegmentationModule(features=(4, 4, 8, 8, 16, 4), lr=1e-2, warmup_epochs=warmup)
    dm = PolypDataModule(image_size=32, n_train=8, n_val=2, batch_size=4, num_workers=0, seed=0)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return log.lrs


@pytest.mark.parametrize("warmup", [0, 1])
def test_resume_with_more_epochs_stretches_the_cosine(tmp_path, warmup):
    first = _fit(tmp_path, 3, warmup=warmup)
    resumed = _fit(tmp_path, 6, ckpt=str(tmp_path / "last.ckpt"), warmup=warmup)
    assert sorted(resumed) == [3, 4, 5]
    # where a 6-epoch cosine (after the warm-up) is at epoch 3: not 0, as the restored 3-epoch one would be
    t = 6 - warmup
    expected = 1e-2 * (1 + math.cos(math.pi * (3 - warmup) / t)) / 2
    assert resumed[3] == pytest.approx(expected, rel=1e-6)
    assert resumed[4] < resumed[3] and resumed[5] < resumed[4] and resumed[5] > 0
    # the first run followed its own (shorter) schedule; an uninterrupted 6-epoch run matches the resumed LRs
    fresh = _fit(tmp_path / "fresh", 6, warmup=warmup)
    assert [fresh[e] for e in (3, 4, 5)] == pytest.approx([resumed[e] for e in (3, 4, 5)], rel=1e-6)
    assert first[0] == pytest.approx(fresh[0])


class StopAfter(pl.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def test_resume_with_the_same_epochs_keeps_the_schedule(tmp_path):
    reference = _fit(tmp_path / "ref", 5)
    _fit(tmp_path / "cut", 5, stop_after=1)  # a 5-epoch run stopped after epoch 1
    resumed = _fit(tmp_path / "cut", 5, ckpt=str(tmp_path / "cut" / "last.ckpt"))
    assert sorted(resumed) == [2, 3, 4]
    assert [resumed[e] for e in (2, 3, 4)] == pytest.approx([reference[e] for e in (2, 3, 4)], rel=1e-9)


def test_warmup_ramps_up_linearly(tmp_path):
    lrs = _fit(tmp_path, 4, warmup=2)
    assert lrs[0] == pytest.approx(1e-2 / 3) and lrs[1] == pytest.approx(2e-2 / 3)
    assert lrs[2] == pytest.approx(1e-2) and lrs[3] < lrs[2]


def test_warmup_checked_when_built():
    with pytest.raises(ValueError, match=r"warmup_epochs"):
        SegmentationModule(warmup_epochs=-1)
