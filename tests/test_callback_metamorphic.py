"""MetamorphicCallback on real Lightning trainers (tiny model, tiny synthetic data, real perturbations)."""

import csv

import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader
from toys import COLOUR, Blobs, Tiny, fit, quiet_trainer

from robusttrain.callbacks import MetamorphicCallback, RobustnessContext
from robusttrain.callbacks.context import TrainProbe
from robusttrain.metamorphic.batch import BatchHooks, HookError
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.metamorphic.suite import MRSuite


def mr(perturbations, severities, **kw):
    return MetamorphicCallback(suite=MRSuite(perturbations, severities), **kw)


def test_fit_writes_files_logs_keys_and_volume_history(tmp_path):
    got = []
    ctx = RobustnessContext()  # violations reach whoever subscribes to the shared context
    ctx.subscribe(lambda r, im: got.append((r, im)))
    ctx.subscribe(lambda r, im: None)
    cb = mr(COLOUR, (2, 4), dirpath=tmp_path / "run", class_names=["polyp"], context=ctx)
    trainer = fit(tmp_path, cb, epochs=2)
    run = tmp_path / "run"
    hist = pd.read_csv(run / "history.csv")
    assert list(hist.columns) == ["case_id", "epoch", "dice_polyp", "iou_polyp"]
    assert hist.groupby("epoch").size().tolist() == [4, 4] and set(hist.case_id) == {"p0", "p1", "p2", "p3"}
    efr = pd.read_csv(run / "efr.csv")
    header = (  # efr.csv's columns spelled out here (a file format: it changes only on purpose)
        "epoch split perturbation severity metric threshold errors cases efr efr_low efr_high suite_cases "
        "heldout mean_src_dice mean_fol_dice worst_family worst_family_dice final basis from_epoch"
    )
    assert list(efr.columns) == header.split()
    assert set(efr.basis) == {"suite"} and (efr.from_epoch == efr.epoch).all()  # each check's own weights
    assert set(efr.split) == {"val"} and set(efr.perturbation) == set(COLOUR) | {"all"}
    pooled = efr[(efr.perturbation == "all") & (efr.epoch == 1)]
    assert set(pooled.cases) == {4 * 6}  # one test case per (case, perturbation, severity)
    assert set(pooled.suite_cases) == {4 * 6} and not efr.final.any()  # budget=None: every check is whole
    assert ((efr.efr_low <= efr.efr) & (efr.efr <= efr.efr_high)).all()
    cases = pd.read_csv(run / "mr_cases.csv")
    assert len(cases) == 2 * 4 * 6 and {"case_id", "src_dice", "fol_dice", "consistency", "seed"} <= set(
        cases
    )
    # in-memory tables equal the files
    pd.testing.assert_frame_equal(cb.history.reset_index(drop=True), hist, check_dtype=False)
    # logged through the trainer's logger
    with open(f"{trainer.logger.log_dir}/metrics.csv") as fh:
        header = next(csv.reader(fh))
    assert "mr/efr/all/dice@0.25" in header and "mr/efr/contrast/iou@0.5" in header
    # every violation reaches the sink; the worst ones come with thumbnails
    bad = cases[cases.drop_dice > 0.25]
    assert len(got) == len(bad) > 0
    rec, imgs = got[0]
    assert isinstance(rec, FailureRecord) and rec.split == "val" and rec.index >= 0 and rec.params
    assert rec.drop > 0.25 and len(rec.extra["slices"]) == 2
    assert imgs["source"].shape == (24, 24, 3) and imgs["gt"].shape == (24, 24)
    assert imgs["source"].dtype.name == "uint8" and imgs["pred_followup"].dtype.name == "uint8"


def test_heldout_families_are_tested_labelled_and_published_to_the_context(tmp_path):
    got = []
    ctx = RobustnessContext()
    ctx.subscribe(lambda r, im: got.append(r))
    # the toy model breaks under contrast (every case drops), not under saturation
    cb = mr(["saturation"], (2,), heldout=["contrast"], dirpath=tmp_path / "run", verbose=False, context=ctx)
    assert cb.suite.names == ["saturation", "contrast"]  # a test-only family joins the suite
    trainer = fit(tmp_path, cb, epochs=1)
    assert trainer.robusttrain_context.heldout_families == frozenset({"contrast"})
    efr = pd.read_csv(tmp_path / "run" / "efr.csv")
    assert efr.groupby("perturbation").heldout.agg(set).to_dict() == {
        "all": {False},
        "contrast": {True},
        "saturation": {False},
    }
    cases = pd.read_csv(tmp_path / "run" / "mr_cases.csv")
    every = efr[efr.perturbation == "all"].iloc[0]
    assert every.mean_fol_dice == pytest.approx(cases.fol_dice.mean())
    assert every.mean_src_dice == pytest.approx(cases.src_dice.mean())
    by_family = cases.groupby("perturbation").fol_dice.mean()
    assert every.worst_family == by_family.idxmin() == "contrast"
    assert every.worst_family_dice == pytest.approx(by_family.min())
    held = efr[(efr.perturbation == "contrast") & (efr.severity == 0)]
    assert held.mean_fol_dice.tolist() == pytest.approx([by_family["contrast"]] * len(held))
    # its violations are in the tables but never reach a sink (failure mining would train on them)
    bad = cases[cases.drop_dice > 0.25]
    assert len(bad) == 4 and set(bad.perturbation) == {"contrast"}
    assert got == []
    logged = pd.read_csv(f"{trainer.logger.log_dir}/metrics.csv")
    assert logged["mr/perturbed_dice/heldout"].dropna().tolist() == pytest.approx([by_family["contrast"]])
    assert logged["mr/perturbed_dice/trained"].dropna().tolist() == pytest.approx([by_family["saturation"]])


def test_same_follow_ups_every_epoch(tmp_path):
    cb = mr(COLOUR, (2,), dirpath=tmp_path)
    # lr=0: identical model every epoch, so identical follow-ups must give identical scores
    fit(tmp_path, cb, epochs=2, model=Tiny(lr=0.0))
    c = cb.cases
    a, b = (c[c.epoch == e].drop(columns="epoch").reset_index(drop=True) for e in (0, 1))
    pd.testing.assert_frame_equal(a, b)
    assert a.fol_dice.ne(a.src_dice).any()  # the perturbations did change predictions


def test_rng_and_train_mode_restored(tmp_path):
    states = {}

    class Before(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            states["before"] = (torch.rand(1).item(), pl_module.training)
            torch.manual_seed(123)  # known state right before the check

    class After(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            states["after"] = (torch.rand(1).item(), pl_module.training)

    cb = mr(["contrast"], (2,), dirpath=tmp_path)
    trainer = quiet_trainer(max_epochs=1, callbacks=[Before(), cb, After()])
    ds = Blobs()
    trainer.fit(Tiny(), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4))
    torch.manual_seed(123)
    assert states["after"] == (torch.rand(1).item(), False)


def test_tuple_batches_sigmoid_model_and_derived_case_ids(tmp_path):
    ds = Blobs(n=6, tuples=True)
    ds.case_ids = None  # no cheap case ids either: every index is its own case
    cb = mr(["contrast"], (4,), dirpath=tmp_path, max_cases=4)
    fit(tmp_path, cb, epochs=1, model=Tiny(out=1), ds=ds)
    hist = pd.read_csv(tmp_path / "history.csv")
    assert list(hist.columns) == ["case_id", "epoch", "dice_fg", "iou_fg"]
    assert len(hist) == 4 and all(c.startswith("idx") for c in hist.case_id)
    # the seeded probe subset is the same in a fresh callback
    cb2 = mr(["contrast"], (4,), dirpath=tmp_path / "b", max_cases=4)
    fit(tmp_path, cb2, epochs=1, model=Tiny(out=1), ds=ds)
    assert list(pd.read_csv(tmp_path / "b" / "history.csv").case_id) == list(hist.case_id)


def test_unreadable_batches_name_the_hook(tmp_path):
    class Odd(Blobs):
        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.m[i]}

    class OddTiny(Tiny):
        def _xy(self, b):
            return b["x"], b["y"]

    with pytest.raises(HookError, match="get_images="):
        fit(tmp_path, mr(["contrast"], (2,), dirpath=tmp_path), 1, OddTiny(), Odd())
    cb = mr(
        ["contrast"],
        (2,),
        dirpath=tmp_path,
        hooks=BatchHooks(get_images=lambda b: b["x"], get_masks=lambda b: b["y"]),
    )
    fit(tmp_path, cb, 1, OddTiny(), Odd())
    assert len(cb.history) == 8  # no case ids: one case per index


def test_train_probe_goes_to_sink_as_train_and_stays_out_of_val_rows(tmp_path):
    got = []
    ds = Blobs(n=8, slices=1)
    ctx = RobustnessContext(train_probe=TrainProbe(ds, size=2, every_n_epochs=2))
    ctx.subscribe(lambda r, im: got.append(r))
    cb = mr(COLOUR, (4,), dirpath=tmp_path, every_n_epochs=1, context=ctx)
    fit(tmp_path, cb, epochs=2, ds=ds)
    efr = pd.read_csv(tmp_path / "efr.csv")
    assert set(efr[efr.split == "train"].epoch) == {1}  # mine_every_n_epochs=2
    assert set(efr[(efr.split == "train") & (efr.perturbation == "all")].cases) == {2 * 3}
    assert set(efr[(efr.split == "val") & (efr.perturbation == "all")].cases) == {8 * 3}
    hist = pd.read_csv(tmp_path / "history.csv")
    assert hist.groupby("epoch").size().tolist() == [8, 8]  # train probe never in the history
    splits = {r.split for r in got}
    assert splits <= {"train", "val"} and "train" in splits
    train_cases = set(cb.cases[cb.cases.split == "train"].case_id)
    assert {r.case_id for r in got if r.split == "train"} <= train_cases and len(train_cases) == 2


class NoisyBlobs(Blobs):
    """Blobs whose __getitem__ draws noise from the global RNG: only a seeded check state replays it."""

    def __getitem__(self, i):
        s = dict(super().__getitem__(i))
        s["image"] = (s["image"] + 0.05 * torch.rand(s["image"].shape)).clamp(0, 1)
        return s


@pytest.mark.slow
def test_audit_reproduces_the_training_time_check_exactly(tmp_path):
    """`check` / audit() and the MetamorphicCallback are one library call: same subset, state, numbers."""
    from robusttrain.metamorphic.audit import audit

    val = NoisyBlobs(8, slices=1, seed=1)
    suite_args = (COLOUR + ["blur"], (2, 4))
    cb = MetamorphicCallback(
        suite=MRSuite(*suite_args, seed=3),
        max_cases=5,
        dirpath=tmp_path,
        verbose=False,
        class_names=["polyp"],
    )
    model = Tiny()
    trainer = quiet_trainer(max_epochs=2, callbacks=[cb])
    trainer.fit(model, DataLoader(Blobs(8, slices=1), batch_size=4), DataLoader(val, batch_size=4))
    trained = pd.read_csv(tmp_path / "mr_cases.csv")
    trained = trained[trained.epoch == 1].sort_values(["case_id", "perturbation", "severity"])
    out = audit(model, {"val": val}, MRSuite(*suite_args, seed=3), max_cases=5, class_names=["polyp"])
    audited = out["cases"].sort_values(["case_id", "perturbation", "severity"])
    assert len(trained) == len(audited) == 5 * 8 and trained.case_id.nunique() == 5
    for col in ("case_id", "perturbation", "severity"):
        assert trained[col].tolist() == audited[col].tolist()
    for col in ("src_dice", "fol_dice", "src_iou", "fol_iou"):
        assert np.allclose(trained[col].to_numpy(float), audited[col].to_numpy(float), atol=0, rtol=0), col
    efr = pd.read_csv(tmp_path / "efr.csv")
    efr = efr[(efr.epoch == 1) & (efr.severity == 0)].set_index(["perturbation", "metric", "threshold"]).efr
    mine = out["efr"][out["efr"].severity == 0].set_index(["perturbation", "metric", "threshold"]).efr
    assert np.array_equal(efr.sort_index().to_numpy(), mine.sort_index().to_numpy())


@pytest.mark.slow
def test_a_degenerate_model_is_told_its_numbers_mean_nothing(tmp_path):
    class Background(Tiny):  # predicts background everywhere: clean Dice 0, "EFR 0 %" would mean nothing
        def forward(self, x):
            out = super().forward(x)
            return torch.stack([out[:, 0] * 0 + 10.0, out[:, 1] * 0 - 10.0], 1)

    cb = MetamorphicCallback(
        suite=MRSuite(COLOUR, (2,)), dirpath=tmp_path, verbose=False, class_names=["polyp"]
    )
    trainer = quiet_trainer(max_epochs=2, callbacks=[cb])
    with pytest.warns(
        UserWarning, match=r"clean Dice is 0\.000: the model segments \(almost\) nothing"
    ) as rec:
        trainer.fit(
            Background(),
            DataLoader(Blobs(4, slices=1), batch_size=4),
            DataLoader(Blobs(4, slices=1), batch_size=4),
        )
    assert sum("segments (almost) nothing" in str(w.message) for w in rec) == 1  # said once, not every epoch
