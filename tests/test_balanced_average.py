"""BalancedAverage, EMACheckpoint and the selection-margin diagnostics in real (tiny) Lightning fits."""

import json
import logging

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader
from toys import LevelCases, Snapshots, TinyBN, quiet_trainer

from robusttrain.callbacks import BalancedAverage, BalancedCheckpoint, EMACheckpoint, RobustnessContext
from robusttrain.callbacks.context import RobustnessConfigError, context_for
from robusttrain.checkpoints import load_checkpoint
from robusttrain.cornercases import select_balanced_epoch
from robusttrain.cornercases.margin import MIN_CASES, selection_margin
from robusttrain.training.schedules import warmup_cosine_tail

pytestmark = pytest.mark.slow

BN_BATCHES = 2


class TinyBNTail(TinyBN):
    """TinyBN on the product's schedule: cosine over max_epochs, constant over the last ``lr_tail``."""

    def __init__(self, lr_tail):
        super().__init__()
        self.lr_tail = lr_tail

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = warmup_cosine_tail(opt, self.trainer.max_epochs, 0, self.lr_tail)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


class PlantedHistory(pl.Callback):
    """A history provider (the documented context route, as MetamorphicCallback) with a planted collapse:
    case ``bad`` is low at every epoch (a corner case) and collapses at ``collapse_epoch`` (its outlier epoch)."""

    def __init__(self, collapse_epoch, context):
        self.collapse_epoch, self.context = collapse_epoch, context

    def setup(self, trainer, pl_module, stage):
        self.ctx = context_for(trainer, self.context)
        self.ctx.join("PlantedHistory", provides=("mr",))

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        rows = []
        for e in range(trainer.current_epoch + 1):  # a pure function of the epoch: same after a resume
            rows += [
                {
                    "case_id": f"p{i}",
                    "epoch": e,
                    "dice_lv": 0.6 + 0.03 * e + 0.001 * i,
                    "dice_rv": 0.55 + 0.03 * e + 0.002 * i,
                }
                for i in range(9)
            ]
            low = 0.02 if e == self.collapse_epoch else 0.3
            rows.append({"case_id": "bad", "epoch": e, "dice_lv": low, "dice_rv": low})
        self.ctx.history = pd.DataFrame(rows)


class Crash(pl.Callback):
    """Stands in for a kill: the fit dies when ``epoch`` starts (on_train_end never runs)."""

    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("killed")


def train_loader():
    return DataLoader(LevelCases(), batch_size=4, shuffle=False)


def fit(run, max_epochs, collapse_epoch=4, extra=(), ckpt_path=None, window=0.5, lr_tail=None):
    ctx = RobustnessContext()
    avg = BalancedAverage(dirpath=run, window=window, bn_batches=BN_BATCHES, context=ctx)
    cbs = [
        PlantedHistory(collapse_epoch, ctx),
        BalancedCheckpoint(dirpath=run, context=ctx),
        avg,
        ModelCheckpoint(dirpath=run / "checkpoints", save_last=True),
        *extra,
    ]
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=max_epochs,
        callbacks=cbs,
        default_root_dir=run,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
    )
    model = TinyBN() if lr_tail is None else TinyBNTail(lr_tail)
    trainer.fit(model, train_loader(), DataLoader(LevelCases(seed=1), batch_size=4), ckpt_path=ckpt_path)
    return trainer, model, avg


def is_bn_stat(key):
    return key.endswith(("running_mean", "running_var"))


def test_average_is_the_mean_of_the_inlier_window_epochs_with_bn_reestimated(tmp_path, caplog):
    snap = Snapshots()
    with caplog.at_level(logging.WARNING):
        _, model, avg = fit(tmp_path, 6, extra=[snap])
    corners = json.loads((tmp_path / "corner_cases.json").read_text())
    assert corners["outlier_epochs"] == {"bad": [4]}  # the planted collapse is what ECOD flags
    report = json.loads((tmp_path / "balanced_average.json").read_text())
    assert report["window_epochs"] == [3, 4, 5] and report["excluded_epochs"] == [4]
    assert (
        report["averaged_epochs"] == [3, 5]
        and report["status"] == "ok"
        and report == {"schema": 2, **avg.report}
    )
    assert report["bn"] == {"reestimated": True, "batches": BN_BATCHES}
    assert (
        not (tmp_path / "balanced_average_window").exists()
        and not (tmp_path / "balanced_candidates").exists()
    )

    ckpt = load_checkpoint(
        tmp_path / "balanced_average.ckpt", TinyBN()
    )  # the CLI's reader (weights_only=True)
    state = ckpt["state_dict"]
    mean = {
        k: (snap.weights[3][k].double() + snap.weights[5][k].double()).div(2).float()
        for k in state
        if torch.is_floating_point(state[k])
    }
    for k, v in mean.items():
        if not is_bn_stat(k):
            assert torch.allclose(state[k], v, atol=1e-7), k
    # BN statistics: re-estimated on BN_BATCHES training batches, not the average of the epochs' buffers
    ref = TinyBN()
    ref.load_state_dict({**snap.weights[5], **mean})
    update_bn((b["image"] for i, b in zip(range(BN_BATCHES), train_loader())), ref)
    for k, v in ref.state_dict().items():
        if is_bn_stat(k):
            assert torch.allclose(state[k], v, atol=1e-6), k
            assert not torch.allclose(state[k], mean[k], atol=1e-3), k
    # the model keeps its own (last epoch's) weights: the average is a file
    for k, v in model.state_dict().items():
        assert torch.equal(v, snap.weights[5][k]), k
    # the diagnostics of the selection sit next to the choice, with the small-validation-set warning
    margin = corners["margin"]
    assert margin["chosen_epoch"] == corners["balanced_epoch"] == 5 and margin["last_epoch"] == 5
    assert margin["n_cases"] == 10 and margin["margins"]["worst"] == {
        "value": 0.0,
        "ci_low": 0.0,
        "ci_high": 0.0,
        "n": 1,
    }
    assert "rests on 10 validation cases (< 100)" in caplog.text


@pytest.mark.parametrize("kind", ["kill", "extend"])
def test_resume_ends_with_the_same_average_as_an_uninterrupted_fit(tmp_path, kind):
    fit(tmp_path / "straight", 6)
    run = tmp_path / kind
    if (
        kind == "kill"
    ):  # dies when epoch 5 starts: epochs 3, 4 of the window are only on disk and in last.ckpt
        with pytest.raises(RuntimeError, match="killed"):
            fit(run, 6, extra=[Crash(5)])
        assert sorted(p.name for p in (run / "balanced_average_window").iterdir()) == [
            "epoch=0002.pt",
            "epoch=0003.pt",
            "epoch=0004.pt",
        ]
    else:  # a finished 3-epoch fit resumed to 6: its window (1, 2) is not part of the 6-epoch window
        fit(run, 3)
        assert not (run / "balanced_average_window").exists()
    fit(run, 6, ckpt_path=run / "checkpoints" / "last.ckpt")
    a = torch.load(tmp_path / "straight" / "balanced_average.ckpt", weights_only=True)["state_dict"]
    b = torch.load(run / "balanced_average.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((d / "balanced_average.json").read_text()) for d in (tmp_path / "straight", run))
    assert ra == rb and rb["averaged_epochs"] == [3, 5] and rb["missing_epochs"] == []


def test_lr_tail_window_is_the_constant_lr_tail_minus_the_ecod_outliers(tmp_path):
    snap = Snapshots()
    fit(tmp_path, 6, window="lr_tail", lr_tail=0.5, extra=[snap])  # epochs 3, 4, 5 at one LR
    report = json.loads((tmp_path / "balanced_average.json").read_text())
    assert report["rule"] == "lr_tail" and report["window"] == "lr_tail"
    assert report["window_epochs"] == [3, 4, 5] and report["averaged_epochs"] == [3, 5]
    assert report["window_lr"] == [pytest.approx(0.05)] * 3  # 0.1 x the cosine's value half-way
    assert "constant-LR tail" in report["reason"] and len(report["run_id"]) == 64
    state = torch.load(tmp_path / "balanced_average.ckpt", weights_only=True)["state_dict"]
    mean = (snap.weights[3]["net.0.weight"].double() + snap.weights[5]["net.0.weight"].double()) / 2
    assert torch.allclose(state["net.0.weight"], mean.float(), atol=1e-7)
    assert report["bn"] == {"reestimated": True, "batches": BN_BATCHES}


@pytest.mark.parametrize(
    ("lr_tail", "window", "rule"),
    [(0.0, [3, 4, 5], "fraction"), (None, [0, 1, 2, 3, 4, 5], "lr_tail")],
    ids=["cosine-to-the-end", "constant-lr-throughout"],
)
def test_lr_tail_window_without_a_tail_or_with_a_constant_lr(tmp_path, caplog, lr_tail, window, rule):
    with caplog.at_level(logging.WARNING):
        fit(tmp_path, 6, window="lr_tail", lr_tail=lr_tail)
    report = json.loads((tmp_path / "balanced_average.json").read_text())
    assert report["rule"] == rule and report["window_epochs"] == window
    assert report["averaged_epochs"] == [e for e in window if e != 4]
    assert ("has no constant-LR tail" in caplog.text) == (rule == "fraction")


def test_lr_tail_kill_and_resume_ends_with_the_uninterrupted_files(tmp_path):
    fit(tmp_path / "straight", 6, window="lr_tail", lr_tail=0.5)
    run = tmp_path / "kill"
    with pytest.raises(RuntimeError, match="killed"):
        fit(run, 6, window="lr_tail", lr_tail=0.5, extra=[Crash(5)])
    fit(run, 6, window="lr_tail", lr_tail=0.5, ckpt_path=run / "checkpoints" / "last.ckpt")
    a = torch.load(tmp_path / "straight" / "balanced_average.ckpt", weights_only=True)["state_dict"]
    b = torch.load(run / "balanced_average.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((d / "balanced_average.json").read_text()) for d in (tmp_path / "straight", run))
    assert ra == rb and rb["rule"] == "lr_tail" and rb["window_epochs"] == [3, 4, 5]


def test_a_finished_fit_extended_into_its_old_window_says_what_is_missing(tmp_path, caplog):
    fit(tmp_path, 4)  # window 2, 3 -> removed when this fit ends
    with caplog.at_level(logging.WARNING):
        fit(tmp_path, 6, ckpt_path=tmp_path / "checkpoints" / "last.ckpt", collapse_epoch=0)
    report = json.loads((tmp_path / "balanced_average.json").read_text())
    assert report["window_epochs"] == [3, 4, 5] and report["missing_epochs"] == [3]
    assert report["averaged_epochs"] == [4, 5]
    assert "window epoch(s) [3] are not in" in caplog.text


def test_without_balanced_checkpoint_fit_is_refused_before_training(tmp_path):
    trainer = quiet_trainer(
        max_epochs=1, callbacks=[BalancedAverage(dirpath=tmp_path)], enable_checkpointing=True
    )
    model = TinyBN()
    with pytest.raises(
        RobustnessConfigError,
        match=r"BalancedAverage needs BalancedCheckpoint corner cases: "
        r"add BalancedCheckpoint\(\.\.\.\)",
    ):
        trainer.fit(model, train_loader(), DataLoader(LevelCases(seed=1), batch_size=4))
    assert trainer.global_step == 0


@pytest.mark.parametrize("bad", [{"window": 0}, {"window": 1.5}, {"bn_batches": -1}, {"window": "half"}])
def test_bad_arguments_are_refused_by_name(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"^{name}="):
        BalancedAverage(**bad)


def test_ema_checkpoint_is_lightnings_averaged_model(tmp_path):
    ema = EMACheckpoint(dirpath=tmp_path, decay=0.9)
    raw = RawAtEpochEnd()
    torch.manual_seed(0)
    trainer = quiet_trainer(max_epochs=2, callbacks=[ema, raw])
    model = TinyBN()
    trainer.fit(model, train_loader(), DataLoader(LevelCases(seed=1), batch_size=4))
    state = load_checkpoint(tmp_path / "ema.ckpt", TinyBN())["state_dict"]
    averaged = ema._average_model.module.state_dict()
    assert ema._average_model.n_averaged.item() == trainer.global_step == 6
    assert state.keys() == averaged.keys() and all(torch.equal(state[k], averaged[k]) for k in state)
    assert not torch.allclose(
        state["net.0.weight"], raw.weights["net.0.weight"]
    )  # the EMA is not the last step
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # Lightning copied it in
    with pytest.raises(ValueError, match=r"^decay=1.5: expected a number in \[0, 1\)"):
        EMACheckpoint(decay=1.5)


class RawAtEpochEnd(pl.Callback):
    """The raw (not averaged) weights when the last epoch ends: validation has swapped them back."""

    def on_train_epoch_end(self, trainer, pl_module):
        self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


def _history(n_cases, seed):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.5, 0.9, n_cases)
    return pd.DataFrame(
        [
            {
                "case_id": f"c{i:03d}",
                "epoch": e,
                "dice_fg": float(np.clip(base[i] + 0.02 * e + rng.normal(0, 0.05), 0, 1)),
            }
            for i in range(n_cases)
            for e in range(6)
        ]
    )


def test_selection_margin_ci_is_reproducible_and_warns_only_below_100_cases():
    h = _history(150, 0)
    sel = select_balanced_epoch(h, "cvar", candidates=[0, 1, 2, 3])  # the last epoch cannot be chosen
    m = selection_margin(h, sel, n_resamples=500)
    assert m["status"] == "ok" and m["n_cases"] == 150 >= MIN_CASES and m["warning"] is None
    assert m["criterion"] == "cvar" and m["chosen_epoch"] != m["last_epoch"] == 5
    for crit in ("cohort", "worst", "cvar"):
        r = m["margins"][crit]
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["ci_low"] < r["ci_high"], crit
    # the later epochs are better by construction (+0.02 per epoch): the cohort margin is clearly negative
    assert m["margins"]["cohort"]["ci_high"] < 0
    assert selection_margin(h, sel, n_resamples=500) == m  # same seed -> same numbers
    small = _history(40, 1)
    ms = selection_margin(small, select_balanced_epoch(small, "cvar", candidates=[0, 1, 2]), n_resamples=500)
    assert ms["warning"].startswith("the selection rests on 40 validation cases (< 100)")


def test_readme_averaging_example_runs(tmp_path, monkeypatch):
    import re
    import textwrap
    from pathlib import Path

    from user_project import make

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("## Averaging weights")
    (block,) = re.findall(r"```python\n(.*?)```", text[start : text.index("\n## ", start + 3)], flags=re.S)
    code = textwrap.dedent(block).replace(
        "max_epochs=20", "max_epochs=3, enable_progress_bar=False, logger=False"
    )
    L, Net, Data = make("lightning.pytorch")
    monkeypatch.chdir(tmp_path)
    L.seed_everything(0, workers=True)
    exec(compile(code, "README.md", "exec"), {"my_model": Net(), "my_datamodule": Data()})
    run = tmp_path / "runs" / "avg"
    for name in (
        "balanced.ckpt",
        "balanced_average.ckpt",
        "balanced_average.json",
        "ema.ckpt",
        "corner_cases.json",
    ):
        assert (run / name).is_file(), name
    # window="lr_tail": the user project trains at one constant LR, so its tail is the whole run
    assert json.loads((run / "balanced_average.json").read_text())["window_epochs"] == [0, 1, 2]


def test_robustness_configures_the_average_on_the_shared_context():
    from robusttrain.callbacks import robustness

    cbs = robustness(run_dir="runs/x", perturbations=["blur"], average__window=0.25)
    (average,) = [c for c in cbs if type(c).__name__ == "BalancedAverage"]
    assert average.window == 0.25 and average.context is cbs[0].context
