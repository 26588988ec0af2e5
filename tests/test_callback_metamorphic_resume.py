"""Resume: a run stopped after epoch k and resumed from last.ckpt writes the same files."""
import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from robusttrain.callbacks import MetamorphicCallback
from test_callback_metamorphic import COLOUR, Blobs, Tiny

FILES = ("history.csv", "efr.csv", "mr_cases.csv")


def _run(root, epochs, ckpt=None):
    cb = MetamorphicCallback(COLOUR, severities=(2, 4), dirpath=root, seed=5, train_probe_size=2, verbose=False)
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[cb, ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)],
                        accelerator="cpu", devices=1, deterministic=True)
    ds = Blobs(n=8)
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
