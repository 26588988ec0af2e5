"""Acceptance (issue 13): the four robustness callbacks on a project written elsewhere -- tuple
batches, float channel masks, a ``val_loss`` key, a Subset training set, the datamodule's own
``train_dataloader`` -- under ``lightning.pytorch`` and ``pytorch_lightning``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from toys import quiet_trainer
from user_project import make

from robusttrain.callbacks import (
    BalancedCheckpoint,
    FailureMiningCallback,
    MetamorphicCallback,
    RobustnessConfigError,
    RobustnessReporter,
    robustness,
)
from robusttrain.metamorphic.suite import MRSuite

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _fit(run, callbacks, datamodule_mining=None, namespace="lightning.pytorch", epochs=2, logger=False):
    L, Net, Data = make(namespace)
    L.seed_everything(0, workers=True)
    model = Net()
    trainer = quiet_trainer(
        L, max_epochs=epochs, callbacks=callbacks, logger=logger, default_root_dir=run, num_sanity_val_steps=0
    )
    trainer.fit(model, datamodule=Data(mining=datamodule_mining))
    return trainer, model


def _four(run, order=(0, 1, 2, 3)):
    cbs = [
        MetamorphicCallback(suite=MRSuite(["contrast"], (5,)), dirpath=run, verbose=False),
        BalancedCheckpoint(dirpath=run, monitor="val_loss"),
        FailureMiningCallback(dirpath=run, train_probe_size=8, replay_ratio=0.5),
        RobustnessReporter(dirpath=run, console=False),
    ]
    return [cbs[i] for i in order], cbs[2]


def _perturbed(seen, originals):
    return sum(not any(torch.allclose(x, o, atol=1e-6) for o in originals) for x in seen)


def test_four_callbacks_on_a_user_project_any_order(tmp_path):
    run = tmp_path / "run"
    cbs, mining = _four(run, order=(3, 2, 1, 0))  # reversed: the order no longer matters
    trainer, model = _fit(run, cbs, datamodule_mining=mining)
    originals = [trainer.datamodule.train_set[i][0] for i in range(16)]
    assert len(model.seen[0]) == len(model.seen[1]) == 16  # replay never changes the epoch length
    assert _perturbed(model.seen[0], originals) == 0  # empty bank: the plain epoch
    assert _perturbed(model.seen[1], originals) > 0  # failures of epoch 0 replayed in epoch 1
    hist = pd.read_csv(run / "history.csv")
    assert len(hist) == 2 * 8 and all(c.startswith("idx") for c in hist.case_id)
    cases = pd.read_csv(run / "mr_cases.csv")
    train_ids = set(cases[cases.split == "train"].case_id)
    assert train_ids and all(c.startswith("train/idx") for c in train_ids)  # never merged with val idx<i>
    corners = json.loads((run / "corner_cases.json").read_text())
    assert corners["least_loss_epoch"] is not None  # monitor="val_loss" was found
    assert (run / "balanced.ckpt").is_file() and not (run / "balanced_candidates").exists()
    assert (run / "failures" / "failures.jsonl").is_file() and list((run / "plots").glob("*.png"))
    assert "train_dataloader" not in vars(trainer.datamodule)  # the user's datamodule is never patched


def test_convenience_returns_the_recipes_default_set_and_mining_on_request(tmp_path):
    run = tmp_path / "run"
    cbs = robustness(
        run_dir=run,
        perturbations=["contrast"],
        severities=(5,),
        monitor="val_loss",
        train_probe_size=8,
        mining=True,
        replay_ratio=0.5,
        metamorphic__verbose=False,
        reporter__console=False,
    )
    (mining,) = [c for c in cbs if isinstance(c, FailureMiningCallback)]
    assert mining.mode == "replay" and mining.replay_ratio == 0.5
    _fit(run, cbs, datamodule_mining=mining, epochs=1)
    assert (run / "history.csv").is_file() and (run / "corner_cases.json").is_file()
    assert (run / "metamorphic_training.csv").is_file() and (run / "failures" / "mining.csv").is_file()
    assert len({id(c.context) for c in cbs if hasattr(c, "context")}) == 1  # one shared context
    with pytest.raises(TypeError, match="unexpected argument 'nope'"):
        robustness(nope=1)


def test_mining_without_mr_and_replay_without_wrap_are_refused_before_training(tmp_path):
    with pytest.raises(
        RobustnessConfigError,
        match=r"FailureMiningCallback needs MetamorphicCallback results: "
        r"add MetamorphicCallback\(\.\.\.\)",
    ):
        _fit(tmp_path, [FailureMiningCallback(train_probe_size=4)])
    cbs, _ = _four(tmp_path)
    with pytest.raises(
        RobustnessConfigError, match=r"not passed through mining.wrap\(dataset\).*replay_ratio=0"
    ):
        _fit(tmp_path, cbs, datamodule_mining=None)  # the datamodule never wraps: one line, before step 1
    with pytest.raises(RobustnessConfigError, match="different dirpath values"):
        _fit(
            tmp_path,
            [MetamorphicCallback(dirpath=tmp_path / "a"), BalancedCheckpoint(dirpath=tmp_path / "b")],
        )


def test_balanced_checkpoint_alone_on_tuple_batches_warns_about_the_monitor(tmp_path, caplog):
    cb = BalancedCheckpoint(dirpath=tmp_path)  # default monitor val/loss; the project logs val_loss
    with caplog.at_level("WARNING"):
        _fit(tmp_path, [cb])
    assert "monitor='val/loss' was not logged" in caplog.text and "val_loss" in caplog.text
    hist = pd.read_csv(tmp_path / "balanced_history.csv")  # its own per-case Dice from tuple batches
    assert hist.groupby("epoch").size().tolist() == [8, 8]


def test_pytorch_lightning_namespace_with_its_wandb_logger(tmp_path, monkeypatch):
    from pytorch_lightning.loggers import WandbLogger

    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cbs, mining = _four(run)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="robusttrain-test")
    _, model = _fit(
        run, cbs, datamodule_mining=mining, namespace="pytorch_lightning", epochs=2, logger=logger
    )
    import wandb

    # the run's own summary (in memory; the offline file is written asynchronously): the reporter
    # found the pytorch_lightning WandbLogger and wrote the final corner-case summary to it
    summ = dict(logger.experiment.summary)
    wandb.finish()
    assert summ.get("corners/final") is True and "corners/balanced_epoch" in summ
    assert (run / "history.csv").is_file() and len(model.seen[1]) == 16


def test_importing_robusttrain_does_not_double_lightning_console_lines(tmp_path):
    script = tmp_path / "pl_project.py"
    script.write_text(
        textwrap.dedent("""
        import pytorch_lightning as pl
        import robusttrain.callbacks  # noqa: F401  (what a user's project adds)
        from user_project import make
        L, Net, Data = make("pytorch_lightning")
        t = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, accelerator="cpu", limit_train_batches=1, limit_val_batches=1)
        t.fit(Net(), datamodule=Data())
    """)
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert text.count("GPU available") == 1 and text.count("`Trainer.fit` stopped") == 1
