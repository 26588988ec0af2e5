"""Issue 46 ("Trust v5"), the model findings: 10, a model that cannot run on the data's images failed at
the first training step (InstanceNorm at a 1x1 bottleneck, conv3d on 2-D images) after config.yaml and
logs/ were written; 14, ``recipe=smoke model=flexible_unet`` (or ``segresnet``) kept the recipe's U-Net
widths and failed. The CLI runs in-process (as in ``test_trust_v4.py``).
"""

from __future__ import annotations

import pytest
import torch
import yaml

from robusttrain.cli.build import build
from robusttrain.cli.compose import PACKAGE_RECIPES, _compose_raw, compose_recipe, group_options

from .test_cli import TINY
from .test_trust_v4 import _run  # in-process CLI: exit code, one error line, no traceback

SMALL = ["data.n_train=8", "data.n_val=4", "trainer.max_epochs=1", "trainer.enable_progress_bar=false"]


# ------------------------------------------------------------- 10: model / data checked before writing
@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        (
            ["recipe=polyp", "model=swin_unetr", "data.image_size=32"],
            "model.network=swin_unetr does not run on this data's images: one 2x3x32x32 batch failed in the "
            "network (Expected more than 1 spatial element when training",
        ),
        (
            [
                "recipe=smoke",
                "model=segresnet",
                "model.features=[16]",
                "model.spatial_dims=3",
                "data.image_size=32",
            ],
            "the data gives 2-D images: set model.spatial_dims=2",
        ),
    ],
    ids=["swin-unetr-1x1-bottleneck", "segresnet-3d-on-2d"],
)
def test_a_model_that_cannot_run_on_the_data_is_refused_before_anything_is_written(
    tmp_path, capsys, overrides, text
):
    run = tmp_path / "run"
    _run(["fit", *overrides, *SMALL, f"run_dir={run}"], capsys, 2, text)
    assert not run.exists() or not any(
        run.iterdir()
    )  # no config.yaml, no logs/: a corrected re-run just works


def test_the_dry_forward_leaves_the_model_and_the_random_state_as_they_were():
    from robusttrain.cli.build import _dry_forward

    cfg = compose_recipe("polyp", ["model=flexible_unet", "data.image_size=64"])  # batch norm layers
    dm, model = build("data", cfg.data), build("model", cfg.model)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    _dry_forward(dm, model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats restored
    assert torch.equal(rng, torch.get_rng_state()) and not model.training


# ------------------------------------------------------------- 14: a model group brings its own defaults
def test_choosing_a_model_group_gives_that_model_s_own_defaults():
    data_keys = {"in_channels", "num_classes", "class_names"}  # what a recipe's model block says of its data
    models = group_options("model")
    for recipe in ("smoke", "polyp", "polyp_gpu", "acdc", "cxr"):
        recipe_default = _compose_raw(recipe, []).model.network
        for group in models:
            own = yaml.safe_load((PACKAGE_RECIPES / "model" / f"{group}.yaml").read_text())
            if own["network"] == recipe_default:
                continue  # the recipe's own model keeps the recipe's tuning (asserted below for smoke)
            chosen = _compose_raw(recipe, [f"model={group}"]).model
            differ = {k: (chosen[k], v) for k, v in own.items() if k not in data_keys and chosen[k] != v}
            assert not differ, (recipe, group, differ)
    # the recipe's own model keeps its tuning; the user's override still wins
    assert list(compose_recipe("smoke", []).model.features) == [8, 8, 16, 16, 32, 8]
    assert list(compose_recipe("smoke", ["model=segresnet", "model.features=[8]"]).model.features) == [8]
    assert compose_recipe("polyp_gpu", []).model.pretrained is True


@pytest.mark.parametrize("group", ["flexible_unet", "segresnet"])
def test_smoke_with_another_model_group_builds(group):
    cfg = compose_recipe("smoke", [f"model={group}", "data.image_size=32"])
    model = build("model", cfg.model)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 2, 32, 32)  # two: batch norm at a 1x1 bottleneck


@pytest.mark.slow
def test_cli_smoke_with_segresnet_trains(tmp_path, capsys):
    run = tmp_path / "run"
    _run(["fit", *TINY, "model=segresnet", "trainer.max_epochs=1", f"run_dir={run}"], capsys, 0)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["features"] == [16]
