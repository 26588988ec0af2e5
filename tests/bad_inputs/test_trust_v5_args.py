"""Issue 46 ("Trust v5"), the argument findings: no argument is accepted to be ignored or misread.

4: a ``perturbations`` mapping's weights are honoured in the draws (they were dropped); 5: ``temperature=nan``
is refused (it was read as 0); 6: an argument with no effect under the others is refused with one line
saying why (``k=1`` with ``selection="augmax"`` was accepted and ignored), while every combination the
recipes and the evidence conditions use stays valid. The CLI runs in-process (as in ``test_trust_v4.py``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from robusttrain.callbacks import MetamorphicTraining
from robusttrain.training import WorstOfK

from .test_cli import TINY
from .test_trust_v4 import _run  # in-process CLI: exit code, one error line, no traceback

MT = "callbacks.metamorphic_training."


def _batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, 32, 32, generator=g)
    m = torch.zeros(n, 32, 32, dtype=torch.long)
    m[:, 8:16, 8:16] = 1
    return x, m


# ------------------------------------------------------------------------ 4: per-family weights
def test_a_perturbations_mapping_draws_the_families_by_its_weights():
    mt = MetamorphicTraining(perturbations={"blur": 0.9, "contrast": 0.1}, k=1, q=1.0, epsilon=1.0)
    assert mt.settings.perturbations == ["blur", "contrast"]
    wok, _ = mt.settings.samplers(["blur", "contrast"], 4)
    assert wok.family_probs().tolist() == pytest.approx([0.9, 0.1])
    x, m = _batch()
    drawn = [f for step in range(30) for row in wok(x, m, None, step=step).families for f in row]
    share = drawn.count("blur") / len(drawn)  # 240 draws: uniform would give ~0.5
    assert 0.82 < share < 0.97, share
    # with the check's rates, the weights take the uniform share's place: (1 - eps) * rates + eps * weights
    half = MetamorphicTraining(perturbations={"blur": 3, "contrast": 1}, epsilon=0.5).settings.samplers(
        ["blur", "contrast"], 4
    )[0]
    assert half.family_probs({"blur": 0.0, "contrast": 1.0}).tolist() == pytest.approx([0.375, 0.625])
    # a family dropped for the data (here: a colour family on grey images) leaves the others' weights
    wok1, _ = MetamorphicTraining(
        perturbations={"blur": 1, "saturation": 8, "contrast": 3}, k=1
    ).settings.samplers(["blur", "contrast"], 4)
    assert wok1.family_probs().tolist() == pytest.approx([0.25, 0.75])


@pytest.mark.parametrize(
    ("weights", "text"),
    [
        ({"blur": 0, "contrast": 1}, "bad weights {'blur': 0}"),
        ({"blur": math.nan}, "bad weights {'blur': nan}"),
        ({"blur": "high"}, "bad weights {'blur': 'high'}"),
        ({"endoscopy": 1.0}, "['endoscopy'] are suite names"),
        ({"blurr": 1.0}, "unknown perturbation 'blurr'"),
    ],
    ids=["zero", "nan", "text", "suite-name", "unknown-family"],
)
def test_a_bad_perturbations_mapping_is_refused_in_one_line(weights, text):
    with pytest.raises(ValueError, match=re.escape(text)) as err:
        MetamorphicTraining(perturbations=weights)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_cli_perturbation_weights_reach_the_draws(tmp_path, capsys):
    run = tmp_path / "run"
    _run(
        [
            "fit",
            *TINY,
            f"run_dir={run}",
            "trainer.max_epochs=1",
            MT + "perturbations={blur: 0.9, contrast: 0.1}",
        ],
        capsys,
        0,
    )
    rows = pd.read_csv(run / "metamorphic_training.csv")
    assert dict(zip(rows["family"], rows["weight"])) == pytest.approx({"blur": 0.9, "contrast": 0.1})


# ------------------------------------------------------------------------ 5: temperature=nan
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0], ids=["nan", "inf", "negative"])
def test_a_temperature_that_is_not_a_number_is_refused(value):
    with pytest.raises(ValueError, match="temperature must be a number >= 0") as err:
        MetamorphicTraining(k=4, temperature=value)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="WorstOfK: temperature must be >= 0"):
        WorstOfK(["blur"], k=4, temperature=value)


# ------------------------------------------------------------------------ 6: no argument ignored
UNUSED = [
    (dict(k=1, selection="augmax"), "selection='augmax' picks among k > 1 scored candidates"),
    (dict(k=1, selection="quantile"), "selection='quantile' picks among k > 1 scored candidates"),
    (dict(k=1, temperature=2.0), "temperature=2.0 samples among k > 1 scored candidates"),
    (
        dict(k=4, selection="quantile", temperature=2.0),
        "temperature=2.0 has no effect with selection='quantile'",
    ),
    (dict(k=4, quantile=0.5), "quantile=0.5 is read only with selection='quantile'"),
    (dict(k=4, mix="none", width=5), "width=5 chains are mixed only with mix='augmix'"),
    (dict(k=4, alpha=0.5), "alpha=0.5 is AugMix's mixing concentration, read only with mix='augmix'"),
]
MT_ONLY = [
    (dict(k=1, warmup=0.2), "warmup=0.2 delays the selection among k > 1 candidates"),
    (dict(k=1, score_scale=0.5), "score_scale=0.5 is the size candidates are scored at"),
    (
        dict(divergence="kl"),
        "divergence='kl' shapes the consistency term; objective='replace' has no consistency term",
    ),
    (dict(detach_source=True), "detach_source=True shapes the consistency term"),
    (dict(ramp=0.5), "ramp=0.5 shapes the consistency term"),
    (
        dict(record_per_step=0, record_every=10),
        "record_every=10 has nothing to record with record_per_step=0",
    ),
    (
        dict(perturbations=["blur"], max_cover=0.3),
        "max_cover=0.3 caps the lesion cover of occluding families",
    ),
]


@pytest.mark.parametrize(("kw", "text"), UNUSED + MT_ONLY, ids=lambda v: v if isinstance(v, str) else None)
def test_an_argument_without_effect_is_refused_naming_why(kw, text):
    with pytest.raises(ValueError, match=re.escape(text)) as err:
        MetamorphicTraining(**kw)
    assert "\n" not in str(err.value)
    if (kw, text) in UNUSED:  # the library's sampler applies the same rule
        with pytest.raises(ValueError, match="WorstOfK: ") as err:
            WorstOfK(["blur", "contrast"], **kw)
        assert text in str(err.value)


def test_the_recipes_and_the_evidence_conditions_stay_valid():
    """Every MetamorphicTraining combination shipped (the recipe's yaml, where every default is spelled
    out, and every Evidence v3 / v4 condition) is still built -- a default is not a setting."""
    from benchmarks.evidence.conditions import MT_CONDITIONS, MT_DEFAULTS, V4_MT
    from robusttrain.recipes import __file__ as recipes

    node = OmegaConf.load(
        Path(recipes).parent / "callbacks" / "metamorphic_training.yaml"
    ).metamorphic_training
    kw = {
        k: v
        for k, v in OmegaConf.to_container(node, resolve=False).items()
        if k not in ("_target_", "enabled")
    }
    kw.update(dirpath=None, seed=0)
    assert MetamorphicTraining(**kw).settings.k == 1
    for cond in MT_CONDITIONS:
        kwc = {**MT_DEFAULTS, **MT_CONDITIONS[cond]}
        if kwc["k"] == 1:
            del kwc["score_scale"]  # as training_callbacks builds it (tests/test_evidence_protocol.py)
        MetamorphicTraining(perturbations=["blur", "contrast"], severity_caps=4, **kwc)
    for kwv in V4_MT.values():
        MetamorphicTraining(perturbations=["blur", "contrast"], severity_caps=4, **kwv)
    # and an argument set away from its default where it acts is accepted
    MetamorphicTraining(k=4, selection="quantile", quantile=0.5, warmup=0.1, score_scale=0.5, temperature=0.0)
    MetamorphicTraining(k=4, temperature=1.0, selection="augmax")
    MetamorphicTraining(
        objective="consistency", consistency=1.0, divergence="kl", ramp=0.0, detach_source=True
    )
    MetamorphicTraining(mix="augmix", width=2, alpha=0.5, chain_depth=2)
    MetamorphicTraining(perturbations=["blur", "instrument"], max_cover=0.3)


@pytest.mark.parametrize(
    ("override", "text"),
    [
        (
            "temperature=nan",
            "bad value for 'callbacks.metamorphic_training.temperature' (nan): temperature must be a number >= 0",
        ),
        (
            "selection=augmax",
            "bad value for 'callbacks.metamorphic_training.selection' ('augmax'): selection='augmax' picks among k > 1",
        ),
        (
            "temperature=2.0",
            "bad value for 'callbacks.metamorphic_training.temperature' (2.0): temperature=2.0 samples among k > 1",
        ),
    ],
    ids=["temperature-nan", "k1-augmax", "k1-temperature"],
)
def test_cli_refuses_an_ignored_or_unreadable_training_argument_before_anything_is_written(
    tmp_path, capsys, override, text
):
    run = tmp_path / "run"
    _run(["fit", *TINY, f"run_dir={run}", MT + override], capsys, 2, text)
    assert not run.exists() or not any(run.iterdir())


@pytest.mark.parametrize(
    ("weights", "text"),
    [
        ({"blur": 1.0}, "missing ['contrast']"),
        ({"blur": 1.0, "contrast": 1.0, "gamma": 1.0}, "not families ['gamma']"),
        ({"blur": -1.0, "contrast": 1.0}, "weights must be finite numbers > 0"),
        ({"blur": math.inf, "contrast": 1.0}, "weights must be finite numbers > 0"),
    ],
    ids=["missing-family", "extra-family", "negative", "inf"],
)
def test_worst_of_k_weights_are_checked_when_built(weights, text):
    """The sampler's new ``weights`` argument (what a perturbations mapping becomes) fails when built."""
    with pytest.raises(ValueError, match=re.escape(text)):
        WorstOfK(["blur", "contrast"], weights=weights)
