"""Failure mining under real DDP (2 CPU processes, gloo): failures mined on rank 0 reach both ranks'
training data in the next epoch, through the run directory rather than process memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import lightning.pytorch as L
    from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
    from robusttrain.datamodules.polyp import PolypDataModule
    from robusttrain.mining import CleanDataset
    from mining_models import BrightnessModel, n_perturbed

    run_dir = sys.argv[1]
    L.seed_everything(0, workers=True)
    dm = PolypDataModule(image_size=48, n_train=16, n_val=4, batch_size=4, num_workers=2)
    from robusttrain.metamorphic.suite import MRSuite
    mr = MetamorphicCallback(suite=MRSuite(["contrast"], severities=(5,)), max_cases=4,
                             dirpath=run_dir, verbose=False)
    mine = FailureMiningCallback(dirpath=run_dir, train_probe_size=8, replay_ratio=0.5)
    dm.wrap_train(mine.wrap)
    model = BrightnessModel()
    trainer = L.Trainer(max_epochs=2, callbacks=[mr, mine], logger=False, default_root_dir=run_dir,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        enable_checkpointing=False, accelerator="cpu", devices=2, strategy="ddp")
    trainer.fit(model, datamodule=dm)
    clean = CleanDataset(dm.train_dataset)
    by_case = {clean[i]["case_id"]: clean[i]["image"] for i in range(len(clean))}
    perturbed = {e: n_perturbed(seen, by_case) for e, seen in model.seen.items()}
    counts = {e: len(s) for e, s in model.seen.items()}
    with open(os.path.join(run_dir, f"seen_rank{trainer.global_rank}.json"), "w") as fh:
        json.dump({"perturbed": perturbed, "samples": counts}, fh)
""")


def test_mined_failures_reach_both_ranks_in_the_next_epoch(tmp_path):
    script = tmp_path / "ddp_mining.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    here = Path(__file__).resolve().parent  # the repo (robusttrain) and tests/ (mining_models)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    proc = subprocess.run(
        [sys.executable, str(script), str(run_dir)], capture_output=True, text=True, env=env, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    seen = [json.loads((run_dir / f"seen_rank{r}.json").read_text()) for r in (0, 1)]
    for s in seen:
        assert s["perturbed"]["0"] == 0  # the bank is empty during epoch 0
        assert s["perturbed"]["1"] > 0  # failures found after epoch 0 are trained on in epoch 1
        assert s["samples"]["0"] == s["samples"]["1"]  # replay fills slots; the epoch length is fixed
    rows = pd.read_csv(run_dir / "failures" / "mining.csv")
    assert list(rows["epoch"]) == [0, 1] and rows["trainable"].iloc[0] > 0 and rows["replayed"].iloc[1] > 0
    lines = (run_dir / "failures" / "failures.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds.count("batch") == 2 and kinds[-1] == "batch"  # one closed batch per epoch, rank 0 only


STEER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import lightning.pytorch as L
    from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback, MetamorphicTraining
    from robusttrain.datamodules.polyp import PolypDataModule
    from robusttrain.metamorphic.suite import MRSuite
    from mining_models import BrightnessModel

    run_dir = sys.argv[1]
    L.seed_everything(0, workers=True)
    dm = PolypDataModule(image_size=48, n_train=16, n_val=4, batch_size=4, num_workers=2)
    fams = ["contrast", "instrument"]
    mr = MetamorphicCallback(suite=MRSuite(fams, severities=(5,)), max_cases=4, dirpath=run_dir, verbose=False)
    mine = FailureMiningCallback(dirpath=run_dir, train_probe_size=8, mode="steer", steer=1.0)
    mt = MetamorphicTraining(perturbations=fams, k=1, q=0.5, epsilon=1.0, dirpath=run_dir, record_every=1,
                             record_per_step=4)
    dm.wrap_train(mine.wrap)  # steer mode: the dataset itself (the train probe reads it)
    model = BrightnessModel()
    trainer = L.Trainer(max_epochs=2, callbacks=[mr, mine, mt], logger=False, default_root_dir=run_dir,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        enable_checkpointing=False, accelerator="cpu", devices=2, strategy="ddp")
    trainer.fit(model, datamodule=dm)
    counts = {e: [c for c, _ in s] for e, s in model.seen.items()}
    with open(os.path.join(run_dir, f"steer_rank{trainer.global_rank}.json"), "w") as fh:
        json.dump({"cases": counts, "conditions": len(mine.conditions)}, fh)
""")


def test_failure_conditions_steer_both_ranks_draws_in_the_next_epoch(tmp_path):
    script = tmp_path / "ddp_steer.py"
    script.write_text(STEER_SCRIPT)
    run_dir = tmp_path / "run"
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    proc = subprocess.run(
        [sys.executable, str(script), str(run_dir)], capture_output=True, text=True, env=env, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = [json.loads((run_dir / f"steer_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["conditions"] == ranks[1]["conditions"] > 0  # rank 1 holds rank 0's bank
    for e in ("0", "1"):  # the two ranks' shards cover every case once per epoch: nothing replayed
        seen = ranks[0]["cases"][e] + ranks[1]["cases"][e]
        assert sorted(seen) == sorted(f"synpolyp_{i:04d}" for i in range(16))
    rows = pd.read_csv(run_dir / "failures" / "mining.csv")
    assert rows["steered"].tolist()[0] == 0 and rows["steered_share"].tolist()[1] == 1.0
    assert rows["perturbed"].tolist() == [8, 8]  # q=0.5 of 8 samples per rank, both ranks counted
    samples = [
        json.loads(line) for line in (run_dir / "metamorphic_training_samples.jsonl").read_text().splitlines()
    ]
    steered_ranks = {s["rank"] for s in samples if s["epoch"] == 1}
    assert steered_ranks == {0, 1}
    failing = {
        c["family"]
        for c in json.loads((run_dir / "failures" / "conditions.json").read_text())["conditions"].values()
    }
    assert {s["family"] for s in samples if s["epoch"] == 1} <= failing
