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
    blocks = section_blocks()
    assert len(blocks) == 2 and "mining.wrap(self.train_set)" in blocks[1]
    L, Net, Data = make("lightning.pytorch")

    ns: dict = {}
    exec(textwrap.dedent(blocks[1]), {"DataLoader": DataLoader}, ns)  # the README's method, as written

    class MyDataModule(Data):
        train_dataloader = ns["train_dataloader"]

    code = blocks[0].replace("max_epochs=20", "max_epochs=2, enable_progress_bar=False, logger=False")
    code = code.replace("train_probe_size=32", "train_probe_size=8")
    monkeypatch.chdir(tmp_path)
    L.seed_everything(0, workers=True)
    scope = {"my_model": Net(), "MyDataModule": MyDataModule}
    exec(compile(code, "README.md", "exec"), scope)
    run = tmp_path / "runs" / "mine"
    for name in (
        "history.csv",
        "efr.csv",
        "mr_cases.csv",
        "corner_cases.json",
        "balanced.ckpt",
        "failures/failures.jsonl",
        "failures/mining.csv",
    ):
        assert (run / name).is_file(), name
    assert scope["mining"].replay is not None  # the datamodule's loader read the wrapper


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
