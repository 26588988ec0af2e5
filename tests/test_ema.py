"""EMACheckpoint's run-sized decay: the documented windows come out of a real Lightning fit."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from toys import quiet_trainer

from robusttrain.callbacks import EMACheckpoint
from robusttrain.checkpoints import load_checkpoint
from robusttrain.training.averaging import ema_decay, first_update_share, last_fraction_share

pytestmark = pytest.mark.slow

EPOCHS, BATCHES = 10, 4  # 40 optimizer steps, one EMA update each


class Indicators(pl.LightningModule):
    """Two parameters the EMA averages, set (not trained: lr 0) at every step before the update:
    ``first`` is 1 at the first step only, ``last`` is 1 over the last quarter of the steps only. Their EMA
    at the end is the share of the first update / of the last quarter in the average."""

    def __init__(self, total_steps: int):
        super().__init__()
        self.total_steps = total_steps
        self.first = nn.Parameter(torch.zeros(1))
        self.last = nn.Parameter(torch.zeros(1))
        self.bn = nn.BatchNorm1d(1)

    def training_step(self, batch, _):
        step = self.global_step
        with torch.no_grad():
            self.first.fill_(1.0 if step == 0 else 0.0)
            self.last.fill_(1.0 if step >= self.total_steps * 3 // 4 else 0.0)
        # the BN layer sees the batch (its buffers are averaged too); the loss needs a gradient path
        return (self.bn(batch[0]).sum() + self.first + self.last).sum() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(run, **ema_kwargs):
    total = EPOCHS * BATCHES
    ema = EMACheckpoint(dirpath=run, **ema_kwargs)
    trainer = quiet_trainer(max_epochs=EPOCHS, callbacks=[ema], default_root_dir=run)
    model = Indicators(total)
    data = DataLoader(TensorDataset(torch.arange(2.0 * BATCHES).reshape(-1, 1)), batch_size=2)
    trainer.fit(model, data)
    return trainer, model, ema


@pytest.mark.parametrize("half_life", [0.05, 0.25])
def test_the_decay_from_the_half_life_gives_the_documented_window(tmp_path, half_life):
    trainer, model, ema = _fit(tmp_path, half_life=half_life)
    updates = EPOCHS * BATCHES
    assert ema.updates == updates == trainer.global_step
    decay = 0.5 ** (1 / (half_life * updates))  # the documented formula
    assert ema.decay_used == pytest.approx(decay, rel=1e-12)
    # after all updates the first update's weights keep decay ** (U - 1) = 0.5 ** ((U - 1) / (half_life * U))
    share_first = model.first.item()  # Lightning copied the EMA into the model at the end
    assert share_first == pytest.approx(first_update_share(decay, updates), rel=1e-4)
    assert share_first == pytest.approx(0.5 ** ((updates - 1) / (half_life * updates)), rel=1e-4)
    # ... and the last quarter of the updates carries 1 - 0.5 ** (0.25 / half_life)
    share_last = model.last.item()
    assert share_last == pytest.approx(last_fraction_share(decay, updates, 0.25), rel=1e-4)
    assert share_last == pytest.approx(1 - 0.5 ** (0.25 / half_life), rel=1e-6)
    report = json.loads((tmp_path / "ema.json").read_text())
    assert report["decay"] == ema.decay_used and report["decay_from"] == "half_life"
    assert report["averaged"] == updates and report["buffers"] == "averaged"
    assert report["first_update_share"] == pytest.approx(share_first, rel=1e-4)
    assert report["half_life_updates"] == pytest.approx(half_life * updates, rel=1e-9)
    # ema.ckpt is the averaged model, BatchNorm buffers included
    state = load_checkpoint(tmp_path / "ema.ckpt", Indicators(updates))["state_dict"]
    assert state["first"].item() == pytest.approx(share_first)
    averaged = ema._average_model.module.state_dict()
    assert torch.equal(state["bn.running_mean"], averaged["bn.running_mean"])


def test_a_given_decay_is_used_as_given_and_every_nth_step_counts_once(tmp_path):
    _, model, ema = _fit(tmp_path, decay=0.9, update_every_n_steps=2)
    updates = EPOCHS * BATCHES // 2
    assert ema.decay_used == 0.9 and ema.updates == updates
    assert model.first.item() == pytest.approx(0.9 ** (updates - 1), rel=1e-4)
    report = json.loads((tmp_path / "ema.json").read_text())
    assert report["decay_from"] == "given" and report["half_life"] is None and report["averaged"] == updates
    assert ema_decay(0.5, 2) == 0.5  # the formula at a glance: half-life of one update


def test_robustness_adds_the_ema_as_the_recipes_do_and_routes_its_arguments():
    """robustness() holds the EMA like the recipes (callbacks/ema.yaml: on); ``ema__<arg>`` reaches it,
    ``ema=False`` drops it."""
    from robusttrain.callbacks import EMACheckpoint, robustness

    cbs = robustness(run_dir="runs/x", perturbations=["blur"], ema__half_life=0.1)
    (ema,) = [c for c in cbs if isinstance(c, EMACheckpoint)]
    assert ema.half_life == 0.1 and ema.decay is None and ema.context is cbs[0].context
    assert str(ema.dirpath) == "runs/x"
    assert not any(isinstance(c, EMACheckpoint) for c in robustness(perturbations=["blur"], ema=False))
