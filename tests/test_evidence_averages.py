"""benchmarks/evidence/averages.py: the EMA the evidence keeps beside a run, and the balanced average
it builds from the per-epoch weights (real Lightning trainers; no data folder needed)."""

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from toys import quiet_trainer

from benchmarks.evidence.averages import EMATracker, balanced_average


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 1))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Steps(L.Callback):
    """The net's parameters after every optimizer step."""

    def __init__(self):
        self.after: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, *a):
        self.after.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


def loader():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(12, 2, 8, 8, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1] * 0.5), batch_size=4)


def trainer(tmp, epochs, cbs):
    return quiet_trainer(max_epochs=epochs, callbacks=cbs, default_root_dir=tmp, enable_checkpointing=True)


def test_ema_is_the_per_step_exponential_average_and_leaves_training_alone(tmp_path):
    ema, steps = EMATracker(decay=0.9), Steps()
    m = Net()
    trainer(tmp_path / "a", 2, [ema, steps]).fit(m, loader())
    expect = dict(steps.after[0])  # the first update copies the weights
    for s in steps.after[1:]:
        expect = {k: 0.9 * expect[k] + 0.1 * s[k] for k in s}
    got = ema.weights()
    assert sorted(got) == sorted(expect) and len(steps.after) == 6
    for k in got:
        torch.testing.assert_close(got[k], expect[k])
    assert not torch.equal(got["net.0.weight"], m.state_dict()["net.0.weight"])  # an average, not the last
    plain = Net()
    trainer(tmp_path / "b", 2, []).fit(plain, loader())
    for k, v in plain.state_dict().items():  # training is the same with or without the tracker
        assert torch.equal(v, m.state_dict()[k])


def test_ema_resumes_from_the_checkpoint_equal_to_an_uninterrupted_run(tmp_path):
    whole = EMATracker(decay=0.8)
    trainer(tmp_path / "w", 3, [whole]).fit(Net(), loader())
    first = EMATracker(decay=0.8)
    t = trainer(tmp_path / "r", 1, [first])
    t.fit(Net(), loader())
    t.save_checkpoint(tmp_path / "one.ckpt")
    resumed = EMATracker(decay=0.5)  # the decay travels in the checkpoint too
    trainer(tmp_path / "r", 3, [resumed]).fit(Net(), loader(), ckpt_path=tmp_path / "one.ckpt")
    assert resumed.decay == 0.8
    a, b = whole.weights(), resumed.weights()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_ema_of_a_run_resumed_with_no_step_left_is_the_checkpoint_s_average(tmp_path):
    # Evidence v4's first two runs were stopped while scoring; their resume (max_epochs already
    # reached) must read the EMA from the checkpoint, not refuse ("no optimizer step was seen")
    whole = EMATracker(decay=0.8)
    t = trainer(tmp_path / "w", 2, [whole])
    t.fit(Net(), loader())
    t.save_checkpoint(tmp_path / "done.ckpt")
    resumed = EMATracker(decay=0.5)
    trainer(tmp_path / "w", 2, [resumed]).fit(Net(), loader(), ckpt_path=tmp_path / "done.ckpt")
    a, b = whole.weights(), resumed.weights()
    assert sorted(a) == sorted(b) and resumed.decay == 0.8
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_balanced_average_takes_the_window_s_inlier_epochs():
    states = {e: {"w": torch.tensor([float(e)]), "n": torch.tensor(e)} for e in range(10)}
    avg, info = balanced_average(states.__getitem__, list(range(10)), {"p1": [6, 8], "p2": [8]}, 0.5)
    assert info["window_epochs"] == [5, 6, 7, 8, 9] and info["averaged_epochs"] == [5, 7, 9]
    assert info["excluded_epochs"] == [6, 8] and info["status"] == "ok"
    assert avg["w"].item() == pytest.approx(7.0) and avg["n"].item() == 9
    # every window epoch flagged: the least-flagged ones
    avg, info = balanced_average(states.__getitem__, [7, 8, 9], {"a": [7, 8, 9], "b": [8]}, 1.0)
    assert info["status"] == "no_inlier_epoch" and info["averaged_epochs"] == [7, 9]
    assert avg["w"].item() == pytest.approx(8.0)
