"""Bad callback arguments are refused when the callback is built (issue 10): one line naming the
argument and the value, before any training. Samples the callbacks cannot read (no mask) are refused
by a real ``trainer.fit`` before its first training step."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from toys import quiet_trainer

from robusttrain.callbacks import (
    BalancedCheckpoint,
    FailureMiningCallback,
    MetamorphicCallback,
    RobustnessReporter,
)
from robusttrain.metamorphic.batch import BatchHooks, HookError
from robusttrain.metamorphic.suite import MRSuite

CASES = [
    # (id, build, message regex): each build raises a ValueError with that one-line message
    ("severity-0", lambda: MRSuite(["blur"], severities=(0,)), r"severities=\[0\].*int in 1\.\.5.*got 0"),
    ("severity-6", lambda: MRSuite(["blur"], severities=(2, 6)), r"severities=\[2, 6\].*got 6"),
    ("severity-empty", lambda: MRSuite(["blur"], severities=()), r"severities= must not be empty"),
    ("unknown-perturbation", lambda: MRSuite(["blur", "nope"]), r"unknown perturbation 'nope'"),
    ("unknown-suite", lambda: MRSuite("nope"), r"unknown perturbation suite 'nope'"),
    (
        "kwargs-for-absent-family",
        lambda: MRSuite(["blur"], perturbation_kwargs={"text": {}}),
        r"perturbation_kwargs has 'text'",
    ),
    ("suite-not-a-suite", lambda: MetamorphicCallback(suite=["blur"]), r"suite must be an MRSuite"),
    (
        "hooks-not-hooks",
        lambda: MetamorphicCallback(hooks={"get_images": None}),
        r"hooks must be a BatchHooks",
    ),
    (
        "bad-to-probabilities",
        lambda: MetamorphicCallback(hooks=BatchHooks(to_probabilities="softmaxx")),
        r"to_probabilities='softmaxx'",
    ),
    (
        "violation-threshold",
        lambda: MetamorphicCallback(violation_threshold=1.5),
        r"violation_threshold=1\.5: expected a number in \[0, 1\]",
    ),
    ("every-n-negative", lambda: MetamorphicCallback(every_n_epochs=-1), r"every_n_epochs=-1"),
    (
        "heldout-unknown-family",
        lambda: MetamorphicCallback(heldout=["motion_blur", "nope"]),
        r"heldout: unknown perturbation 'nope'; valid families: ",
    ),
    ("max-cases-zero", lambda: MetamorphicCallback(max_cases=0), r"max_cases=0: expected an integer >= 1"),
    ("batch-size-zero", lambda: MetamorphicCallback(batch_size=0), r"batch_size=0"),
    ("path", lambda: MetamorphicCallback(path="gpu"), r"path='gpu': expected one of 'auto', 'torch'"),
    (
        "budget",
        lambda: MetamorphicCallback(budget=2.0),
        r"budget must be a fraction .* in \(0, 1\].* got 2\.0",
    ),
    (
        "replay-ratio-1",
        lambda: FailureMiningCallback(replay_ratio=1.0),
        r"replay_ratio=1\.0: expected a number in \[0, 0\.9\]",
    ),
    ("replay-ratio-negative", lambda: FailureMiningCallback(replay_ratio=-0.1), r"replay_ratio=-0\.1"),
    (
        "train-probe-zero",
        lambda: FailureMiningCallback(train_probe_size=0),
        r"train_probe_size=0: expected an integer >= 1",
    ),
    ("jitter", lambda: FailureMiningCallback(jitter=2), r"jitter=2"),
    (
        "mix-sum",
        lambda: FailureMiningCallback(clean_mix=0.6, fresh_image=0.6),
        r"clean_mix=0\.6 \+ fresh_image=0\.6: expected a sum <= 1",
    ),
    ("max-size", lambda: FailureMiningCallback(max_size=1), r"max_size=1"),
    (
        "momentum",
        lambda: FailureMiningCallback(momentum=1.0),
        r"momentum=1\.0: expected a number in \[0, 1\)",
    ),
    ("floor", lambda: FailureMiningCallback(floor=2), r"floor=2: expected a number in \[0, 1\]"),
    (
        "mining-mode",
        lambda: FailureMiningCallback(mode="frozen"),
        r"mode='frozen': expected one of 'steer', 'replay'",
    ),
    ("steer", lambda: FailureMiningCallback(steer=1.5), r"steer=1\.5: expected a number in \[0, 1\]"),
    ("decay", lambda: FailureMiningCallback(decay=1.0), r"decay=1\.0: expected a number in \[0, 1\)"),
    ("balance", lambda: FailureMiningCallback(balance=-0.1), r"balance=-0\.1"),
    ("placement-jitter", lambda: FailureMiningCallback(placement_jitter=2), r"placement_jitter=2"),
    (
        "steer-with-replay-ratio",
        lambda: FailureMiningCallback(mode="steer", replay_ratio=0.3),
        r"replay_ratio=0\.3 replays failing images \(mode='replay'\); mode='steer' replays none",
    ),
    (
        "contamination-0.9",
        lambda: BalancedCheckpoint(contamination=0.9),
        r"contamination=0\.9: expected a number in \(0, 0\.5\]",
    ),
    ("contamination-0", lambda: BalancedCheckpoint(contamination=0), r"contamination=0: .*\(0, 0\.5\]"),
    ("policy", lambda: BalancedCheckpoint(policy="best"), r"policy='best': expected one of 'last_inlier'"),
    ("mode", lambda: BalancedCheckpoint(mode="up"), r"mode='up'"),
    ("tail", lambda: BalancedCheckpoint(tail="left"), r"tail='left'"),
    ("retention", lambda: BalancedCheckpoint(retention=0), r"retention=0"),
    ("min-epoch", lambda: BalancedCheckpoint(min_epoch=-2), r"min_epoch=-2"),
    (
        "worst-fraction",
        lambda: BalancedCheckpoint(worst_fraction=0),
        r"worst_fraction=0: expected a number in \(0, 1\]",
    ),
    ("reporter-every", lambda: RobustnessReporter(every_n_epochs=0), r"every_n_epochs=0"),
]


@pytest.mark.parametrize(("build", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_callback_argument_is_refused_at_construction(build, pattern):
    with pytest.raises(ValueError, match=pattern) as err:
        build()
    assert "\n" not in str(err.value)  # one line


# ---- T14: mask-less samples through FailureMiningCallback inside a real trainer ---------------


class _UserSamples(Dataset):
    """A user's dataset: dict samples whose mask is under a key the default hooks do not know
    (``seg``), or that have no mask at all (``image-only``)."""

    def __init__(self, layout: str, n: int = 12, size: int = 32):
        g = torch.Generator().manual_seed(0)
        self.layout, self.x = layout, torch.rand(n, 3, size, size, generator=g)
        self.m = (self.x[:, :1] > 0.5).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i]} if self.layout == "image-only" else {"image": self.x[i], "seg": self.m[i]}


class _UserNet(L.LightningModule):
    """Counts its training steps: the refusal must come before the first one."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)
        self.steps = 0

    def forward(self, x):
        return self.conv(x)

    def _loss(self, b):
        out = self(b["image"])
        return (
            out.square().mean()
            if "seg" not in b
            else torch.nn.functional.cross_entropy(out, b["seg"][:, 0].long())
        )

    def training_step(self, b, _):
        self.steps += 1
        return self._loss(b)

    def validation_step(self, b, _):
        self.log("val_loss", self._loss(b))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _UserData(L.LightningDataModule):
    """Its own attribute names (``train_set``/``val_set``); the train loader goes through
    ``mining.wrap`` only when the mining callback replays."""

    def __init__(self, layout: str, mining: FailureMiningCallback):
        super().__init__()
        self.layout, self.mining = layout, mining

    def setup(self, stage=None):
        self.train_set, self.val_set = _UserSamples(self.layout), _UserSamples(self.layout, n=8)

    def train_dataloader(self):
        ds = self.mining.wrap(self.train_set) if self.mining.replay_ratio > 0 else self.train_set
        return DataLoader(ds, batch_size=4)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=4)


def _user_fit(
    run: Path, layout: str, replay: bool, model: _UserNet, hooks: BatchHooks | None = None, epochs: int = 1
) -> None:
    """A real ``trainer.fit`` of ``model`` with MetamorphicCallback + FailureMiningCallback."""
    L.seed_everything(0)
    mining = FailureMiningCallback(
        dirpath=run,
        train_probe_size=4,
        replay_ratio=0.5 if replay else 0.0,
        train_dataset=None if replay else _UserSamples(layout),
    )
    mr = MetamorphicCallback(
        suite=MRSuite(["contrast"], (5,)),
        dirpath=run,
        verbose=False,
        **({"hooks": hooks} if hooks is not None else {}),
    )
    trainer = quiet_trainer(
        max_epochs=epochs, callbacks=[mr, mining], default_root_dir=run, num_sanity_val_steps=0
    )
    trainer.fit(model, datamodule=_UserData(layout, mining))


@pytest.mark.slow
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "record-only"])
@pytest.mark.parametrize("layout", ["mask-under-seg", "image-only"])
def test_maskless_samples_are_refused_by_failure_mining_before_training(tmp_path, layout, replay):
    """``replay``: the train loader reads ``mining.wrap(train_set)``; ``record-only``: replay_ratio=0
    and ``train_dataset=`` (nothing wrapped). The datamodule has no ``val_dataset`` attribute, so the
    MR callback cannot check the validation samples at setup: the mining callback's check is what
    stops the fit. Before the fix, record-only trained a whole epoch and then failed in the MR check."""
    model = _UserNet()
    with pytest.raises(
        HookError,
        match=r"cannot find masks in the batch .*got a dict with keys \[.*'image'.*\]\); "
        r"pass MetamorphicCallback\(hooks=BatchHooks\(get_masks=\.\.\.\)\)",
    ) as err:
        _user_fit(tmp_path / "run", layout, replay, model)
    assert "\n" not in str(err.value)  # one line
    assert model.steps == 0  # refused before the first training step
    assert not (tmp_path / "run" / "failures" / "failures.jsonl").exists()
    assert not (tmp_path / "run" / "history.csv").exists()


@pytest.mark.slow
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "record-only"])
def test_the_get_masks_hook_the_refusal_names_makes_the_same_project_train(tmp_path, replay):
    """Control for the refusal above: with the hook it names (``get_masks=``) the same samples train
    (2 epochs, 3 steps each) and the MR check reads the train probe (``split == 'train'`` rows)."""
    model = _UserNet()
    _user_fit(
        tmp_path / "run",
        "mask-under-seg",
        replay,
        model,
        hooks=BatchHooks(get_masks=lambda b: b["seg"]),
        epochs=2,
    )
    assert model.steps == 6
    efr = pd.read_csv(tmp_path / "run" / "efr.csv")
    assert set(efr["split"]) == {"val", "train"}
    assert set(efr.loc[efr["split"] == "train", "suite_cases"]) == {4}  # train_probe_size cases read
