"""Whatever epoch a checkpoint policy picks has its weights on disk (issue 48 item 7).

``balanced.ckpt`` is the epoch of the run's own policy; the epochs the other policies pick among the same
candidates are kept in ``balanced_picks/`` (``policy_checkpoints`` of corner_cases.json), so every row of
the report's trade-off table can be scored without retraining. ``policy=cvar`` keeps only the ``r+1``
candidates with the best worst-fraction Dice (``r`` = how many epochs ECOD can flag) and still picks the
epoch it would pick with every epoch kept."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from robusttrain.cli import main
from robusttrain.cornercases import max_flagged, select_balanced_epoch

TINY = [
    "recipe=smoke",
    "data.n_train=8",
    "data.n_val=8",
    "data.image_size=32",
    "data.batch_size=4",
    "callbacks.metamorphic.max_cases=null",
    "callbacks.metamorphic.suite.perturbations=[blur]",
    "callbacks.mining.enabled=false",
    "callbacks.metamorphic_training.enabled=false",
    "callbacks.balanced_average.enabled=false",
    "trainer.max_epochs=5",
    "trainer.enable_progress_bar=false",
]


def _epoch_of(path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["epoch"])


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["last_inlier", "cvar"])
def test_every_policys_epoch_is_on_disk_and_balanced_ckpt_is_the_runs_own(policy, tmp_path):
    run = tmp_path / "run"
    assert main(["fit", *TINY, f"run_dir={run}", f"callbacks.balanced.policy={policy}"]) == 0
    corners = json.loads((run / "corner_cases.json").read_text())
    history = pd.read_csv(run / "history.csv")
    assert corners["policy"] == policy and corners["checkpoint"] == "balanced.ckpt"
    assert _epoch_of(run / "balanced.ckpt") == corners["balanced_epoch"]
    picks, where = corners["policy_epochs"], corners["policy_checkpoints"]
    assert set(picks) == {"last_inlier", "maximin", "pareto", "cvar"}
    for p, epoch in picks.items():
        # the same choice the report's trade-off table makes from history.csv and the candidates
        again = select_balanced_epoch(
            history, p, reference_epoch=corners["least_loss_epoch"], candidates=corners["candidate_epochs"]
        )
        assert epoch == again.epoch, p
        assert _epoch_of(run / where[p]) == epoch, (p, where[p])
        assert where[p] == (
            "balanced.ckpt"
            if epoch == corners["balanced_epoch"]
            else f"balanced_picks/epoch={epoch:04d}.ckpt"
        )
    kept = (
        {f"balanced_picks/{f.name}" for f in (run / "balanced_picks").glob("*")}
        if (run / "balanced_picks").exists()
        else set()
    )
    assert kept == {w for w in where.values() if w != "balanced.ckpt"}  # nothing else kept
    assert not (run / "balanced_candidates").exists()
    if policy == "cvar":
        r = max_flagged(history["case_id"].nunique(), 0.1) * max_flagged(5, 0.1)
        assert len(corners["candidate_epochs"]) <= r + 1 < 5  # pruned while training
        every = select_balanced_epoch(history, "cvar", reference_epoch=corners["least_loss_epoch"])
        assert corners["balanced_epoch"] == every.epoch  # the pick with every epoch kept
