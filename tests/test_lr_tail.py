"""SegmentationModule(lr_tail=...): the cosine runs to the tail's start, then the LR stays constant."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from toys import quiet_trainer

from robusttrain.datamodules import PolypDataModule
from robusttrain.models import SegmentationModule

pytestmark = pytest.mark.slow

LR = 1e-2


class LRLog(pl.Callback):
    def __init__(self):
        self.lrs = {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.lrs[trainer.current_epoch] = trainer.optimizers[0].param_groups[0]["lr"]


def _fit(run, max_epochs, ckpt=None, lr_tail=0.25):
    pl.seed_everything(0)
    log = LRLog()
    trainer = quiet_trainer(
        max_epochs=max_epochs,
        limit_train_batches=1,
        limit_val_batches=1,
        callbacks=[log, ModelCheckpoint(dirpath=run, save_last=True)],
        enable_checkpointing=True,
    )
    model = SegmentationModule(features=(4, 4, 8, 8, 16, 4), lr=LR, lr_tail=lr_tail)
    dm = PolypDataModule(image_size=32, n_train=4, n_val=2, batch_size=4, num_workers=0, seed=0)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return log.lrs


def cosine(epoch, total):
    return LR * (1 + math.cos(math.pi * epoch / total)) / 2


def test_the_last_quarter_trains_at_the_lr_the_cosine_has_where_it_starts(tmp_path):
    lrs = _fit(tmp_path, 8)
    assert [lrs[e] for e in range(6)] == pytest.approx([cosine(e, 8) for e in range(6)], rel=1e-9)
    assert lrs[6] == lrs[7] == pytest.approx(cosine(6, 8), rel=1e-9)


def test_a_resume_with_more_epochs_moves_the_tail_to_the_new_end(tmp_path):
    _fit(tmp_path / "short", 4)  # tail: epoch 3
    resumed = _fit(tmp_path / "short", 8, ckpt=str(tmp_path / "short" / "last.ckpt"))
    fresh = _fit(tmp_path / "fresh", 8)
    assert sorted(resumed) == [4, 5, 6, 7]
    assert [resumed[e] for e in range(4, 8)] == pytest.approx([fresh[e] for e in range(4, 8)], rel=1e-9)
    assert resumed[6] == resumed[7] and resumed[5] > resumed[6]
