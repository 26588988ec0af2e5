"""README's "Use it on your own Lightning trainer" section, run as written on a user-style project
(tests/user_project.py: tuple batches, its own datamodule whose train_dataloader wraps with mining)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader
from user_project import make

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[1] / "README.md"


def section_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("## Use it on your own Lightning trainer")
    section = text[start : text.index("\n## ", start + 3)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_example_runs_on_a_user_project(tmp_path, monkeypatch):
    """The first example is the recipes' default set (issue 47: one default for the README, robustness()
    and the recipes): the check, random augmentation, the balanced checkpoint and average, the reporter."""
    blocks = section_blocks()
    assert len(blocks) == 2 and "mining.wrap(self.train_set)" in blocks[1]  # the second: the frozen replay's
    L, Net, Data = make("lightning.pytorch")
    code = blocks[0].replace("max_epochs=20", "max_epochs=2, enable_progress_bar=False, logger=False")
    monkeypatch.chdir(tmp_path)
    L.seed_everything(0, workers=True)
    scope = {"my_model": Net(), "MyDataModule": Data}
    exec(compile(code, "README.md", "exec"), scope)
    run = tmp_path / "runs" / "mine"
    for name in (
        "history.csv",
        "efr.csv",
        "mr_cases.csv",
        "corner_cases.json",
        "balanced.ckpt",
        "balanced_average.ckpt",
        "metamorphic_training.csv",
    ):
        assert (run / name).is_file(), name
    stats = pd.read_csv(run / "metamorphic_training.csv")
    assert set(stats.family[stats.chosen > 0]) <= {"blur", "contrast"} and stats.chosen.sum() > 0
    assert not (run / "failures").exists()  # no mining in this example (robustness(): on request)


def test_readme_replay_wrapper_runs_as_written(tmp_path, monkeypatch):
    """The frozen replay's one datamodule line, as the README gives it, feeds mined failures to training."""
    from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
    from robusttrain.metamorphic.suite import MRSuite

    ns: dict = {}
    exec(textwrap.dedent(section_blocks()[1]), {"DataLoader": DataLoader}, ns)  # the README's method
    L, Net, Data = make("lightning.pytorch")

    class MyDataModule(Data):
        train_dataloader = ns["train_dataloader"]

    monkeypatch.chdir(tmp_path)
    L.seed_everything(0, workers=True)
    mining = FailureMiningCallback(replay_ratio=0.2, train_probe_size=8)
    check = MetamorphicCallback(suite=MRSuite(["blur", "contrast"], severities=(2, 4)), verbose=False)
    trainer = L.Trainer(
        max_epochs=2, callbacks=[check, mining], default_root_dir="runs/replay", enable_progress_bar=False,
        logger=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(Net(), datamodule=MyDataModule(mining=mining))
    assert mining.replay is not None  # the datamodule's loader read the wrapper
    assert (tmp_path / "runs" / "replay" / "failures" / "mining.csv").is_file()


def test_readme_robustness_is_the_recipes_default_set():
    from omegaconf import OmegaConf

    from robusttrain.callbacks import robustness

    recipes = Path(__file__).resolve().parents[1] / "robusttrain" / "recipes" / "callbacks"
    on = set()
    for path in recipes.glob("*.yaml"):
        node = OmegaConf.load(path)
        (name,) = [k for k in node if k != "defaults"] or [None]
        if name is not None and name != "checkpoint" and node[name].get("enabled", True):
            on.add(name)
    names = {
        "MetamorphicCallback": "metamorphic", "MetamorphicTraining": "metamorphic_training",
        "BalancedCheckpoint": "balanced", "BalancedAverage": "balanced_average",
        "RobustnessReporter": "reporting", "FailureMiningCallback": "mining", "EMACheckpoint": "ema",
    }  # fmt: skip
    default = {names[type(c).__name__] for c in robustness(perturbations=["blur"])}
    # mining v2 is on in the recipes and on request in robustness(): it must find the user's training set
    assert "mining" not in default and default | {"mining"} == on
    assert {names[type(c).__name__] for c in robustness(perturbations=["blur"], mining=True)} == on
    code = section_blocks()[0]
    assert {n for n in names if f"{n}(" in code} == {
        type(c).__name__ for c in robustness(perturbations=["blur"])
    }


def test_readme_metamorphic_training_examples_run_on_a_user_project(tmp_path, monkeypatch):
    text = README.read_text()
    start = text.index("## Train on what the check finds")
    blocks = re.findall(r"```python\n(.*?)```", text[start : text.index("\n## ", start + 3)], flags=re.S)
    assert len(blocks) == 3 and "metamorphic_forward(self, images)" in blocks[1]
    L, Net, Data = make("lightning.pytorch")

    class MyModel(Net):
        def loss_fn(self, logits, masks):  # the user's own loss on the user's own mask format
            return torch.nn.functional.cross_entropy(logits, masks[:, 0].round().long())

    monkeypatch.chdir(tmp_path)
    scope = {"MyModel": MyModel, "MyDataModule": Data, "L": L}
    for block in blocks:  # in order: the third block reuses the second's model class
        code = block.replace("max_epochs=20", "max_epochs=2, enable_progress_bar=False, logger=False")
        L.seed_everything(0, workers=True)
        exec(compile(code, "README.md", "exec"), scope)
    for name in ("random", "hard", "augmix"):
        run = tmp_path / "runs" / name
        assert (run / "metamorphic_training.csv").is_file(), name
        stats = pd.read_csv(run / "metamorphic_training.csv")
        assert set(stats.epoch) == {0, 1} and stats.chosen.sum() == 2 * 4 * 2, name  # 2 epochs x 4 steps x 2
    # the AugMix run trained on chain mixes, and says so per epoch
    aug = pd.read_csv(tmp_path / "runs" / "augmix" / "metamorphic_training.csv")
    assert aug.loc[aug.family == "augmix", "chosen"].sum() == 2 * 4 * 2
    assert (tmp_path / "runs" / "hard" / "efr.csv").is_file()
