"""BalancedCheckpoint in real (tiny) Lightning fits: standalone Dice, a history provider, resume."""

import json

import lightning.pytorch as pl
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader
from toys import Classes, ClassNet, Snapshots, quiet_trainer

from robusttrain.callbacks.balanced_checkpoint import BalancedCheckpoint
from robusttrain.callbacks.context import context_for
from robusttrain.cornercases import select_balanced_epoch
from robusttrain.metamorphic.scoring import dice_from_sums, logits_sums

pytestmark = pytest.mark.slow


class PlantedHistory(pl.Callback):
    """A stand-in MetamorphicCallback: provides ``history`` with a planted collapse of ``bad`` through the
    shared context (the documented way for any history provider)."""

    def __init__(self, collapse_epoch):
        self.history = pd.DataFrame(columns=["case_id", "epoch"])
        self.collapse_epoch = collapse_epoch

    def setup(self, trainer, pl_module, stage):
        self.ctx = context_for(trainer)
        self.ctx.join("PlantedHistory", provides=("mr",))

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        e = trainer.current_epoch
        rows = [
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
        self.history = (
            pd.concat([self.history, pd.DataFrame(rows)], ignore_index=True)
            if len(self.history)
            else pd.DataFrame(rows)
        )
        self.ctx.history = self.history


def fit(tmp_path, callbacks, max_epochs, ckpt_path=None, n_cases=6):
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=max_epochs, callbacks=callbacks, default_root_dir=tmp_path, num_sanity_val_steps=1
    )
    model = ClassNet()
    trainer.fit(
        model,
        DataLoader(Classes(n_cases), batch_size=4, shuffle=True),
        DataLoader(Classes(n_cases, seed=1), batch_size=3),
        ckpt_path=ckpt_path,
    )
    return trainer, model


def test_sums_and_dice():
    logits = torch.zeros(1, 3, 2, 2)
    logits[0, 1, 0, :] = 5  # predict class 1 on the top row
    mask = torch.tensor([[[1, 0], [0, 0]]])
    s = logits_sums(logits, mask)[0]
    assert s[0].tolist() == [1, 2, 1] and s[1].tolist() == [0, 0, 0]
    assert dice_from_sums(s).tolist() == pytest.approx([2 / 3, 1.0])  # class 2 empty/empty → 1
    s1 = logits_sums(torch.full((1, 1, 2, 2), 3.0), torch.ones(1, 2, 2, dtype=torch.long))[0]
    assert s1[0].tolist() == [4, 4, 4]


class ValLoss(pl.Callback):
    """The epoch-level val/loss Lightning reduced, per fitting validation (independent of the callback)."""

    def __init__(self):
        self.losses: list[float] = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.losses.append(float(trainer.callback_metrics["val/loss"]))


def test_standalone_writes_files_and_chosen_weights(tmp_path):
    snap, losses = Snapshots(), ValLoss()
    cb = BalancedCheckpoint(dirpath=tmp_path, retention="all")
    fit(tmp_path, [cb, snap, losses], max_epochs=6)
    report = json.loads((tmp_path / "corner_cases.json").read_text())
    hist = pd.read_csv(tmp_path / "balanced_history.csv")
    assert sorted(hist["epoch"].unique()) == list(range(6)) and hist["case_id"].nunique() == 6
    assert {"dice_class1", "dice_class2", "dice_class3", "iou_class1"} <= set(hist.columns)
    assert (hist["iou_class1"] <= hist["dice_class1"] + 1e-9).all()
    chosen = report["balanced_epoch"]
    assert report["status"] == "ok" and report["policy"] == "last_inlier" and chosen in range(6)
    assert report["least_loss_epoch"] == cb.best_epoch() and report["checkpoint"] == "balanced.ckpt"
    assert len(losses.losses) == 6 and cb.best_epoch() == min(range(6), key=losses.losses.__getitem__)
    for key in ("least_loss", "balanced"):
        assert set(report["dice"][key]["per_case"]) == {f"case{i}" for i in range(6)}
        assert "mean" in report["dice"][key]["cohort"]
    ckpt = torch.load(tmp_path / "balanced.ckpt", weights_only=False)
    assert ckpt["epoch"] == chosen
    for k, v in snap.weights[chosen].items():
        assert torch.equal(ckpt["state_dict"][k], v)
    model = ClassNet.load_from_checkpoint(tmp_path / "balanced.ckpt")  # loads as a Lightning checkpoint
    assert torch.equal(model.net.weight, snap.weights[chosen]["net.weight"])


def test_history_provider_planted_collapse_and_pruning(tmp_path):
    cb = BalancedCheckpoint(
        dirpath=tmp_path, keep_candidates=True
    )  # retention auto: 10 cases, 8 epochs → last 2
    fit(tmp_path, [PlantedHistory(collapse_epoch=7), cb], max_epochs=8)
    report = json.loads((tmp_path / "corner_cases.json").read_text())
    assert [c["case_id"] for c in report["corner_cases"]] == ["bad"]
    assert report["outlier_epochs"] == {"bad": [7]}
    assert report["balanced_epoch"] == 6 and report["candidate_epochs"] == [6, 7]
    assert report["dice"]["balanced"]["per_case"]["bad"]["dice_lv"] == pytest.approx(0.3)
    assert sorted(p.name for p in (tmp_path / "balanced_candidates").iterdir()) == [
        "epoch=0006.ckpt",
        "epoch=0007.ckpt",
    ]
    assert not (tmp_path / "balanced_history.csv").exists()  # the provider owns the history
    assert torch.load(tmp_path / "balanced.ckpt", weights_only=False)["epoch"] == 6


def test_candidates_removed_after_the_fit_by_default(tmp_path):
    fit(tmp_path, [BalancedCheckpoint(dirpath=tmp_path)], max_epochs=2)
    assert (tmp_path / "balanced.ckpt").is_file() and not (tmp_path / "balanced_candidates").exists()


def test_resume_restores_state(tmp_path):
    cb = BalancedCheckpoint(dirpath=tmp_path, retention="all", keep_candidates=True)
    fit(tmp_path, [cb], max_epochs=3)
    resume_from = tmp_path / "balanced_candidates" / "epoch=0002.ckpt"
    state = torch.load(resume_from, weights_only=False)["callbacks"][cb.state_key]
    assert [r["epoch"] for r in state["rows"]].count(2) == 6 and state["saved"] == [0, 1, 2]
    cb2 = BalancedCheckpoint(dirpath=tmp_path, retention="all")
    fit(tmp_path, [cb2], max_epochs=6, ckpt_path=resume_from)
    assert sorted(cb2.case_history["epoch"].unique()) == list(range(6))
    assert sorted(cb2._monitor_values) == list(range(6))
    report = json.loads((tmp_path / "corner_cases.json").read_text())
    assert report["candidate_epochs"] == list(range(6))


def test_not_enough_cases_is_explicit(tmp_path):
    cb = BalancedCheckpoint(dirpath=tmp_path)
    fit(tmp_path, [cb], max_epochs=2, n_cases=3)
    report = json.loads((tmp_path / "corner_cases.json").read_text())
    assert report["status"] == "not_enough_data" and report["balanced_epoch"] == 1
    assert (tmp_path / "balanced.ckpt").is_file()


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        BalancedCheckpoint(policy="best")
    with pytest.raises(ValueError, match="retention"):
        BalancedCheckpoint(retention=0)


def test_ddp_two_cpu_processes(tmp_path):
    """Two gloo ranks: per-case sums gathered, rank 0 decides and writes, every rank reaches the end."""
    cb = BalancedCheckpoint(dirpath=tmp_path, retention="all")
    trainer = quiet_trainer(
        max_epochs=2,
        callbacks=[cb],
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        devices=2,
        strategy="ddp_spawn",
    )
    trainer.fit(
        ClassNet(), DataLoader(Classes(6), batch_size=4), DataLoader(Classes(6, seed=1), batch_size=3)
    )
    report = json.loads((tmp_path / "corner_cases.json").read_text())
    hist = pd.read_csv(tmp_path / "balanced_history.csv")
    # each rank saw half the slices; the gathered history still has every case, every epoch
    assert hist["case_id"].nunique() == 6 and sorted(hist["epoch"].unique()) == [0, 1]
    assert len(hist) == 12 and not hist.duplicated(["case_id", "epoch"]).any()  # no case counted twice
    # rank 0's decision is the pure decision on the gathered history (not on its own half of the cases)
    least = report["least_loss_epoch"]
    assert least in (0, 1)
    expected = select_balanced_epoch(hist, "last_inlier", reference_epoch=least)
    assert report["balanced_epoch"] == expected.epoch and report["status"] == expected.status
    assert (tmp_path / "balanced.ckpt").is_file()


def test_dict_output_model_is_read_the_same_by_both_callbacks(tmp_path):
    """A model returning ``{"aux": ..., "out": logits}``: both callbacks score the main output
    (:func:`robusttrain.metamorphic.outputs.main_output`), so their per-case Dice agree. BalancedCheckpoint
    used to read the first value (the auxiliary head) and disagree."""
    from toys import Blobs, Tiny, fit

    from robusttrain.callbacks import MetamorphicCallback
    from robusttrain.metamorphic.suite import MRSuite

    mr = MetamorphicCallback(suite=MRSuite(["contrast"], (2,)), dirpath=tmp_path / "run", class_names=["fg"])
    bc = BalancedCheckpoint(compute_dice=True, class_names=["fg"], monitor="val/loss")
    fit(tmp_path, mr, epochs=1, model=Tiny(lr=0.0, head="dict"), ds=Blobs(n=8), extra=[bc])
    by_mr = pd.read_csv(tmp_path / "run" / "history.csv").set_index("case_id")["dice_fg"].sort_index()
    by_bc = bc.case_history.set_index("case_id")["dice_fg"].sort_index()
    assert by_mr.min() > 0.5  # the main head is a good detector; the auxiliary one is its negation
    assert by_bc.tolist() == pytest.approx(by_mr.tolist())


def test_tail_is_checked_against_the_analysis_values_at_construction():
    """tail="high" used to pass construction and fail at on_train_end, after all the training."""
    from robusttrain.cornercases.ecod import TAILS

    with pytest.raises(ValueError, match=r"tail='high': expected one of 'low', 'both'"):
        BalancedCheckpoint(tail="high")
    for tail in TAILS:
        assert BalancedCheckpoint(tail=tail).tail == tail
