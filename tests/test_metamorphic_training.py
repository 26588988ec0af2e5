"""Metamorphic training (issue 21): online worst-of-k, the MR-consistency objective, with real trainers."""

import json
from collections import Counter

import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from toys import Blobs, Tiny, quiet_trainer, run_ddp_shards, square_batch

from robusttrain.callbacks import (
    MetamorphicCallback,
    MetamorphicTraining,
    RobustnessConfigError,
    metamorphic_loss,
)
from robusttrain.callbacks.metamorphic_training import scoring_state
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.perturbations import get
from robusttrain.rundir import metamorphic_training as records
from robusttrain.training import WorstOfK, divergence, soft_dice_loss

COLOUR = ["contrast", "saturation", "white_balance"]


_batch = square_batch


# ----------------------------------------------------------------------------- WorstOfK (pure torch)
def test_k1_is_random_augmentation_with_the_same_dose_and_never_scores():
    x, m = _batch()
    calls = []
    score = lambda imgs, masks: calls.append(len(imgs)) or imgs.mean((1, 2, 3))
    one = WorstOfK(COLOUR, k=1, q=0.5, epsilon=1.0, severity_caps=4, seed=3)
    four = WorstOfK(COLOUR, k=4, q=0.5, epsilon=1.0, severity_caps=4, seed=3)
    fams, sevs = Counter(), Counter()
    for step in range(60):
        f1 = one(x, m, score, step=step)
        f4 = four(x, m, score, step=step)
        assert torch.equal(f1.index, f4.index)  # the same images get a follow-up: same dose
        assert len(f1) == 4 and f1.scores is None
        kept = f1.kept()
        assert all(r is not None for r in kept)  # colour families are never rejected
        fams.update(r[0] for r in kept)
        sevs.update(r[1] for r in kept)
        # each follow-up is that family at that severity with its recorded params: plain augmentation
        for i, (fam, sev, p) in enumerate(kept):
            pos = int(f1.index[i])
            ref, _ = get(fam, sev).apply_batch(x[pos : pos + 1], m[pos : pos + 1], params=p)
            assert torch.equal(ref[0], f1.images[i])
    assert len(calls) == 60  # only k=4 scored (once per step)
    assert set(fams) == set(COLOUR) and min(fams.values()) > 50  # uniform over 240 draws (80 expected)
    assert set(sevs) == {1, 2, 3, 4} and min(sevs.values()) > 35  # severities uniform in 1..cap


def test_worst_of_k_keeps_the_highest_loss_candidate_and_replays_exactly():
    x, m = _batch()
    score = lambda imgs, masks: (imgs - 0.5).abs().mean((1, 2, 3))
    f = WorstOfK(COLOUR + ["blur"], k=5, q=1.0, seed=0)(x, m, score, step=7)
    assert f.scores.shape == (8, 5)
    assert torch.equal(f.chosen, f.scores.argmax(1))
    assert torch.equal(f.replay(x, m), f.images)
    # temperature: a sample of softmax(loss / T), not always the arg-max, same draws for the same step
    hot = WorstOfK(COLOUR + ["blur"], k=5, q=1.0, seed=0, temperature=10.0)
    picks = torch.stack([hot(x, m, score, step=s).chosen for s in range(20)])
    assert picks.unique().numel() > 1
    assert torch.equal(hot(x, m, score, step=3).chosen, hot(x, m, score, step=3).chosen)


def test_family_choice_follows_violation_rates_with_an_epsilon_floor():
    w = WorstOfK(["blur", "contrast", "saturation"], epsilon=0.3)
    p = w.family_probs({"blur": 0.6, "contrast": 0.0, "saturation": 0.0})
    assert p.tolist() == pytest.approx([0.7 + 0.1, 0.1, 0.1])
    assert w.family_probs(None).tolist() == pytest.approx([1 / 3] * 3)
    assert w.family_probs({"blur": 0.0}).tolist() == pytest.approx([1 / 3] * 3)


def test_occluders_over_the_lesion_are_never_kept(monkeypatch):
    x, m = _batch(n=4, size=64)
    m[:] = 0
    m[:, 8:56, 8:56] = 1  # a large lesion
    score = lambda imgs, masks: torch.ones(len(imgs))
    occl = ["instrument", "feces", "blood", "text"]
    f = WorstOfK(occl, k=4, q=1.0, max_cover=0.1, seed=0)(x, m, score, step=0)
    lesion = m.bool()
    moved = ((f.images - x[f.index]).abs().amax(1) > 2 / 255) & lesion[f.index]
    assert (moved.flatten(1).sum(1) <= 0.1 * lesion[f.index].flatten(1).sum(1)).all()
    # every candidate rejected: the image stays clean and is marked -1
    wok = WorstOfK(occl, k=2, q=1.0, seed=0)
    monkeypatch.setattr(
        wok, "_rejected", lambda src, masks, cand, fams, occl=None: torch.ones(len(src), 2, dtype=torch.bool)
    )
    f = wok(x, m, score, step=0)
    assert (f.chosen == -1).all() and torch.equal(f.images, x) and f.kept() == [None] * 4
    # the guard itself: a candidate changing 30 % of the lesion is rejected at 10 %, colour never is
    m2 = torch.zeros(1, 10, 10, dtype=torch.long)
    m2[0, :, :] = 1
    src = torch.full((1, 3, 10, 10), 0.5)
    cand = src.unsqueeze(1).repeat(1, 2, 1, 1, 1)
    cand[0, :, :, :3, :] = 1.0
    rej = WorstOfK(["instrument", "contrast"], k=2)._rejected(src, m2, cand, [["instrument", "contrast"]])
    assert rej.tolist() == [[True, False]]


def test_bad_arguments_are_refused_with_one_line():
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        WorstOfK(["blur"], k=0)
    with pytest.raises(ValueError, match="severity_caps values must be integers 1..5"):
        WorstOfK(["blur"], severity_caps={"blur": 7})
    with pytest.raises(ValueError, match="consistency must be a weight >= 0"):
        MetamorphicTraining(consistency=-1)
    with pytest.raises(ValueError, match="divergence"):
        MetamorphicTraining(divergence="l1")


def test_a_family_that_cannot_take_the_batch_is_refused_at_the_first_call_whatever_is_drawn():
    # checked only on the rows a family was drawn for, a colour family on grey images failed at whichever
    # later step first drew it (here the first draw gives both follow-ups to blur and passed)
    score = lambda c, m: c.mean(tuple(range(1, c.ndim)))  # noqa: E731
    grey, rgb = torch.rand(8, 1, 32, 32), torch.rand(8, 3, 32, 32)
    with pytest.raises(
        ValueError, match=r"families \['saturation'\] cannot take 1-channel images .*\['blur'\]"
    ):
        WorstOfK(["saturation", "blur"], k=1, q=0.25, seed=0)(grey, None, score, step=0)
    with pytest.raises(ValueError, match=r"families \['gibbs'\] cannot take 3-channel images"):
        WorstOfK(["gibbs", "blur"], k=1, q=0.25, seed=0)(rgb, None, score, step=0)
    assert WorstOfK(["blur", "gamma"], k=1, q=0.25, seed=0)(grey, None, score, step=0).images.shape[1] == 1


def test_divergence_and_soft_dice():
    p = torch.softmax(torch.randn(2, 3, 8, 8), 1)
    assert float(divergence(p, p)) == pytest.approx(0, abs=1e-6)
    q = torch.softmax(torch.randn(2, 3, 8, 8), 1)
    assert float(divergence(p, q)) == pytest.approx(float(divergence(q, p)), rel=1e-5)  # JS is symmetric
    assert 0 < float(divergence(p, q)) <= np.log(2)
    m = torch.zeros(2, 8, 8, dtype=torch.long)
    perfect = torch.zeros(2, 2, 8, 8)
    perfect[:, 0] = 1
    assert soft_dice_loss(perfect, m).tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- with a model
class BNNet(L.LightningModule):
    """Conv + BatchNorm + dropout: scoring must not move BN statistics or the RNG stream."""

    def __init__(self, consistency_line=True, dropout=0.2):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Dropout2d(dropout),
            torch.nn.Conv2d(8, 2, 1),
        )
        self.line = consistency_line
        self.forwards = []

    def forward(self, x):
        self.forwards.append((len(x), torch.is_grad_enabled(), self.training))
        return self.net(x)

    def training_step(self, b, i):
        x, y = (b["image"], b["mask"]) if isinstance(b, dict) else b
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        if self.line:
            loss = loss + metamorphic_loss(self, b, logits, F.cross_entropy)  # the one documented line
        return loss

    def validation_step(self, b, i):
        x, y = (b["image"], b["mask"]) if isinstance(b, dict) else b
        self.log("val/loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(model, cbs, tmp_path, epochs=2, n=8, tuples=False, ckpt=None, **kw):
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=epochs, callbacks=cbs, default_root_dir=tmp_path, enable_checkpointing=True, **kw
    )
    trainer.fit(model, DataLoader(Blobs(n, slices=1, size=32, tuples=tuples), batch_size=4), ckpt_path=ckpt)
    return trainer


def test_scoring_leaves_batchnorm_buffers_train_mode_and_rng_untouched():
    model = BNNet()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, m = _batch(n=4)
    mt = MetamorphicTraining(perturbations=COLOUR, k=3)
    score = mt._scorer(None, model)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    s = score(x, m)
    assert torch.equal(torch.rand(3), expected)  # the training RNG stream did not move
    assert s.shape == (4,) and model.training  # train mode is back
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BN running stats / counters unchanged
    assert model.forwards[-1] == (4, False, False)  # scored without grad, in eval mode
    with scoring_state(model):
        assert not model.training and not torch.is_grad_enabled()


@pytest.mark.slow
def test_gradients_flow_only_through_the_chosen_follow_up_and_clean_batch(tmp_path):
    model = BNNet()
    mt = MetamorphicTraining(
        perturbations=COLOUR,
        k=4,
        q=0.5,
        objective="paired",
        consistency=1.0,
        ramp=0.0,
        score_scale=0.5,
        dirpath=tmp_path,
    )
    _fit(model, [mt], tmp_path, epochs=1, tuples=True)
    grad_forwards = [f for f in model.forwards if f[1]]
    nograd = [f for f in model.forwards if not f[1]]
    # per step: the clean batch (4) and the 2 chosen follow-ups with gradients; the 2 x 4 candidates without
    assert grad_forwards == [(4, True, True), (2, True, True)] * 2
    assert [n for n, _, train in nograd if not train] == [8, 8]
    stats = records.read_stats(tmp_path)
    assert stats.candidates.sum() == 16 and stats.chosen.sum() == 4


class GradProbe(BNNet):
    """Records how much of the MR term's gradient reaches the clean logits at each step."""

    def __init__(self):
        super().__init__()
        self.source_grads: list[float] = []

    def training_step(self, b, i):
        x, y = b
        logits = self(x)
        mr = metamorphic_loss(self, b, logits, F.cross_entropy)
        (g,) = torch.autograd.grad(mr, logits, retain_graph=True, allow_unused=True)
        self.source_grads.append(0.0 if g is None else float(g.abs().sum()))
        return F.cross_entropy(logits, y) + mr


@pytest.mark.slow
@pytest.mark.parametrize("detach", [False, True])
def test_detach_source_keeps_the_consistency_gradient_off_the_clean_prediction(tmp_path, detach):
    model = GradProbe()
    mt = MetamorphicTraining(
        perturbations=COLOUR,
        k=2,
        objective="paired",
        consistency=1.0,
        ramp=0.0,
        detach_source=detach,
        dirpath=tmp_path,
    )
    _fit(model, [mt], tmp_path, epochs=1, tuples=True)
    assert len(model.source_grads) == 2
    if detach:  # only the follow-up's prediction is asked to agree
        assert model.source_grads == [0.0, 0.0]
    else:  # AugMix's symmetric JS also moves the clean prediction
        assert min(model.source_grads) > 0
    with pytest.raises(ValueError, match="detach_source must be true or false, got 'yes'"):
        MetamorphicTraining(detach_source="yes")


@pytest.mark.slow
def test_consistency_without_the_line_is_one_clear_error(tmp_path):
    mt = MetamorphicTraining(perturbations=COLOUR, objective="paired", consistency=1.0, dirpath=tmp_path)
    with pytest.raises(RobustnessConfigError, match=r"never called metamorphic_loss"):
        _fit(BNNet(consistency_line=False), [mt], tmp_path, epochs=1)
    with pytest.raises(RobustnessConfigError, match="needs a MetamorphicTraining"):
        _fit(BNNet(), [], tmp_path, epochs=1)


@pytest.mark.slow
def test_replace_mode_needs_no_code_change_and_same_seed_gives_identical_weights(tmp_path):
    runs = []
    for name in ("a", "b"):
        model = Tiny()
        mt = MetamorphicTraining(
            perturbations=COLOUR + ["blur"], k=3, q=0.5, record_every=1, dirpath=tmp_path / name
        )
        _fit(model, [mt], tmp_path / name, epochs=2, tuples=True)
        runs.append((model, tmp_path / name))
    (a, da), (b, db) = runs
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    for name in (records.STATS, records.SAMPLES):
        assert (da / name).read_bytes() == (db / name).read_bytes()
    plain = Tiny()
    _fit(plain, [], tmp_path / "plain", epochs=2, tuples=True)
    assert not torch.equal(plain.net.weight, a.net.weight)  # the follow-ups were trained on
    samples = records.read_samples(da)
    assert len(samples) == 4 * 2 and {s["case_id"] for s in samples} == {None}  # tuples: no case ids
    # a recorded sample re-creates its training image from the clean one
    s = samples[0]
    x = Blobs(8, slices=1, size=32).x[s["position"] : s["position"] + 1]
    params = {k: torch.tensor(v) for k, v in s["params"].items()}
    out, _ = get(s["family"], s["severity"]).apply_batch(x, None, params=params)
    assert out.shape == x.shape and not torch.equal(out, x)


class Crash(Exception):
    pass


class CrashAt(L.Callback):
    """Dies at the start of an epoch, after the previous epoch's checkpoint: a kill between epochs."""

    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise Crash()


@pytest.mark.slow
def test_resume_mid_run_equals_an_uninterrupted_run(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(d, ckpt=None, crash=None):
        model = BNNet(dropout=0.0)  # Lightning does not checkpoint the global RNG that dropout draws from
        mt = MetamorphicTraining(
            perturbations=COLOUR + ["blur"],
            k=3,
            objective="paired",
            consistency=1.0,
            record_every=1,
            dirpath=d,
        )
        mr = MetamorphicCallback(
            suite=MRSuite(COLOUR, (2, 4)), dirpath=d, budget=0.5, verbose=False, class_names=["polyp"]
        )
        cbs = [mt, mr, ModelCheckpoint(dirpath=d / "ckpt", save_last=True, save_top_k=-1)]
        cbs += [CrashAt(crash)] if crash is not None else []
        torch.manual_seed(0)
        trainer = quiet_trainer(max_epochs=3, callbacks=cbs, default_root_dir=d, enable_checkpointing=True)
        trainer.fit(
            model,
            DataLoader(Blobs(8, slices=1, size=32), batch_size=4),
            DataLoader(Blobs(8, slices=1, size=32, seed=1), batch_size=4),
            ckpt_path=ckpt,
        )
        return model

    full = run(tmp_path / "full")
    with pytest.raises(Crash):
        run(tmp_path / "cut", crash=2)
    resumed = run(tmp_path / "cut", ckpt=str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    for name in (records.STATS, records.SAMPLES, "efr.csv", "history.csv"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes(), name


def test_family_weights_come_from_the_checks_violation_rates():
    from robusttrain.callbacks.context import RobustnessContext

    mt = MetamorphicTraining(perturbations=["blur", "contrast"])
    ctx = RobustnessContext()
    ctx.violation_threshold = 0.25
    rows = []
    for split, rate in (("val", 0.5), ("train", 0.2)):
        for pert, r in (("blur", rate), ("contrast", 0.0), ("all", rate / 2)):
            rows.append(
                {
                    "epoch": 0,
                    "split": split,
                    "perturbation": pert,
                    "severity": 0,
                    "metric": "dice",
                    "threshold": 0.25,
                    "efr": r,
                }
            )
    ctx.efr = pd.DataFrame(rows)
    mt._ctx = ctx
    assert mt._rates() == {"blur": 0.2, "contrast": 0.0}  # the train probe's rates when there is one
    ctx.efr = ctx.efr[ctx.efr.split == "val"]
    assert mt._rates() == {"blur": 0.5, "contrast": 0.0}


@pytest.mark.slow
def test_3d_monai_unet_with_consistency(tmp_path):
    from toys import MonaiVol, fit_volumes

    class Vol(MonaiVol):  # trains through metamorphic_loss
        def training_step(self, b, i):
            logits = self(b["image"])
            loss = F.cross_entropy(logits, b["mask"])
            return loss + metamorphic_loss(self, b, logits, F.cross_entropy)

    _, vols = fit_volumes(Vol, tmp_path, k=2, q=0.5, objective="paired", consistency=1.0, ramp=0.0)
    samples = records.read_samples(tmp_path)
    assert len(samples) == 2 and all(s["family"] in ("blur", "contrast", "gamma") for s in samples)
    # a volume follow-up is the family applied slice-wise with one draw of params
    s = samples[0]
    x = torch.stack([vols[s["position"]]["image"]])
    from robusttrain.training.worst_of_k import _apply

    op, p = get(s["family"], s["severity"]), {k: torch.tensor(v) for k, v in s["params"].items()}
    out = _apply(op, x, None, p)
    # independently: the 2-D family on each depth slice with the same recorded params
    by_slice = torch.stack([op.apply_batch(x[..., d], None, params=p)[0] for d in range(x.shape[-1])], -1)
    assert out.shape == x.shape and torch.allclose(out, by_slice, atol=1e-6)
    assert not torch.equal(out, x)  # the recorded follow-up perturbs the volume


@pytest.mark.slow
def test_pytorch_lightning_trainer_accepts_it(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")

    class PLTiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Conv2d(3, 2, 3, padding=1)

        def forward(self, x):
            return self.net(x)

        def training_step(self, b, i):
            x, y = b
            logits = self(x)
            return F.cross_entropy(logits, y) + metamorphic_loss(self, b, logits, F.cross_entropy)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    mt = MetamorphicTraining(perturbations=COLOUR, k=2, objective="paired", consistency=0.5, dirpath=tmp_path)
    trainer = quiet_trainer(
        pl, max_epochs=1, callbacks=[mt], default_root_dir=tmp_path, enable_checkpointing=True
    )
    trainer.fit(PLTiny(), DataLoader(Blobs(8, slices=1, size=32, tuples=True), batch_size=4))
    assert records.read_stats(tmp_path).chosen.sum() == 4


@pytest.mark.slow
def test_ddp_each_rank_draws_for_its_own_shard(tmp_path):
    families = ["contrast", "saturation", "blur"]  # rank r trains on samples r, r+2, ... (recomputed below)
    run_ddp_shards(tmp_path / "run", perturbations=families, k=1, q=0.5, record_every=1, record_per_step=8)
    samples = records.read_samples(tmp_path / "run")
    by_rank = {r: [s for s in samples if s["rank"] == r] for r in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) == 2  # 2 steps x 1 follow-up (q=0.5 of 2) per rank
    ds = Blobs(8, slices=1, size=32)
    wok = WorstOfK(families, k=1, q=0.5, severity_caps=4, seed=0)
    for rank, recs in by_rank.items():
        shard = list(range(rank, 8, 2))  # DistributedSampler without shuffle
        for s in recs:
            rows = shard[2 * s["step"] : 2 * s["step"] + 2]
            assert s["case_id"] == ds.case_ids()[rows[s["position"]]]
            f = wok(ds.x[rows], ds.m[rows], None, step=s["step"], rank=rank)
            fam, sev, p = f.kept()[0]
            assert (fam, sev) == (s["family"], s["severity"])
            assert json.loads(json.dumps({k: v.tolist() for k, v in p.items()})) == s["params"]
    # the ranks drew differently (own seeds, own shards), from the same family weights
    assert [s["params"] for s in by_rank[0]] != [s["params"] for s in by_rank[1]]


@pytest.mark.slow
def test_kept_family_shares_reach_the_loggers(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    mt = MetamorphicTraining(perturbations=COLOUR, k=2, dirpath=tmp_path)
    trainer = quiet_trainer(max_epochs=2, callbacks=[mt], logger=CSVLogger(tmp_path, name="logs"))
    trainer.fit(Tiny(), DataLoader(Blobs(8, slices=1, size=32), batch_size=4))
    logged = pd.read_csv(tmp_path / "logs" / "version_0" / "metrics.csv")
    shares = logged[[c for c in logged.columns if c.startswith("mt/kept_share/")]].dropna(how="all")
    assert len(shares) == 2 and np.allclose(shares.fillna(0).sum(1), 1.0)


@pytest.mark.slow
def test_normalised_training_images_are_refused_in_one_line(tmp_path):
    class Normalised(Blobs):
        def __getitem__(self, i):
            s = dict(super().__getitem__(i))
            s["image"] = (s["image"] - 0.5) / 0.25  # mean/std normalised before the callback sees it
            return s

    mt = MetamorphicTraining(perturbations=COLOUR, dirpath=tmp_path)
    trainer = quiet_trainer(max_epochs=1, callbacks=[mt])
    with pytest.raises(
        RobustnessConfigError, match=r"perturbs images in \[0, 1\], but the training images at step 0 span"
    ):
        trainer.fit(Tiny(), DataLoader(Normalised(8, slices=1, size=32), batch_size=4))
