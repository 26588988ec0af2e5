"""Resume: a run stopped after epoch k and resumed from last.ckpt writes the same files."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from toys import COLOUR, Blobs, Tiny, quiet_trainer

from robusttrain.callbacks import MetamorphicCallback, RobustnessContext
from robusttrain.callbacks.context import TrainProbe
from robusttrain.metamorphic.suite import MRSuite

FILES = ("history.csv", "efr.csv", "mr_cases.csv")


def _run(root, epochs, ckpt=None, severities=(2, 4)):
    ds = Blobs(n=8)
    ctx = RobustnessContext(train_probe=TrainProbe(ds, size=2))
    cb = MetamorphicCallback(
        suite=MRSuite(COLOUR, severities, seed=5), dirpath=root, verbose=False, context=ctx
    )
    trainer = quiet_trainer(
        max_epochs=epochs,
        callbacks=[cb, ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)],
        deterministic=True,
        enable_checkpointing=True,
    )
    trainer.fit(Tiny(lr=0.5), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4), ckpt_path=ckpt)
    return cb


def test_resume_from_last_ckpt_gives_identical_files(tmp_path):
    _run(tmp_path / "full", 3)
    _run(tmp_path / "cut", 2)
    state = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=True)  # plain state
    assert any(k.startswith("MetamorphicCallback") for k in state["callbacks"])
    resumed = _run(tmp_path / "cut", 3, ckpt=tmp_path / "cut" / "checkpoints" / "last.ckpt")
    assert sorted(set(resumed.history.epoch)) == [0, 1, 2]
    for f in FILES:
        assert (tmp_path / "cut" / f).read_text() == (tmp_path / "full" / f).read_text(), f
    # epochs 0-1 come only from the checkpointed state (the resumed process never ran them)
    for frame in (resumed.history, resumed.efr, resumed.cases):
        assert sorted(set(frame.epoch)) == [0, 1, 2]
    assert set(resumed.efr.split) == {"val", "train"}


def test_resume_with_a_changed_suite_is_refused_and_keeps_the_files(tmp_path):
    _run(tmp_path, 1)
    before = (tmp_path / "history.csv").read_text()
    with pytest.raises(
        ValueError, match=r"cannot resume: the checkpoint's metamorphic suite .*severities=\[2, 4\]"
    ):
        _run(tmp_path, 2, ckpt=tmp_path / "checkpoints" / "last.ckpt", severities=(4,))
    assert (tmp_path / "history.csv").read_text() == before  # earlier epochs not dropped
