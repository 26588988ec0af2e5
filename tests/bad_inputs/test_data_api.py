"""Bad inputs at the API level (issue 10, data/numbers half): each scenario asserts the exact outcome.

Either a specific exception whose message names the file / key / value and what was expected, or
the correct result (e.g. a 0/1 PNG mask gives the right non-empty mask and the right Dice).
Real files in tmp_path, real Albumentations, real PyOD, real Lightning trainers (tiny).
"""
from __future__ import annotations

import json
import re

import cv2
import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from robusttrain import perturbations as P
from robusttrain.callbacks import BalancedCheckpoint, MetamorphicCallback
from robusttrain.metamorphic.batch import BatchHooks, iter_probe
from robusttrain.metamorphic.outputs import NonFiniteOutputError, ProbabilityOutputError
from robusttrain.metamorphic.runner import run_probe
from robusttrain.metamorphic.suite import MRSuite


# ----------------------------------------------------------------------------- tiny real training
class Blobs(Dataset):
    """A bright square (foreground) on a dark background; ``ids`` overrides the case ids."""

    def __init__(self, n=8, size=24, ids=None, nan_at=None):
        g = torch.Generator().manual_seed(0)
        self.x = 0.1 + 0.2 * torch.rand(n, 3, size, size, generator=g)
        self.m = torch.zeros(n, size, size, dtype=torch.long)
        for i in range(n):
            r = 2 + i % 6
            self.x[i, :, r:r + 8, r:r + 8] = 0.9
            self.m[i, r:r + 8, r:r + 8] = 1
        if nan_at is not None:
            self.x[nan_at, 1, 3, 3] = float("nan")
        self.ids = ids if ids is not None else [f"c{i}" for i in range(n)]

    def __len__(self):
        return len(self.x)

    def case_ids(self):
        return list(self.ids)

    def __getitem__(self, i):
        return {"image": self.x[i], "mask": self.m[i], "case_id": self.ids[i], "slice_index": 0}


class Net(L.LightningModule):
    """``mode``: "logits" (2-channel logits), "probs" (softmax already applied), "nan" (NaN logits)."""

    def __init__(self, mode="logits"):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 2, 1)
        with torch.no_grad():  # a "bright pixel" detector: correct from the first epoch
            self.conv.weight.zero_()
            self.conv.weight[1] += 10.0
            self.conv.bias.copy_(torch.tensor([0.0, -15.0]))
        self.mode = mode

    def forward(self, x):
        z = self.conv(x)
        if self.mode == "nan":
            return z * float("nan")
        return torch.softmax(z, 1) if self.mode == "probs" else z

    def training_step(self, b, i):
        return torch.nn.functional.cross_entropy(self.conv(b["image"]), b["mask"]) * 0.0

    def validation_step(self, b, i):
        self.log("val/loss", torch.nn.functional.cross_entropy(self.conv(b["image"]), b["mask"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(tmp_path, model, ds, callbacks, epochs=1):
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, accelerator="cpu",
                        devices=1, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4))
    return trainer


def _mr(tmp_path, **kw):
    return MetamorphicCallback(perturbations=["contrast"], severities=(2,), dirpath=str(tmp_path),
                               verbose=False, **kw)


# ----------------------------------------------------------------------------- model outputs
def test_nan_logits_stop_the_check_naming_epoch_and_split_and_no_checkpoint(tmp_path):
    with pytest.raises(NonFiniteOutputError, match=r"contain NaN or inf at epoch 0 on the 'val' probe"):
        _fit(tmp_path, Net("nan"), Blobs(), [_mr(tmp_path), BalancedCheckpoint(dirpath=str(tmp_path))])
    assert not (tmp_path / "balanced.ckpt").exists() and not (tmp_path / "efr.csv").exists()


def test_nan_logits_stop_a_standalone_balanced_checkpoint(tmp_path):
    with pytest.raises(NonFiniteOutputError, match=r"model outputs \(logits\) contain NaN or inf at epoch 0"):
        _fit(tmp_path, Net("nan"), Blobs(), [BalancedCheckpoint(dirpath=str(tmp_path))])
    assert not (tmp_path / "balanced.ckpt").exists() and not (tmp_path / "corner_cases.json").exists()


def test_inf_probabilities_from_a_custom_converter_name_the_cases(tmp_path):
    suite = MRSuite(["contrast"], (2,))
    ds = Blobs(4)
    predict = lambda x: torch.full((x.shape[0], 2, *x.shape[2:]), float("inf"))
    with pytest.raises(NonFiniteOutputError, match=r"at epoch 3 on the 'train' probe \(cases \['c0', 'c1'\]\)"):
        run_probe(predict, iter_probe(ds, [0, 1], 2, BatchHooks()), suite, "train", epoch=3)


def test_probabilities_passed_as_logits_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ProbabilityOutputError, match=r"look like probabilities already \(2 channels.*"
                                                     r"channels sum to 1.*to_probabilities='identity'"):
        _fit(tmp_path, Net("probs"), Blobs(), [_mr(tmp_path)])


def test_sigmoid_outputs_one_channel_are_refused():
    conv = MetamorphicCallback(verbose=False).to_probabilities
    with pytest.raises(ProbabilityOutputError, match=r"1 channel, values in \[0\.1, 0\.9\].*sigmoid would be applied"):
        conv(torch.tensor([0.1, 0.9, 0.5, 0.3]).view(1, 1, 2, 2))


def test_identity_opt_out_gives_the_same_scores_as_logits(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _fit(a, Net("logits"), Blobs(), [_mr(a)])
    _fit(b, Net("probs"), Blobs(), [_mr(b, to_probabilities="identity")])
    ha, hb = pd.read_csv(a / "history.csv"), pd.read_csv(b / "history.csv")
    assert ha["dice_fg"].min() == 1.0  # the detector is exact: Dice 1 for every case
    pd.testing.assert_frame_equal(ha, hb)


def test_bad_to_probabilities_value_fails_at_construction():
    with pytest.raises(ValueError, match=r"to_probabilities='softmaxx': expected one of \('auto', 'logits', 'identity'\)"):
        MetamorphicCallback(to_probabilities="softmaxx")


def test_identity_on_logits_is_refused():
    conv = MetamorphicCallback(to_probabilities="identity", verbose=False).to_probabilities
    with pytest.raises(ProbabilityOutputError, match=r"outputs lie in \[-3, 4\], not \[0,1\]"):
        conv(torch.tensor([-3.0, 4.0]).view(1, 2, 1, 1))


# ----------------------------------------------------------------------------- case ids, images
def test_integer_case_ids_are_plain_strings_in_history_and_corner_cases(tmp_path):
    ids = [1000 + i for i in range(8)]
    _fit(tmp_path, Net("logits"), Blobs(ids=ids), [_mr(tmp_path), BalancedCheckpoint(dirpath=str(tmp_path))])
    h = pd.read_csv(tmp_path / "history.csv", dtype={"case_id": str})
    assert sorted(h["case_id"]) == [str(i) for i in ids]
    text = (tmp_path / "mr_cases.csv").read_text() + (tmp_path / "corner_cases.json").read_text()
    assert "tensor" not in text and "1007" in text


def test_integer_case_ids_in_a_standalone_balanced_checkpoint(tmp_path):
    _fit(tmp_path, Net("logits"), Blobs(ids=[7, 7, 8, 8, 9, 9, 10, 10]), [BalancedCheckpoint(dirpath=str(tmp_path))])
    h = pd.read_csv(tmp_path / "balanced_history.csv", dtype={"case_id": str})
    assert sorted(set(h["case_id"])) == ["10", "7", "8", "9"]


def test_nan_pixels_in_the_probe_are_refused_naming_the_case(tmp_path):
    with pytest.raises(ValueError, match=r"probe images of case\(s\) \['c5'\] contain NaN or inf"):
        _fit(tmp_path, Net("logits"), Blobs(nan_at=5), [_mr(tmp_path)])


@pytest.mark.parametrize("name", ["blur", "contrast", "specularity"])
def test_nan_pixels_are_refused_by_every_perturbation_path(name):
    op = P.get(name, severity=2)
    x = torch.rand(3, 3, 16, 16)
    x[2, 0, 4, 4] = float("nan")
    with pytest.raises(ValueError, match=rf"{name}: images contain NaN or inf \(batch index \[2\]\)"):
        op.apply_batch(x)
    img = np.random.default_rng(0).random((16, 16, 3)).astype(np.float32)
    img[1, 1, 1] = np.inf
    with pytest.raises(ValueError, match=rf"{name}: image contains NaN or inf"):
        op.apply_numpy(img)
