"""Robust training v2 (issue 30): the consistency objective, selection rules, warm-up, AugMix chains,
arguments refused at construction -- with real Lightning trainers."""

import json

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from toys import Blobs, quiet_trainer, run_ddp_shards, square_batch

from robusttrain.callbacks import (
    MetamorphicCallback,
    MetamorphicTraining,
    RobustnessConfigError,
    metamorphic_forward,
    metamorphic_loss,
)
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.rundir import metamorphic_training as records
from robusttrain.training import WorstOfK, recreate_followup, select

COLOUR = ["contrast", "saturation", "white_balance"]


_batch = square_batch


# ----------------------------------------------------------------------------- pure torch
def test_selection_rules_pick_the_documented_candidate():
    s = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.4, 0.2, 0.8, 0.6]])
    rej = torch.tensor([[False, True, False, False], [False, False, False, False]])
    g = torch.Generator().manual_seed(0)
    assert select(s, rej, "worst", generator=g).chosen.tolist() == [2, 2]  # the rejected 0.9 never
    # quantile over the valid candidates: row 0 has 3 valid (0.1, 0.3, 0.5), row 1 has 4
    assert select(s, rej, "quantile", quantile=0.0, generator=g).chosen.tolist() == [0, 1]
    assert select(s, rej, "quantile", quantile=0.5, generator=g).chosen.tolist() == [3, 3]
    assert select(s, rej, "quantile", quantile=1.0, generator=g).chosen.tolist() == [2, 2]
    a = select(s, rej, "augmax", generator=g)
    assert a.chosen.tolist() == [2, 2]
    assert a.partner is not None and a.weight is not None
    assert (a.partner != a.chosen).all() and not rej[0, int(a.partner[0])]
    everything = torch.ones(2, 4, dtype=torch.bool)
    assert select(s, everything, "augmax", generator=g).chosen.tolist() == [-1, -1]


@pytest.mark.parametrize(
    "kw",
    [
        dict(selection="augmax", k=3),
        dict(selection="quantile", quantile=0.5, k=3),
        dict(mix="augmix", chain_depth=3, width=3, k=1),
        dict(mix="augmix", chain_depth=2, width=2, k=3, selection="augmax"),
        dict(mix="none", chain_depth=3, width=1, k=2),
    ],
)
def test_every_follow_up_replays_exactly_from_its_json_recipe(kw):
    x, m = _batch()
    wok = WorstOfK(COLOUR + ["blur", "instrument"], q=0.75, epsilon=1.0, severity_caps=4, seed=1, **kw)
    score = lambda imgs, masks: (imgs - 0.5).abs().mean((1, 2, 3))
    for step in range(3):
        f = wok(x, m, score, step=step)
        assert torch.equal(f.replay(x, m), f.images)
        for i in range(len(f)):
            rec = f.recipe(i)
            if rec is None:
                continue
            stored = json.loads(json.dumps(_jsonable(rec)))  # what metamorphic_training_samples.jsonl keeps
            pos = int(f.index[i])
            again = recreate_followup(stored, x[pos : pos + 1], m[pos : pos + 1])
            assert torch.equal(again[0], f.images[i]), (step, i, rec["family"])
        if kw.get("selection") == "augmax" and f.partner is not None:
            mixed = f.weight is not None and bool(((f.weight > 0) & (f.weight < 1)).any())
            assert mixed


def _jsonable(rec):
    from robusttrain.training import jsonable

    return jsonable(rec)


def test_chains_mix_with_the_clean_image_and_follow_the_family_weights():
    x, m = _batch(n=16)
    wok = WorstOfK(COLOUR, k=1, q=1.0, mix="augmix", chain_depth=3, width=3, seed=0)
    f = wok(x, m, None, step=0, rates={"contrast": 1.0, "saturation": 0.0, "white_balance": 0.0})
    lengths, fams = [], []
    for i in range(len(f)):
        rec = f.recipe(i)
        assert rec["mixed"] and len(rec["chains"]) == 3 and abs(sum(rec["weights"]) - 1) < 1e-9
        assert 0 <= rec["mix"] <= 1
        lengths += [len(c) for c in rec["chains"]]
        fams += [op["family"] for c in rec["chains"] for op in c]
    assert set(lengths) <= {1, 2, 3} and len(set(lengths)) > 1
    # epsilon=0.3 default: contrast gets 0.7 + 0.1 of the draws
    assert fams.count("contrast") / len(fams) > 0.6
    assert f.families[0] == ["augmix"] and wok.labels[-1] == "augmix"


def test_chains_on_volumes_replay_slicewise():
    g = torch.Generator().manual_seed(0)
    x = 0.2 + 0.5 * torch.rand(2, 1, 16, 16, 6, generator=g)
    m = torch.zeros(2, 16, 16, 6, dtype=torch.long)
    m[:, 4:10, 4:10, 1:5] = 1
    wok = WorstOfK(["blur", "contrast", "gamma"], k=2, q=1.0, mix="augmix", chain_depth=2, width=2, seed=0)
    f = wok(x, m, lambda imgs, masks: imgs.mean((1, 2, 3, 4)), step=0)
    assert f.images.shape == (2, 1, 16, 16, 6)
    assert torch.equal(f.replay(x, m), f.images)


def test_k1_with_a_selection_rule_is_refused_it_would_be_ignored():
    # k=1 draws one candidate and scores nothing: a selection rule there was accepted and ignored before
    # issue 46 (the draws were those of selection="worst"); now it is refused naming why
    for sel in ("quantile", "augmax"):
        with pytest.raises(ValueError, match=f"selection='{sel}' picks among k > 1 scored candidates"):
            WorstOfK(COLOUR, k=1, q=0.5, epsilon=1.0, seed=3, selection=sel)


def test_warm_up_draws_one_random_candidate_and_scores_nothing():
    x, m = _batch()
    calls = []
    score = lambda imgs, masks: calls.append(len(imgs)) or imgs.mean((1, 2, 3))
    wok = WorstOfK(COLOUR, k=4, q=0.5, epsilon=1.0, seed=3)
    f = wok(x, m, score, step=0, select=False)
    assert calls == [] and f.scores is None and len(f.families[0]) == 1
    # the same draws as k=1 random augmentation: warm-up is exactly the recipes' augmentation
    r = WorstOfK(COLOUR, k=1, q=0.5, epsilon=1.0, seed=3)(x, m, None, step=0)
    assert torch.equal(r.images, f.images)
    wok(x, m, score, step=1)
    assert calls == [16]


def test_eligible_rows_only():
    x, m = _batch()
    f = WorstOfK(COLOUR, k=1, q=0.5, seed=0)(x, m, None, step=0, eligible=torch.tensor([1, 3, 5]))
    assert set(f.index.tolist()) <= {1, 3, 5} and len(f) == 3


# ----------------------------------------------------------------------------- bad values at construction
@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        (dict(severity_caps=0), r"severity_caps must be an int 1..5 .* got 0"),
        (dict(severity_caps=7), r"severity_caps must be an int 1..5 .* got 7"),
        (dict(severity_caps="high"), r"severity_caps must be an int 1..5 .* got 'high'"),
        (dict(severity_caps={"blur": 6}), r"severity_caps must be .*bad values \{'blur': 6\}"),
        (dict(severity_caps={"blurr": 2}), r"severity_caps names \['blurr'\], not families of this run"),
        (
            dict(perturbations=["blur"], severity_caps={"contrast": 2}),
            r"severity_caps names \['contrast'\], not families of this run; expected keys among \['blur'\]",
        ),
        (
            dict(objective="consistency"),
            r"objective='consistency' trains through the consistency term: give consistency > 0",
        ),
        (dict(objective="paired"), r"give consistency > 0"),
        (dict(objective="replace", consistency=1.0), r"objective='replace' has no consistency term"),
        (dict(objective="both"), r"objective"),
        (dict(replace_q=0.5), r"replace_q=0.5 is for objective='consistency'"),
        (dict(selection="hardest"), r"selection"),
        (dict(quantile=1.5), r"quantile"),
        (dict(warmup=1.0), r"warmup must be a fraction of the training steps in \[0, 1\), got 1.0"),
        (dict(chain_depth=9), r"chain_depth must be 1..5"),
        (dict(mix="cutmix"), r"mix"),
        (dict(chain_depth=3, width=3), r"width=3 chains are mixed only with mix='augmix'"),
        (dict(alpha=0), r"alpha must be a number > 0"),
    ],
)
def test_bad_values_fail_at_construction_in_one_line(kw, msg):
    with pytest.raises(ValueError, match=msg) as err:
        MetamorphicTraining(**kw)
    assert "\n" not in str(err.value)


def test_a_mapping_leaves_the_other_families_at_the_suites_highest_severity():
    mt = MetamorphicTraining(perturbations=COLOUR + ["blur"], severity_caps={"blur": 2})

    class Ctx:
        suite = MRSuite(COLOUR + ["blur"], severities=(2, 3))
        heldout_families = ()

    mt._ctx = Ctx()
    wok, replacer = mt._build(torch.rand(2, 3, 8, 8))
    assert wok.caps == {"contrast": 3, "saturation": 3, "white_balance": 3, "blur": 2} and replacer is None


# ----------------------------------------------------------------------------- with a trainer
class Probe(L.LightningModule):
    """Conv + BatchNorm; records every forward and what the supervised loss saw."""

    def __init__(self, line="forward"):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 2, 1),
        )
        self.line = line
        self.forwards, self.supervised, self.grads = [], [], []

    def forward(self, x):
        out = self.net(x)
        self.forwards.append((len(x), torch.is_grad_enabled(), self.training))
        if torch.is_grad_enabled():
            self._last = out
        return out

    def training_step(self, b, i):
        x, y = b
        self.supervised.append(x.detach().clone())
        if self.line == "plain":
            logits = self(x)
            return F.cross_entropy(logits, y)
        logits, mr = metamorphic_forward(self, x)
        sup = F.cross_entropy(logits, y)
        full = self._last
        g_sup = torch.autograd.grad(sup, full, retain_graph=True)[0]
        g_mr = torch.autograd.grad(mr, full, retain_graph=True, allow_unused=True)[0]
        self.grads.append(
            (
                len(logits),
                float(g_sup[len(logits) :].abs().sum()),
                0.0 if g_mr is None else float(g_mr[len(logits) :].abs().sum()),
            )
        )
        return sup + mr

    def validation_step(self, b, i):
        x, y = b
        self.log("val/loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(model, cbs, root, epochs=1, n=8, ckpt=None, val=False):
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=epochs,
        callbacks=cbs,
        default_root_dir=root,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
    )
    data = DataLoader(Blobs(n, slices=1, size=32, tuples=True), batch_size=4)
    trainer.fit(model, data, data if val else None, ckpt_path=ckpt)
    return trainer


@pytest.mark.slow
def test_consistency_objective_one_forward_no_supervised_loss_on_the_follow_ups(tmp_path):
    model = Probe()
    mt = MetamorphicTraining(
        perturbations=COLOUR, objective="consistency", consistency=1.0, ramp=0.0, k=2, q=0.5, dirpath=tmp_path
    )
    _fit(model, [mt], tmp_path)
    grad_forwards = [f for f in model.forwards if f[1]]
    # per step: ONE forward with gradients over the 4 batch images and their 2 follow-ups
    assert grad_forwards == [(6, True, True)] * 2
    # the supervised loss saw 4 rows and put no gradient on the follow-ups; the MR term did
    assert [n for n, _, _ in model.grads] == [4, 4]
    assert all(sup == 0.0 and mr > 0 for _, sup, mr in model.grads)
    stats = records.read_stats(tmp_path)
    assert stats.chosen.sum() == 4 and stats.candidates.sum() == 8


@pytest.mark.slow
def test_consistency_with_replace_q_supervises_exactly_what_random_augmentation_does(tmp_path):
    random_aug = Probe(line="plain")
    _fit(
        random_aug,
        [MetamorphicTraining(perturbations=COLOUR, k=1, q=0.5, epsilon=1.0, dirpath=tmp_path / "r")],
        tmp_path / "r",
    )
    cons = Probe()
    mt = MetamorphicTraining(
        perturbations=COLOUR,
        objective="consistency",
        consistency=1.0,
        replace_q=0.5,
        q=0.5,
        k=3,
        epsilon=1.0,
        selection="augmax",
        dirpath=tmp_path / "c",
    )
    _fit(cons, [mt], tmp_path / "c")
    assert len(cons.supervised) == len(random_aug.supervised) == 2
    for a, b in zip(cons.supervised, random_aug.supervised):
        assert torch.equal(a, b)  # same images, same weight: the hard copies only add the MR term
    assert [n for n, _, _ in cons.grads] == [4, 4] and all(s == 0.0 for _, s, _ in cons.grads)
    # the follow-ups were drawn among the rows the in-place draw left clean: 2 per step
    assert [f[0] for f in cons.forwards if f[1]] == [6, 6]


@pytest.mark.slow
def test_consistency_without_metamorphic_forward_is_one_clear_error(tmp_path):
    mt = MetamorphicTraining(perturbations=COLOUR, objective="consistency", consistency=1.0, dirpath=tmp_path)
    with pytest.raises(RobustnessConfigError, match=r"never called metamorphic_forward; add `logits, mr = "):
        _fit(Probe(line="plain"), [mt], tmp_path)


@pytest.mark.slow
def test_warm_up_scores_nothing_before_its_fraction_of_the_steps(tmp_path):
    model = Probe()
    mt = MetamorphicTraining(
        perturbations=COLOUR, objective="consistency", consistency=1.0, k=3, warmup=0.5, dirpath=tmp_path
    )
    _fit(model, [mt], tmp_path, epochs=2)  # 4 steps: 2 random, then worst of 3
    scoring = [n for n, grad, train in model.forwards if not grad and not train]
    assert scoring == [6, 6]  # 2 images x 3 candidates, only in steps 2 and 3


@pytest.mark.slow
def test_later_batches_out_of_range_get_the_same_one_line_error(tmp_path):
    class Drift(Blobs):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return (x * 3 if i >= 4 else x), y  # the second batch leaves [0, 1]

    mt = MetamorphicTraining(perturbations=COLOUR, k=1, dirpath=tmp_path)
    trainer = quiet_trainer(
        max_epochs=1, callbacks=[mt], default_root_dir=tmp_path, enable_checkpointing=True
    )
    with pytest.raises(RobustnessConfigError, match=r"training images at step 1 span \[0.\d+, 2.\d+\]"):
        trainer.fit(Probe(line="plain"), DataLoader(Drift(8, slices=1, size=32, tuples=True), batch_size=4))


class CrashAt(L.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("killed")


@pytest.mark.slow
def test_consistency_chains_same_seed_same_files_and_resume_equals_uninterrupted(tmp_path):
    def run(d, ckpt=None, crash=None):
        model = Probe()
        mt = MetamorphicTraining(
            perturbations=COLOUR + ["blur"],
            objective="consistency",
            consistency=1.0,
            replace_q=0.5,
            k=2,
            mix="augmix",
            chain_depth=2,
            width=2,
            selection="augmax",
            record_every=1,
            dirpath=d,
        )
        mr = MetamorphicCallback(
            suite=MRSuite(COLOUR, (2, 4)), dirpath=d, budget=0.5, verbose=False, class_names=["polyp"]
        )
        cbs = [mt, mr, ModelCheckpoint(dirpath=d / "ckpt", save_last=True, save_top_k=-1)]
        cbs += [CrashAt(crash)] if crash is not None else []
        _fit(model, cbs, d, epochs=3, ckpt=ckpt, val=True)
        return model

    a = run(tmp_path / "a")
    b = run(tmp_path / "b")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    for name in (records.STATS, records.SAMPLES):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "c", crash=2)
    c = run(tmp_path / "c", ckpt=str(tmp_path / "c" / "ckpt" / "last.ckpt"))
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k
    for name in (records.STATS, records.SAMPLES):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
    # a recorded chain follow-up re-creates its training image from the clean one
    samples = records.read_samples(tmp_path / "a")
    chain = next(s for s in samples if s["family"] == "augmix")
    assert "recipe" in chain and chain["recipe"]["chains"]


CHAINS = dict(mix="augmix", chain_depth=2, width=2)  # AugMix chains of two ops, two of them mixed


@pytest.mark.slow
def test_3d_volumes_with_the_consistency_objective(tmp_path):
    from toys import MonaiVol, fit_volumes

    class Vol(MonaiVol):  # counts its forwards' batch sizes; trains through metamorphic_forward
        def __init__(self):
            super().__init__()
            self.sizes = []

        def forward(self, x):
            self.sizes.append(len(x))
            return self.net(x)

        def training_step(self, b, i):
            logits, mr = metamorphic_forward(self, b["image"])
            return F.cross_entropy(logits, b["mask"]) + mr

    model, vols = fit_volumes(Vol, tmp_path, objective="consistency", consistency=1.0, k=2, q=0.5, **CHAINS)
    assert model.sizes == [2, 3, 2, 3]  # scoring 1 x 2 candidates (no grad), then batch + follow-up
    s = records.read_samples(tmp_path)[0]
    x = vols[s["position"]]["image"][None]
    again = recreate_followup(s["recipe"], x, vols[s["position"]]["mask"][None])
    assert again.shape == x.shape and not torch.equal(again, x)


@pytest.mark.slow
def test_ddp_each_rank_draws_its_own_chains(tmp_path):
    families = ["contrast", "saturation", "blur"]
    consistency = dict(objective="consistency", consistency=1.0, record_every=1, record_per_step=8)
    run_ddp_shards(
        tmp_path / "run", forward=True, perturbations=families, k=1, q=0.5, **CHAINS, **consistency
    )
    samples = records.read_samples(tmp_path / "run")
    by_rank = {r: [s for s in samples if s["rank"] == r] for r in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) == 2
    ds = Blobs(8, slices=1, size=32)
    for rank, recs in by_rank.items():
        shard = list(range(rank, 8, 2))
        for s in recs:
            rows = shard[2 * s["step"] : 2 * s["step"] + 2]
            pos = rows[s["position"]]
            wok = WorstOfK(families, k=1, q=0.5, **CHAINS, severity_caps=4, seed=0, stream="consistency")
            f = wok(ds.x[rows], ds.m[rows], None, step=s["step"], rank=rank)
            assert torch.equal(
                recreate_followup(s["recipe"], ds.x[pos : pos + 1], ds.m[pos : pos + 1])[0], f.images[0]
            )
    assert [s["recipe"] for s in by_rank[0]] != [s["recipe"] for s in by_rank[1]]


@pytest.mark.slow
def test_paired_objective_still_runs_by_name(tmp_path):
    class Paired(Probe):
        def training_step(self, b, i):
            x, y = b
            logits = self(x)
            return F.cross_entropy(logits, y) + metamorphic_loss(self, b, logits, F.cross_entropy)

    model = Paired()
    mt = MetamorphicTraining(perturbations=COLOUR, objective="paired", consistency=1.0, k=1, dirpath=tmp_path)
    _fit(model, [mt], tmp_path)
    assert [f[0] for f in model.forwards if f[1]] == [4, 2, 4, 2]  # clean batch, then the follow-ups


@pytest.mark.slow
def test_held_out_families_of_the_check_are_never_trained_on(tmp_path):
    mr = MetamorphicCallback(
        suite=MRSuite(COLOUR + ["blur"], (2, 4)),
        heldout=["blur"],
        dirpath=tmp_path,
        verbose=False,
        class_names=["polyp"],
    )
    mt = MetamorphicTraining(k=1, q=1.0, epsilon=1.0, record_every=1, record_per_step=4, dirpath=tmp_path)
    _fit(Probe(line="plain"), [mr, mt], tmp_path, epochs=1, val=True)
    assert mt.wok is not None and "blur" not in mt.wok.families and set(mt.wok.families) == set(COLOUR)
    assert {s["family"] for s in records.read_samples(tmp_path)} <= set(COLOUR)
    assert "blur" not in set(records.read_stats(tmp_path).family)
