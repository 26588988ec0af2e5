"""The training conditions the evidence benchmarks compare, at one step budget (shared code).

Every condition trains on ``N`` samples per epoch, a fraction ``ratio`` of which are replaced by
*slot* samples (the ReplayDataset layout), so only what fills the slots differs:

- ``plain``  — clean random training samples;
- ``random`` — a random perturbation x severity with random params (standard augmentation with
  the same perturbation families: ``RandomPerturbationDataset``);
- ``mined``  — failures found by a MetamorphicCallback train probe, replayed by
  ``FailureMiningCallback`` (its ``jitter`` / ``fresh_image`` / ``clean_mix`` settings).

Evidence v3 adds the :class:`~robusttrain.callbacks.MetamorphicTraining` conditions (``MT_CONDITIONS``):
the slots hold clean samples (as ``plain``), and the callback perturbs a fraction ``q`` of every
batch (same dose in every MT condition):

- ``mt_random``        — ``k=1, epsilon=1, consistency=0``: random augmentation, uniform families;
- ``metamorphic``      — ``k=4, epsilon=0.3, consistency=1``: the method (worst-of-k + MR loss; the recipes' default until
  Evidence v3 showed it losing to ``mt_random``, which the recipes now use);
- ``consistency_only`` — the default with ``k=1`` (ablation: no worst-of-k selection);
- ``worst_of_k_only``  — the default with ``consistency=0`` (ablation: follow-ups replace in place);
- ``metamorphic_uniform`` — the default with ``epsilon=1`` (ablation: families drawn uniformly, as in
  ``mt_random``, not weighted by the MR check's violation rates). Added after the first seeds: both
  ablations above keep ``epsilon=0.3`` and drew ~40 % saturation late in training, like the default, so
  only this one separates the adaptive family weights from worst-of-k + consistency.
- ``consistency_detached`` / ``consistency_paired`` / ``consistency_light`` / ``metamorphic_detached`` --
  diagnostics of the seed-2 stall (every lambda=1 run of seed 2 stalled): the JS term with the
  gradient stopped at the clean prediction, the paired follow-up loss without JS (lambda=1e-9), a tenth
  of the JS weight, and the method with the stopped gradient. The first three ran on seed 2 and stalled
  too: the stall comes with the paired loss, not the JS term (docs/results.md).

Evidence v4 (issue 34, ``docs/evidence_v4/PROTOCOL.md``) has its own table, :data:`V4_CONDITIONS`
(``run.py --protocol v4``): the names are the protocol's, and ``random`` there is metamorphic
training's in-place random augmentation (``mt_random`` of v3), not the v2 slot augmentation.

Mining v2 (issue 44) adds two conditions on metamorphic training's random augmentation
(:data:`V4_RANDOM`: ``objective="replace", k=1, q=0.5, epsilon=1``), both with a
``FailureMiningCallback(mode="steer")`` train probe every ``mine_every`` epochs (same probe compute):

- ``random_probed`` -- ``steer=0``: the uniform random draws; the bank only counts (new failures, repairs);
- ``steered``       -- ``steer`` (default 0.5) of the random follow-ups drawn from the failure conditions
  (:data:`STEER_DEFAULTS`), on the images the loader brings: the same perturbed share.

Used by ``mining.py`` and ``run.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.mining import RandomPerturbationDataset

# the MetamorphicTraining conditions: keyword arguments over MT_DEFAULTS (the v3 method: worst of 4,
# JS lambda=1 through the paired objective, candidates scored at half size -- spelled out, since the
# class's defaults moved in robust training v2: consistency > 0 now means the consistency objective and
# scoring is at full size)
MT_DEFAULTS: dict[str, Any] = {
    "k": 4,
    "q": 0.5,
    "epsilon": 0.3,
    "consistency": 1.0,
    "objective": "paired",
    "score_scale": 0.5,
}
MT_CONDITIONS: dict[str, dict[str, Any]] = {
    "mt_random": {"k": 1, "epsilon": 1.0, "consistency": 0.0, "objective": "replace"},
    "metamorphic": {},
    "consistency_only": {"k": 1},
    "worst_of_k_only": {"consistency": 0.0, "objective": "replace"},
    "metamorphic_uniform": {"epsilon": 1.0},
    # the seed-2 stall diagnostics (docs/results.md): which part of lambda=1 stalls seed 2?
    "consistency_detached": {"k": 1, "detach_source": True},  # JS moves only the follow-up
    "consistency_paired": {"k": 1, "consistency": 1e-9},  # the paired follow-up loss, JS weight ~0
    "consistency_light": {"k": 1, "consistency": 0.1},  # a tenth of the JS weight
    "metamorphic_detached": {"detach_source": True},
    # robust training v2 (issue 30): the v3 method's draws with the new objective -- the clean batch
    # alone is supervised, the worst-of-4 copies act only through lambda * JS in one forward. Run on
    # seed 2, where every paired run stalled: the stall reproducer.
    "metamorphic_consistency": {"objective": "consistency"},
}
STEER_CONDITIONS = ("random_probed", "steered")
CONDITIONS = ("plain", "random", "mined", *MT_CONDITIONS)
# FailureMiningCallback(mode="steer") settings of the ``steered`` condition (the recipe's, mining.yaml)
STEER_DEFAULTS: dict[str, float] = {"steer": 0.5, "decay": 0.5, "balance": 0.5, "placement_jitter": 0.05}
# the recipe's "family replay" (robusttrain/recipes/callbacks/robust.yaml), the best Kvasir/synthetic
# trade-off in docs/results.md (Failure mining)
MINING_DEFAULTS: dict[str, float] = {"jitter": 0.3, "fresh_image": 0.4, "clean_mix": 0.2}

# ----------------------------------------------------------------------------------- Evidence v4
# MetamorphicTraining keyword arguments of each v4 condition, complete (no defaults merged in: the
# pre-registered settings are exactly these, whatever the class's defaults become)
V4_RANDOM: dict[str, Any] = {"objective": "replace", "k": 1, "q": 0.5, "epsilon": 1.0}
V4_MT: dict[str, dict[str, Any]] = {
    "random": dict(V4_RANDOM),
    "hard_consistency": {
        "objective": "consistency",
        "replace_q": 0.5,
        "q": 0.5,
        "k": 4,
        "selection": "augmax",
        "epsilon": 1.0,
        "consistency": 1.0,
    },
    "augmix_consistency": {
        "objective": "consistency",
        "replace_q": 0.5,
        "q": 0.5,
        "k": 1,
        "mix": "augmix",
        "chain_depth": 3,
        "width": 3,
        "epsilon": 1.0,
        "consistency": 1.0,
    },
    "random_shift": dict(V4_RANDOM),
}
# families a condition trains on beyond --perturbations (suite names resolved by the library)
V4_EXTRA_FAMILIES: dict[str, tuple[str, ...]] = {"random_shift": ("shift",)}
# Mined replay at random augmentation's dose. random perturbs q = 0.5 of every batch's rows (slot rows
# included), so half of all training samples are perturbed. Mined replay perturbs only its slots, and
# clean_mix of those stay clean: dose = replay_ratio * (1 - clean_mix); with the recipe's clean_mix 0.2,
# replay_ratio = 0.5 / 0.8 = 0.625 gives 0.5 (v3 ran 0.2 * 0.8 = 0.16, a third of random's dose).
V4_RANDOM_DOSE = V4_RANDOM["q"]
V4_MINED = {"replay_ratio": V4_RANDOM_DOSE / (1.0 - MINING_DEFAULTS["clean_mix"]), **MINING_DEFAULTS}
V4_CONDITIONS = ("plain", "random", "hard_consistency", "augmix_consistency", "random_shift", "mined_dose")
# held-out test families: in the test suite, never in any condition's training draws
V4_TEST_SUITE = ("endoscopy", "endoscopy_heldout")


def v4_dose(cond: str) -> float:
    """Expected share of a v4 condition's training samples that are perturbed (once a mined bank is full).

    >>> v4_dose("random"), v4_dose("mined_dose"), v4_dose("plain")
    (0.5, 0.5, 0.0)
    """
    if cond == "mined_dose":
        return round(V4_MINED["replay_ratio"] * (1.0 - V4_MINED["clean_mix"]), 6)
    kw = V4_MT.get(cond)
    if kw is None:
        return 0.0
    # consistency objectives: replace_q of the rows are random draws the supervised loss sees
    return float(kw["q"] if kw["objective"] == "replace" else kw["replace_q"])


def v4_training_families(cond: str, perturbations: Sequence[str]) -> list[str]:
    """The families condition ``cond`` draws in training (``perturbations`` + its extra suites), resolved.

    >>> v4_training_families("random", ["blur", "contrast"]), v4_training_families("plain", ["blur"])
    (['blur', 'contrast'], [])
    """
    from robusttrain.perturbations.suites import resolve

    if cond == "plain" or V5_TRAINING.get(cond) == "plain":
        return []
    return resolve([*perturbations, *V4_EXTRA_FAMILIES.get(cond, ())])


def usable_families(names: Sequence[str] | None, in_channels: int) -> list[str]:
    """The families of ``names`` (None: the nine default ones) that run on ``in_channels`` images."""
    suite = MRSuite(names)
    suite.prepare(in_channels)
    return [n for n in suite.names if n not in suite.skipped]


def training_callbacks(
    cond: str,
    dm: Any,
    perturbations: Sequence[str],
    severities: Sequence[int],
    *,
    seed: int,
    ratio: float = 0.2,
    probe: int = 64,
    mine_every: int = 1,
    val_every: int = 0,
    run_dir: str | None = None,
    mining: dict | None = None,
    batch_size: int = 8,
    train_seed: int = 0,
    mt: dict | None = None,
    val_cases: int | None = None,
) -> tuple[list, MetamorphicCallback]:
    """Callbacks of one condition; the train loader of ``dm`` is built over the condition's wrapper
    (``dm.wrap_train``: FailureMiningCallback.wrap or a RandomPerturbationDataset).

    ``dm`` must be set up. The MetamorphicCallback's suite (seeded by ``seed``, the data seed, so
    follow-ups do not depend on the training seed) checks the validation set every ``val_every``
    epochs (0 = never; at most ``val_cases`` cases) and, for ``mined`` only, ``probe`` training cases
    every ``mine_every`` epochs. The MT conditions draw with ``train_seed``; ``mt`` overrides
    :data:`MT_DEFAULTS` for every MT condition (e.g. ``q``), the condition's own keys win.
    """
    if cond not in CONDITIONS + STEER_CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS + STEER_CONDITIONS}, got {cond!r}")
    mr = MetamorphicCallback(
        suite=MRSuite(list(perturbations), tuple(severities), seed=seed),
        every_n_epochs=val_every,
        dirpath=run_dir,
        verbose=False,
        batch_size=batch_size,
        max_cases=val_cases,
    )
    if cond == "mined":
        mining_cb = FailureMiningCallback(
            replay_ratio=ratio,
            train_probe_size=probe,
            every_n_epochs=mine_every,
            **{**MINING_DEFAULTS, **(mining or {})},
        )
        dm.wrap_train(mining_cb.wrap)
        return [mr, mining_cb], mr
    if cond in STEER_CONDITIONS:
        steer = {**STEER_DEFAULTS, **(mining or {})}
        if cond == "random_probed":
            steer["steer"] = 0.0
        mining_cb = FailureMiningCallback(
            mode="steer", train_probe_size=probe, every_n_epochs=mine_every, dirpath=run_dir, **steer
        )
        kw = {**V4_RANDOM, **(mt or {})}
        return [
            mr,
            mining_cb,
            _mt_callback(dm, perturbations, severities, ratio, train_seed, run_dir, kw),
        ], mr
    if cond in MT_CONDITIONS:
        kw = {**MT_DEFAULTS, **(mt or {}), **MT_CONDITIONS[cond]}
        if kw["k"] == 1 and "score_scale" not in (mt or {}):
            # k=1 scores nothing, so v3's scoring size never acted there (and MetamorphicTraining refuses
            # an argument that has no effect): the same draws without it
            del kw["score_scale"]
        return [mr, _mt_callback(dm, perturbations, severities, ratio, train_seed, run_dir, kw)], mr
    # same slot layout as ReplayDataset
    names = list(perturbations) if cond == "random" else []
    dm.wrap_train(lambda ds: RandomPerturbationDataset(ds, names, tuple(severities), ratio=ratio))
    return [mr], mr


def _mt_callback(dm, perturbations, severities, ratio, train_seed, run_dir, kw):
    """MetamorphicTraining over clean slots (the ``plain`` layout: every condition, the same steps)."""
    from robusttrain.callbacks import MetamorphicTraining

    dm.wrap_train(lambda ds: RandomPerturbationDataset(ds, [], tuple(severities), ratio=ratio))
    return MetamorphicTraining(
        perturbations=list(perturbations),
        severity_caps=max(severities),
        seed=train_seed,
        dirpath=run_dir,
        **kw,
    )


def mean_std(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    """Mean and sample std (0 for one value), rounded."""
    v = np.asarray(list(values), dtype=np.float64)
    return {
        "mean": round(float(v.mean()), digits),
        "std": round(float(v.std(ddof=1)) if v.size > 1 else 0.0, digits),
    }


# ----------------------------------------------------------------------------------- Evidence v5
# issue 45, docs/evidence_v5/PROTOCOL.md: the model users ship. Each condition is (model, training);
# the same seed gives the same data order (the loader's shuffle) and, within one model, the same
# initialisation of what is not pretrained (the model is built right after seeding), so conditions
# are paired by seed.
V5_CONDITIONS = ("scratch_random", "pretrained_random", "pretrained_plain", "pretrained_steer")
V5_MODEL = {
    "scratch_random": "scratch",
    "pretrained_random": "pretrained",
    "pretrained_plain": "pretrained",
    "pretrained_steer": "pretrained",
}
V5_TRAINING = {
    "scratch_random": "random",
    "pretrained_random": "random",
    "pretrained_plain": "plain",
    "pretrained_steer": "steer",
}
# the two models (SegmentationModule keywords besides the data's), fixed by the protocol
V5_MODELS: dict[str, dict[str, Any]] = {
    # Evidence v4's model and schedule (the recipes' basic_unet: AdamW 3e-3, cosine, constant-LR tail)
    "scratch": {"network": "basic_unet", "features": (16, 16, 32, 64, 128, 16), "lr": 3e-3, "lr_tail": 0.25},
    # the pretrained EfficientNet-Lite0 U-Net (issue 43), its recipe's fine-tuning schedule
    "pretrained": {
        "network": "lite0_unet",
        "pretrained": True,
        "lr": 1e-3,
        "encoder_lr_mult": 0.1,
        "warmup_epochs": 1,
        "lr_tail": 0.25,
    },
}


def v5_model(cond: str) -> dict[str, Any]:
    """The SegmentationModule keywords of a v5 condition's model.

    >>> v5_model("scratch_random")["network"], v5_model("pretrained_plain")["network"]
    ('basic_unet', 'lite0_unet')
    """
    return dict(V5_MODELS[V5_MODEL[cond]])


def v5_condition_kwargs(cond: str) -> dict[str, Any]:
    """What a v5 condition trains with (config.yaml and result.json): its model and its training.

    >>> v5_condition_kwargs("pretrained_plain")["dose"], v5_condition_kwargs("scratch_random")["dose"]
    (0.0, 0.5)
    """
    training = V5_TRAINING[cond]
    out: dict[str, Any] = {"model": V5_MODEL[cond], "model_kwargs": v5_model(cond), "training": training}
    if training in ("random", "steer"):
        out["metamorphic_training"] = dict(V4_RANDOM)
    if training == "steer":
        out["mining"] = dict(V5_STEER)
    out["dose"] = 0.0 if training == "plain" else V4_RANDOM_DOSE
    return out


# mining v2 (issue 44): half of random augmentation's draws steered by the failure conditions a train probe
# of 32 training cases finds every epoch with the training families' suite (the recipe's settings, mining.yaml)
V5_STEER: dict[str, Any] = {**STEER_DEFAULTS, "train_probe_size": 32, "every_n_epochs": 1}


def _condition_recipe(protocol: str, cond: str) -> tuple[str, dict | None, dict[str, Any]]:
    """What a pre-registered condition trains with: the :func:`training_callbacks` condition, the
    ``MetamorphicTraining`` keywords (None: none) and the keywords it sets for :func:`training_callbacks`."""
    if protocol == "v4":
        if cond == "mined_dose":  # mined replay at random augmentation's dose
            mining = {k: v for k, v in V4_MINED.items() if k != "replay_ratio"}
            return "mined", None, {"mining": mining, "ratio": V4_MINED["replay_ratio"]}
        return "plain", None if cond == "plain" else V4_MT[cond], {}
    training = V5_TRAINING[cond]
    if training == "steer":  # the MR callback's suite (training families only) probes training cases
        steer = {k: v for k, v in V5_STEER.items() if k not in ("train_probe_size", "every_n_epochs")}
        probe = {"probe": V5_STEER["train_probe_size"], "mine_every": V5_STEER["every_n_epochs"]}
        return "steered", None, {"mining": steer, **probe}
    return "plain", None if training == "plain" else dict(V4_RANDOM), {}


def condition_callbacks(
    protocol: str,
    cond: str,
    dm: Any,
    perturbations: Sequence[str],
    severities: Sequence[int],
    *,
    seed: int,
    train_seed: int,
    ratio: float = 0.2,
    **kw: Any,
) -> tuple[list, MetamorphicCallback]:
    """Callbacks of the pre-registered condition ``cond`` of Evidence ``protocol``: ``"v4"``
    (:data:`V4_CONDITIONS`) or ``"v5"`` (:data:`V5_CONDITIONS`; its ``random`` is v4's, in-place random
    augmentation at q = 0.5). ``perturbations`` are the in-family training families; the other keywords as
    :func:`training_callbacks`. A ``MetamorphicTraining`` condition trains over the ``plain`` layout's clean
    slots (:func:`_mt_callback`), on the families :func:`v4_training_families` gives it.
    """
    conditions = {"v4": V4_CONDITIONS, "v5": V5_CONDITIONS}[protocol]
    if cond not in conditions:
        raise ValueError(f"{protocol} condition must be one of {conditions}, got {cond!r}")
    kind, mt, own = _condition_recipe(protocol, cond)
    # train_seed reaches training_callbacks for every kind; only its steered and MT conditions draw with it
    args = {"seed": seed, "ratio": ratio, "train_seed": train_seed, **kw, **own}
    cbs, mr = training_callbacks(kind, dm, perturbations, severities, **args)
    if mt is None:
        return cbs, mr
    fams = v4_training_families(cond, perturbations)
    return [*cbs, _mt_callback(dm, fams, severities, ratio, train_seed, kw.get("run_dir"), mt)], mr
