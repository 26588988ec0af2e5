"""``robusttrain check`` audits with exactly the MR suite the checkpoint's run trained with (its
config.yaml), unless the command line sets the suite itself."""

from __future__ import annotations

from omegaconf import OmegaConf

from robusttrain.cli.compose import compose_recipe
from robusttrain.cli.tools import _training_suite


def test_check_reads_the_runs_suite_unless_overridden(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    trained = compose_recipe(
        "smoke",
        [
            f"run_dir={run}",
            "callbacks.metamorphic.suite.perturbations=[blur]",
            "callbacks.metamorphic.suite.severities=[3]",
            "seed=7",
        ],
    )
    OmegaConf.save(trained, run / "config.yaml", resolve=True)
    recipe = compose_recipe("smoke", [f"run_dir={run}"])  # today's recipe: another suite
    mr = OmegaConf.to_container(recipe.callbacks.metamorphic, resolve=True)
    suite = _training_suite(run / "checkpoints" / "last.ckpt", mr, overridden=False)
    assert (suite.names, suite.severities, suite.seed) == (["blur"], [3], 7)
    own = _training_suite(run / "checkpoints" / "last.ckpt", mr, overridden=True)
    assert own.names == ["contrast", "blur", "specularity", "instrument"] and own.severities == [4]


def test_check_reads_the_runs_heldout_families_as_plain_values(tmp_path):
    import pytest

    from robusttrain.cli.errors import UsageError
    from robusttrain.cli.tools import _run_heldout, heldout_value

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "last.ckpt"
    assert _run_heldout(ckpt) is None  # no config.yaml
    trained = compose_recipe("smoke", [f"run_dir={run}", "callbacks.metamorphic.heldout=[motion_blur]"])
    OmegaConf.save(trained, run / "config.yaml", resolve=True)
    assert _run_heldout(ckpt) == ["motion_blur"]
    (run / "config.yaml").write_text("callbacks:\n  metamorphic:\n    heldout: {_target_: os.system}\n")
    with pytest.raises(UsageError, match=r"key 'callbacks.metamorphic.heldout._target_' is not allowed"):
        _run_heldout(ckpt)
    assert heldout_value("a,b") == ["a", "b"] and heldout_value("[a]") == "a"
