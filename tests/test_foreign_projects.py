"""Acceptance (issue 23): three kinds of foreign project (:mod:`foreign_projects`) with the four
callbacks as the README shows them, replay exercised; idle replay bit-identical under torch's and
MONAI's loaders; one run directory per run; a fit never replays a bank it did not write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from foreign_projects import as_numpy, make_lung, make_spleen, n_perturbed
from toys import quiet_trainer

from robusttrain.callbacks import (
    BalancedCheckpoint,
    FailureMiningCallback,
    MetamorphicCallback,
    RobustnessReporter,
)
from robusttrain.metamorphic.suite import MRSuite

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _readme_callbacks(replay_ratio=0.5, probe=8):
    """The README's four, on the contrast family (what the projects' rule is blind to)."""
    # replay_ratio=0 here: the unwrapped baseline (mining off, wrap() returns the dataset itself)
    mining = FailureMiningCallback(
        replay_ratio=replay_ratio, train_probe_size=probe, enabled=replay_ratio > 0
    )
    return [
        MetamorphicCallback(suite=MRSuite(["contrast"], severities=(5,)), verbose=False),
        BalancedCheckpoint(policy="last_inlier", monitor="val_loss"),
        mining,
        RobustnessReporter(console=False),
    ], mining


def _fit(make, root, epochs, replay_ratio=0.5, logger=None, **kw):
    callbacks, mining = _readme_callbacks(replay_ratio)
    L, Net, Data = make(mining, **kw)
    L.seed_everything(0, workers=True)
    trainer = quiet_trainer(
        L,
        max_epochs=epochs,
        callbacks=callbacks,
        default_root_dir=str(root),
        logger=logger if logger is not None else False,
    )
    model = Net()
    trainer.fit(model, datamodule=Data())
    return trainer, model


def test_polyp_monai_dicts_pytorch_lightning_under_hydra_logging(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "foreign_polyp_hydra.py"),
            f"hydra.run.dir={tmp_path / 'h'}",
            f"root={tmp_path / 'runs'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["perturbed"] == {"0": 0, "1": result["perturbed"]["1"]} and result["perturbed"]["1"] > 0
    run = Path(result["run_dir"])
    assert run.parent.name == "lightning_logs" and (run / "failures" / "failures.jsonl").is_file()
    # every console line once (Hydra's root handler + Lightning's own), the run directory said at start
    assert text.count("GPU available") == 1 and text.count("`Trainer.fit` stopped") == 1
    assert text.count("MR check, epoch 0 (val)") == 1
    assert text.count(f"robusttrain: writing the robustness files of this run to {run}") == 1


def test_lung_tuples_with_early_logits_in_the_unit_interval_train_to_the_end(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        trainer, model = _fit(make_lung, tmp_path, epochs=3)
    # epoch 0's one-channel logits lie in [0.3, 0.7]: one warning naming where the argument goes
    assert caplog.text.count("logits or sigmoid probabilities?") == 1
    assert "MetamorphicCallback(hooks=BatchHooks(to_probabilities='identity'))" in caplog.text
    run = trainer.robusttrain_context.run_dir
    assert sorted(pd.read_csv(run / "history.csv").epoch.unique()) == [0, 1, 2]
    assert [n_perturbed(model.seen[e]) for e in (0, 1)] == [0, 0] and n_perturbed(model.seen[2]) > 0
    sampling = json.loads((run / "failures" / "sampling.json").read_text())
    assert "all" not in sampling["weights"] and "contrast" in sampling["weights"]


def test_spleen_3d_crop_lists_monai_loader_and_list_data_collate(tmp_path):
    trainer, model = _fit(make_spleen, tmp_path, epochs=2)
    run = trainer.robusttrain_context.run_dir
    assert n_perturbed(model.seen[0]) == 0 and n_perturbed(model.seen[1]) > 0  # replay in MONAI's collate
    assert len(model.seen[0]) == len(model.seen[1]) == 6 * 2  # 2 crops per volume
    cases = pd.read_csv(run / "mr_cases.csv")
    train_ids = set(cases[cases.split == "train"].case_id)
    assert len(train_ids) == 8 and train_ids <= {f"train/idx{i}" for i in range(12)}  # 8 of the 6 x 2 crops
    recs = [json.loads(line) for line in (run / "failures" / "failures.jsonl").read_text().splitlines()]
    assert {r["index"] for r in recs if r.get("kind") == "failure"} <= set(range(12))


@pytest.mark.parametrize("project", ["torch-loader", "monai-loader"])
def test_idle_replay_wrapper_leaves_training_bit_identical(tmp_path, project):
    make = make_lung if project == "torch-loader" else make_spleen
    _, wrapped = _fit(make, tmp_path / "wrapped", epochs=1, replay_ratio=0.5)  # epoch 0: empty bank
    _, plain = _fit(make, tmp_path / "plain", epochs=1, replay_ratio=0.0)  # wrap() returns the dataset
    a, b = as_numpy(wrapped.seen[0]), as_numpy(plain.seen[0])
    assert a.shape == b.shape and (a == b).all()


def test_two_fits_with_wandb_first_get_two_run_dirs(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    dirs = []
    for _ in range(2):
        logger = [
            WandbLogger(offline=True, save_dir=str(tmp_path / "wb"), project="rt"),
            CSVLogger(str(tmp_path / "csv")),
        ]
        trainer, _ = _fit(make_lung, tmp_path, epochs=1, logger=logger)
        wandb.finish()
        dirs.append(trainer.robusttrain_context.run_dir)
    assert dirs[0] != dirs[1] and all(d.parent == tmp_path / "wb" / "robusttrain" for d in dirs)
    assert all((d / "history.csv").is_file() for d in dirs)


def test_a_fit_never_replays_a_bank_it_did_not_write(tmp_path):
    _, first = _fit(make_spleen, tmp_path, epochs=2)  # logger=False: both fits share tmp_path
    assert (tmp_path / "failures" / "failures.jsonl").is_file() and n_perturbed(first.seen[1]) > 0
    trainer, second = _fit(make_spleen, tmp_path, epochs=1)
    assert n_perturbed(second.seen[0]) == 0  # nothing of the first fit's bank replayed
    # a fresh fit sets the earlier fit's results aside (robusttrain.rundir.layout.set_aside_results)
    moved = list(tmp_path.glob("before-*/failures"))
    assert len(moved) == 1 and (moved[0] / "failures.jsonl").is_file()
    assert len(trainer.robusttrain_context.members) == 4
