"""The budgeted check's final EFR table from a complete-coverage rotation, and its clean pass reusing the
validation loop's forwards: same numbers as before, fewer forwards."""

import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader
from toys import COLOUR, Blobs, Tiny, quiet_trainer

from robusttrain.callbacks import MetamorphicCallback
from robusttrain.metamorphic.efr import efr_table, wilson_interval
from robusttrain.metamorphic.reuse import ValidationOutputs
from robusttrain.metamorphic.rotation import PAIR, latest_scores
from robusttrain.metamorphic.suite import MRSuite

FILES = ("history.csv", "efr.csv", "mr_cases.csv")
N_PAIRS = 4 * 6  # 4 cases (8 samples, 2 slices each) x 3 families x 2 severities


class Crash(L.Callback):
    """A kill after epoch ``epoch``'s checkpoint (last.ckpt is written at its validation end)."""

    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch + 1:
            raise RuntimeError("killed")


class Counting(Tiny):
    """Tiny that counts the samples it forwards in eval mode (validation, checks, failure strips)."""

    n_eval = 0

    def forward(self, x):
        if not self.training:
            Counting.n_eval += len(x)
        return super().forward(x)


def _fit(root, epochs=4, ckpt=None, extra=(), model=None, **kw):
    ds = Blobs(n=8)
    cb = MetamorphicCallback(
        suite=MRSuite(COLOUR, (2, 4), seed=5),
        dirpath=root,
        verbose=False,
        budget=0.5,
        class_names=["polyp"],
        **kw,
    )
    trainer = quiet_trainer(
        max_epochs=epochs,
        logger=CSVLogger(root, name="logs"),
        deterministic=True,
        callbacks=[cb, ModelCheckpoint(dirpath=root / "checkpoints", save_last=True), *extra],
        enable_checkpointing=True,
    )
    trainer.fit(
        model or Tiny(lr=0.5), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4), ckpt_path=ckpt
    )
    return cb


def _logged(root, key):
    m = pd.read_csv(root / "logs" / "version_0" / "metrics.csv")
    return m[key].dropna().tolist()


@pytest.mark.slow
def test_final_table_covers_every_pair_exactly_once_with_its_wilson_interval(tmp_path):
    _fit(tmp_path, epochs=4)
    efr, cases = pd.read_csv(tmp_path / "efr.csv"), pd.read_csv(tmp_path / "mr_cases.csv")
    pooled = efr[(efr.perturbation == "all") & (efr.metric == "dice") & (efr.threshold == 0.25)].set_index(
        "epoch"
    )
    # epochs 0-2: budgeted subsets (one case per test), never final; the last check completes the rotation
    assert pooled.loc[[0, 1, 2], "cases"].tolist() == [6, 6, 6] and set(pooled.loc[[0, 1, 2], "basis"]) == {
        "subset"
    }
    assert not pooled.loc[[0, 1, 2], "final"].any()
    last = pooled.loc[3]
    assert last.final and last.basis == "rotation" and last.cases == last.suite_cases == N_PAIRS
    # every (case, perturbation, severity) pair scored exactly once over the run: no whole suite on top
    assert len(cases) == N_PAIRS and not cases.duplicated(PAIR).any()
    latest = latest_scores(cases)
    assert len(latest) == N_PAIRS and last.from_epoch == latest.epoch.min() == 0
    # the final rows are the EFR table of every pair's latest score, with its Wilson interval
    want = efr_table(latest, (0.25, 0.5), suite_cases=4)
    got = efr[efr.epoch == 3].reset_index(drop=True)
    for col in ("perturbation", "severity", "metric", "threshold", "errors", "cases", "suite_cases"):
        assert got[col].tolist() == want[col].tolist(), col
    assert np.allclose(
        got[["efr", "efr_low", "efr_high"]].to_numpy(float),
        want[["efr", "efr_low", "efr_high"]].to_numpy(float),
        equal_nan=True,
    )
    assert (last.efr_low, last.efr_high) == pytest.approx(wilson_interval(int(last.errors), N_PAIRS))
    assert set(efr[efr.epoch == 3].basis) == {"rotation"} and efr[efr.epoch == 3].final.all()


@pytest.mark.slow
def test_final_suite_option_keeps_the_whole_suite_on_the_final_weights(tmp_path):
    _fit(tmp_path, epochs=2, final="suite")
    efr, cases = pd.read_csv(tmp_path / "efr.csv"), pd.read_csv(tmp_path / "mr_cases.csv")
    last = efr[efr.epoch == 1]
    assert set(last.basis) == {"suite"} and last.final.all() and (last.from_epoch == 1).all()
    assert len(cases[cases.epoch == 1]) == N_PAIRS  # every pair re-scored at the end


@pytest.mark.slow
def test_resume_mid_rotation_equals_an_uninterrupted_run(tmp_path):
    _fit(tmp_path / "full", epochs=4)
    with pytest.raises(RuntimeError, match="killed"):
        _fit(tmp_path / "cut", epochs=4, extra=[Crash(1)])
    assert pd.read_csv(tmp_path / "cut" / "mr_cases.csv").epoch.max() == 1  # killed mid-rotation
    _fit(tmp_path / "cut", epochs=4, ckpt=tmp_path / "cut" / "checkpoints" / "last.ckpt")
    for f in FILES:
        assert (tmp_path / "cut" / f).read_bytes() == (tmp_path / "full" / f).read_bytes(), f


@pytest.mark.slow
def test_clean_pass_and_failure_strips_reuse_forwards_and_report_the_same(tmp_path, monkeypatch):
    runs = {}
    for name in ("reused", "forwarded"):
        if name == "forwarded":  # nothing known: every clean pass and failure strip forwards
            monkeypatch.setattr(ValidationOutputs, "lookup", lambda self, module, images: None)
        Counting.n_eval = 0
        cb = _fit(tmp_path / name, epochs=2, model=Counting(lr=0.5))
        runs[name] = (cb, Counting.n_eval)
    assert _logged(tmp_path / "reused", "mr/clean_reused") == [1.0, 1.0]  # no second clean forward
    assert _logged(tmp_path / "forwarded", "mr/clean_reused") == [0.0, 0.0]
    for f in FILES:
        assert (tmp_path / "reused" / f).read_bytes() == (tmp_path / "forwarded" / f).read_bytes(), f
    (cb, n_reused), (cb_fwd, n_fwd) = runs["reused"], runs["forwarded"]
    strips = [imgs for _, imgs in cb.last_failures if imgs]
    assert strips and len(strips) == len([1 for _, imgs in cb_fwd.last_failures if imgs])
    for got, want in zip(strips, [imgs for _, imgs in cb_fwd.last_failures if imgs]):
        for key in want:
            assert np.array_equal(got[key], want[key]), key
    # spared: the clean pass (8 samples x 2 checks) and both predictions of every failure strip
    assert n_fwd - n_reused >= 8 * 2 + 2 * len(strips)


def test_reuse_refuses_other_weights_other_inputs_and_train_mode():
    net = torch.nn.Conv2d(3, 2, 1)
    reuse = ValidationOutputs(lambda out: out.softmax(1))
    x = torch.rand(4, 3, 8, 8)
    reuse.attach(net)
    net(x)  # train mode: a forward of other statistics (dropout, batch norm) is never recorded
    assert reuse.lookup(net, x) is None
    net.eval()
    with torch.no_grad():
        want = net(x).argmax(1)
    got = reuse.lookup(net, x)
    assert got is not None and torch.equal(got[0], want) and got[1] == 2
    assert reuse.lookup(net, x + 1e-3) is None  # other bytes: not the same input
    reuse.detach()
    net(torch.rand(2, 3, 8, 8))  # detached: the check's own forwards are not recorded
    assert len(reuse.labels) == 4
    net.load_state_dict({k: v + 0 for k, v in net.state_dict().items()})  # same values, loaded: refused
    assert reuse.lookup(net, x) is None
