"""MetamorphicTraining's settings are written once (issue 47 item 2): one frozen MTSettings the callback
holds, whose fields are the callback's keyword arguments, the recipe keys the CLI accepts and the
settings the docs list."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from omegaconf import OmegaConf

from robusttrain.callbacks import MetamorphicTraining
from robusttrain.cli.build import build_callbacks
from robusttrain.cli.compose import PACKAGE_RECIPES, compose_recipe
from robusttrain.cli.errors import UsageError
from robusttrain.cli.help import command_help
from robusttrain.training.settings import MTSettings, setting_names

OWN = ("settings", "hooks", "dirpath", "context")  # the callback's arguments that are not settings


def test_the_callback_holds_one_frozen_settings_object():
    mt = MetamorphicTraining(k=1, q=0.25, perturbations="endoscopy", seed=3)
    s = mt.settings
    assert isinstance(s, MTSettings) and (s.k, s.q, s.seed, s.objective) == (1, 0.25, 3, "replace")
    assert s.perturbations and isinstance(s.perturbations, list)  # the suite name resolved once
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.k = 4  # type: ignore[misc]
    assert not hasattr(mt, "k")  # read through mt.settings, not a second copy on the callback
    assert MetamorphicTraining(settings=s).settings is s
    with pytest.raises(TypeError, match="settings=MTSettings"):
        MetamorphicTraining(settings=s, k=2)


def test_the_callbacks_signature_is_the_settings_fields_then_its_own_arguments():
    params = inspect.signature(MetamorphicTraining).parameters
    assert tuple(params) == setting_names() + OWN
    defaults = {f.name: f.default for f in dataclasses.fields(MTSettings) if f.init}
    assert {n: params[n].default for n in setting_names()} == defaults


def test_an_unknown_keyword_is_one_line_naming_it_and_the_settings():
    with pytest.raises(TypeError) as err:
        MetamorphicTraining(kk=1)
    line = str(err.value)
    assert "\n" not in line and "'kk'" in line and "record_per_step" in line


def test_a_bad_value_keeps_its_one_line():
    with pytest.raises(
        ValueError, match=r"^score_scale must be in \(0, 1\] \(1 = score at full size\), got 0$"
    ):
        MetamorphicTraining(score_scale=0)


def test_the_recipe_names_only_settings_and_the_docs_name_every_setting():
    node = OmegaConf.load(PACKAGE_RECIPES / "callbacks" / "metamorphic_training.yaml").metamorphic_training
    keys = [str(k) for k in node if k not in ("_target_", "enabled")]
    assert set(keys) - {"dirpath"} <= set(setting_names()), "a recipe key that is no setting"
    args = (MTSettings.__doc__ or "").split("Args:")[1]
    undocumented = [n for n in setting_names() if n not in args]
    assert not undocumented, f"settings missing from MTSettings' Args: {undocumented}"
    assert all(n in command_help("fit") for n in setting_names())


def test_the_cli_accepts_a_setting_the_recipe_leaves_out_and_checks_it():
    # record_every / record_per_step are settings the packaged recipe does not spell out: they were
    # refused as unknown keys
    cfg = compose_recipe("smoke", ["callbacks.metamorphic_training.record_per_step=5", "run_dir=/tmp/x"])
    assert cfg.callbacks.metamorphic_training.record_per_step == 5
    with pytest.raises(
        UsageError, match=r"'callbacks.metamorphic_training.record_every': 'abc' \(expected an integer"
    ):
        compose_recipe("smoke", ["callbacks.metamorphic_training.record_every=abc"])
    with pytest.raises(UsageError) as err:
        compose_recipe("smoke", ["callbacks.metamorphic_training.kk=1"])
    assert "valid keys under 'callbacks.metamorphic_training'" in str(err.value)
    assert "record_every, record_per_step" in str(err.value)
    # and the value reaches the settings' checks, named by its recipe key
    cfg = compose_recipe(
        "smoke",
        [
            "callbacks.metamorphic_training.record_per_step=0",
            "callbacks.metamorphic_training.record_every=10",
            "run_dir=/tmp/x",
        ],
    )
    with pytest.raises(
        UsageError, match="bad value for 'callbacks.metamorphic_training.record_every' \\(10\\)"
    ):
        build_callbacks(cfg)
