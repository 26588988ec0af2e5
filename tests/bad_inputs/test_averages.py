"""Issue 32 ("Trust v4") for the averaging callbacks, and their new arguments (issue 30, build item 4).

* An end-of-fit file counts as done only when it is this run's: an ``overwrite`` with another seed, killed in
  its end-of-fit work and resumed, ends with *its* balanced average, not the one the previous run left.
* ``ema.ckpt`` / ``ema.json`` are written by a resumed fit with no epoch left, equal to the uninterrupted run's.
* Every end-of-fit weights file goes through a temp name of the product's temp pattern (the clean-up's).
* Bad values of the new arguments fail when the object is built (API) / before training (CLI): one line.

The kill in the end-of-fit window is a callback that raises in ``on_train_end`` ahead of the averaging
callbacks: ``last.ckpt`` of the last epoch is saved, the end-of-fit work has not run (what a SIGKILL there
leaves; the subprocess kills of ``test_kill_resume.py`` cover the signal itself).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from test_balanced_average import PlantedHistory, train_loader
from torch.utils.data import DataLoader
from toys import LevelCases, TinyBN, quiet_trainer

from robusttrain.callbacks import BalancedAverage, BalancedCheckpoint, EMACheckpoint, RobustnessContext
from robusttrain.cli import main
from robusttrain.cli.claim import is_own_temp
from robusttrain.models import SegmentationModule

from .test_cli import TINY


class KilledAtTrainEnd(pl.Callback):
    """Stands in for a kill right after the last epoch's ``last.ckpt``: the end-of-fit work never runs."""

    def on_train_end(self, trainer, pl_module):
        raise RuntimeError("killed in the end-of-fit work")


class RecordingIO(TorchCheckpointIO):
    """Lightning's own writer, remembering every path it was asked to write."""

    def __init__(self):
        self.paths: list[Path] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.paths.append(Path(path))
        super().save_checkpoint(checkpoint, path, storage_options)


def _fit(run, seed, max_epochs, first=(), ckpt_path=None, average=True, ema=False, plugins=()):
    ctx = RobustnessContext()
    cbs = [*first]
    if average:
        cbs += [
            PlantedHistory(2, ctx),
            BalancedCheckpoint(dirpath=run, context=ctx),
            BalancedAverage(dirpath=run, window=0.5, bn_batches=2, context=ctx),
        ]
    if ema:
        cbs.append(EMACheckpoint(dirpath=run, context=ctx))
    cbs.append(ModelCheckpoint(dirpath=run / "checkpoints", save_last=True))
    torch.manual_seed(seed)
    trainer = quiet_trainer(
        max_epochs=max_epochs,
        callbacks=cbs,
        default_root_dir=run,
        num_sanity_val_steps=0,
        plugins=list(plugins),
        enable_checkpointing=True,
    )
    trainer.fit(TinyBN(), train_loader(), DataLoader(LevelCases(seed=1), batch_size=4), ckpt_path=ckpt_path)


def _weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_overwrite_with_another_seed_killed_in_its_end_of_fit_work_ends_with_its_own_average(tmp_path):
    run, straight = tmp_path / "run", tmp_path / "straight"
    _fit(run, seed=0, max_epochs=4)  # the previous run: its balanced_average.json / .ckpt stay behind
    old = _weights(run / "balanced_average.ckpt")
    shutil.rmtree(run / "checkpoints")  # what overwrite=true removes today; the average files stay
    _fit(straight, seed=1, max_epochs=4)  # the new run, uninterrupted
    with pytest.raises(RuntimeError, match="killed in the end-of-fit work"):
        _fit(run, seed=1, max_epochs=4, first=[KilledAtTrainEnd()])
    _fit(run, seed=1, max_epochs=4, ckpt_path=run / "checkpoints" / "last.ckpt")  # no epoch left
    new = _weights(run / "balanced_average.ckpt")
    assert not _same(new, old), "the resumed fit kept the previous run's balanced_average.ckpt"
    assert _same(new, _weights(straight / "balanced_average.ckpt"))
    report = json.loads((run / "balanced_average.json").read_text())
    assert report == json.loads((straight / "balanced_average.json").read_text())
    assert not (run / "balanced_average_window").exists()


@pytest.mark.slow
def test_ema_files_are_written_by_a_resumed_fit_with_no_epoch_left(tmp_path):
    run, straight = tmp_path / "run", tmp_path / "straight"
    _fit(straight, seed=0, max_epochs=3, average=False, ema=True)
    with pytest.raises(RuntimeError, match="killed in the end-of-fit work"):
        _fit(run, seed=0, max_epochs=3, first=[KilledAtTrainEnd()], average=False, ema=True)
    assert not (run / "ema.ckpt").exists()
    _fit(run, seed=0, max_epochs=3, ckpt_path=run / "checkpoints" / "last.ckpt", average=False, ema=True)
    assert (run / "ema.ckpt").is_file(), "a resumed fit with no epoch left wrote no ema.ckpt"
    assert _same(_weights(run / "ema.ckpt"), _weights(straight / "ema.ckpt"))
    assert json.loads((run / "ema.json").read_text()) == json.loads((straight / "ema.json").read_text())


@pytest.mark.slow
def test_end_of_fit_weights_go_through_the_products_temp_pattern(tmp_path):
    io = RecordingIO()
    _fit(tmp_path, seed=0, max_epochs=2, ema=True, plugins=[io])
    for final in ("balanced_average.ckpt", "ema.ckpt"):
        temps = [p for p in io.paths if p.name != final and final in p.name]
        assert temps, f"{final} was not written through a temp name ({[p.name for p in io.paths]})"
        assert all(is_own_temp(p) for p in temps), [p.name for p in temps]
        assert (tmp_path / final).is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and "tmp" in p.name]


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (lambda: EMACheckpoint(half_life=0), "half_life=0: expected a number in (0, 1]"),
        (lambda: EMACheckpoint(half_life=1.5), "half_life=1.5: expected a number in (0, 1]"),
        (lambda: EMACheckpoint(half_life="long"), "half_life='long': expected a number in (0, 1]"),
        (lambda: EMACheckpoint(decay=1.0), "decay=1.0: expected a number in [0, 1)"),
        (lambda: EMACheckpoint(update_every_n_steps=0), "update_every_n_steps=0: expected an integer >= 1"),
        (
            lambda: EMACheckpoint(update_starting_at_step=-1),
            "update_starting_at_step=-1: expected an integer",
        ),
        (lambda: EMACheckpoint(use_buffers="yes"), "use_buffers='yes': expected true or false"),
        (lambda: BalancedAverage(window="last"), "window='last': expected a number in (0, 1] or 'lr_tail'"),
        (lambda: SegmentationModule(lr_tail=1.5), "lr_tail=1.5: expected a number in [0, 1]"),
        (lambda: SegmentationModule(lr_tail="quarter"), "lr_tail='quarter': expected a number in [0, 1]"),
    ],
    ids=[
        "ema-half-life-0",
        "ema-half-life-1.5",
        "ema-half-life-text",
        "ema-decay-1",
        "ema-every-0-steps",
        "ema-start-negative",
        "ema-buffers-text",
        "average-window-text",
        "model-lr-tail-1.5",
        "model-lr-tail-text",
    ],
)
def test_bad_values_fail_when_built(build, text):
    with pytest.raises(ValueError, match=r"^\w+=") as err:
        build()
    assert str(err.value).startswith(text) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "key"),
    [
        (["model.lr_tail=2"], "model.lr_tail"),
        (["callbacks.balanced_average.window=last"], "callbacks.balanced_average.window"),
        (["callbacks.ema.enabled=true", "callbacks.ema.half_life=0"], "callbacks.ema.half_life"),
    ],
    ids=["lr-tail", "window", "ema-half-life"],
)
def test_cli_refuses_bad_averaging_values_before_training(tmp_path, capsys, override, key):
    run = tmp_path / "run"
    code = main(["fit", *TINY, f"run_dir={run}", *override])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("robusttrain fit: error:")]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and f"'{key}'" in errors[0], err[-2000:]
    assert not (run / "checkpoints").exists()
