"""CLI: help, error paths (one line, exit 2), user recipes, and a real 2-epoch smoke fit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from robusttrain.cli import main


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_lists_commands_and_recipes(capsys):
    code, out, _ = _run(capsys, "--help")
    assert code == 0
    for word in ("fit", "validate", "test", "check", "corners", "gallery", "report"):
        assert f"  {word} " in out
    assert "recipes: acdc, cxr, polyp, polyp_gpu, smoke" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("fit", "recipe=nope"),
            "unknown recipe 'nope'; available recipes: acdc, cxr, polyp, polyp_gpu, smoke",
        ),
        (("fit",), "missing recipe=NAME"),
        (
            ("fit", "recipe=smoke", "data.foo=1"),
            "unknown key 'data.foo'; valid keys under 'data': _target_, root",
        ),
        (("fit", "recipe=smoke", "foo=1"), "unknown key 'foo'; valid keys at the top level"),
        (
            ("fit", "recipe=smoke", "trainer.max_epochs=abc"),
            "bad value for 'trainer.max_epochs': 'abc' (expected an integer",
        ),
        (("fit", "recipe=smoke", "data.batch_size=[1,2]"), "bad value for 'data.batch_size'"),
        (
            ("fit", "recipe=smoke", "logger=foo"),
            "unknown logger 'foo'; valid choices: csv, none, tensorboard, wandb",
        ),
        (
            ("fit", "recipe=smoke", "model=foo"),
            "unknown model 'foo'; valid choices: attention_unet, basic_unet, flexible_unet, lite0_unet, segresnet, smp_unet, swin_unetr",
        ),
        (("validate", "recipe=smoke"), "validate needs ckpt=PATH"),
        (("frobnicate",), None),
    ],
)
def test_error_paths_are_one_line_exit_2(capsys, args, expected):
    code, out, err = _run(capsys, *args)
    assert code == 2
    if expected is not None:
        assert expected in err
        assert len(err.strip().splitlines()) == 1, err
    else:
        assert "unknown command 'frobnicate'" in err


def test_missing_checkpoint_and_data_root_are_named(capsys, tmp_path):
    code, _, err = _run(
        capsys, "test", "recipe=smoke", f"run_dir={tmp_path / 'r'}", f"ckpt={tmp_path / 'no.ckpt'}"
    )
    assert code == 2 and "checkpoint not found" in err and "no.ckpt" in err
    # a real process, so stderr is exactly what a user sees (no traceback, one error line)
    missing = tmp_path / "nowhere"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "fit",
            "recipe=smoke",
            f"run_dir={tmp_path / 'r2'}",
            f"data.root={missing}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("robusttrain fit: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and str(missing) in errors[0]
    assert "Traceback" not in proc.stderr


def test_user_recipe_folder_is_searched_first(capsys, tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text(
        "defaults:\n  - smoke\n  - _self_\nrecipe: mine\ntrainer:\n  max_epochs: 7\n"
    )
    monkeypatch.chdir(tmp_path)
    from robusttrain.cli.compose import available_recipes, compose_recipe

    assert "mine" in available_recipes() and "polyp" in available_recipes()
    cfg = compose_recipe("mine", [])
    assert cfg.recipe == "mine" and cfg.trainer.max_epochs == 7 and cfg.data.image_size == 64


@pytest.mark.slow
def test_smoke_fit_through_the_cli_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "fit",
            "recipe=smoke",
            f"run_dir={run_dir}",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"run_dir={run_dir}" in proc.stdout
    assert "final validation val/dice=" in proc.stdout
    # the console carries no cloud-logger advert and no deprecation Lightning raises inside itself
    assert "litlogger" not in proc.stdout + proc.stderr
    assert "LeafSpec" not in proc.stdout + proc.stderr
    assert (run_dir / "config.yaml").is_file()
    assert "recipe: smoke" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "logs" / "metrics.csv").is_file()
    # the checkpoint validates through the CLI too
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "validate",
            "recipe=smoke",
            f"run_dir={run_dir}",
            "ckpt=last",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation val/dice=" in proc.stdout

    # a resumed run continues where it stopped: epoch 2 is added, epochs 0-1 are kept
    import pandas as pd

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "fit",
            "recipe=smoke",
            f"run_dir={run_dir}",
            "ckpt=last",
            "trainer.max_epochs=3",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = pd.read_csv(run_dir / "history.csv")
    assert sorted(set(history.epoch)) == [0, 1, 2]
    assert sorted(set(pd.read_csv(run_dir / "efr.csv").epoch)) == [0, 1, 2]

    # the robustness tools read the same run directory
    assert main(["corners", str(run_dir)]) == 0
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    assert '<section id="efr-table">' in html and "data:image/png;base64," in html
    check_dir = tmp_path / "check"
    assert (
        main(
            ["check", "recipe=smoke", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", f"run_dir={check_dir}"]
        )
        == 0
    )
    md = (check_dir / "efr_table.md").read_text()
    assert "### EFR (%) at t = 0.25" in md and "| blur |" in md and "Clean, no perturbation: val: Dice " in md
    assert "| clean |" not in md  # the clean Dice is not in the EFR columns (issue 48)


def test_tool_error_paths(capsys, tmp_path):
    code, _, err = _run(capsys, "corners", str(tmp_path / "missing"))
    assert code == 2 and "missing" in err
    code, _, err = _run(capsys, "report", str(tmp_path / "missing"))
    assert code == 2 and "run directory not found" in err
    code, _, err = _run(capsys, "check", "recipe=smoke", f"ckpt={tmp_path / 'x.ckpt'}")
    assert code == 2 and "x.ckpt" in err
    code, _, err = _run(capsys, "gallery", "recipe=smoke", "bogus=1")
    assert code == 2 and "unknown key 'bogus'" in err
    code, _, err = _run(capsys, "gallery", "recipe=smoke", "n=abc")
    assert code == 2 and "bad value for 'n': 'abc'" in err
    code, _, err = _run(capsys, "gallery", "recipe=smoke", "colors=300")
    assert code == 2 and "bad value for 'colors': '300'" in err
    code, _, err = _run(capsys, "gallery", "recipe=smoke", "tile=8")
    assert code == 2 and "bad value for 'tile': '8'" in err


def test_gallery_renders_a_png(tmp_path):
    out = tmp_path / "g.png"
    assert main(["gallery", "recipe=smoke", f"out={out}", "n=1"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    small = tmp_path / "p.png"  # palette PNG at a smaller tile: what docs/ keeps
    assert main(["gallery", "recipe=smoke", f"out={small}", "n=1", "tile=96", "colors=64"]) == 0
    from PIL import Image

    with Image.open(small) as im:
        assert im.mode == "P" and im.width == 4 * 96


def test_gallery_keeps_placed_objects_off_the_lesion_as_training_does(tmp_path):
    # the gallery used to draw without masks, so blood or feces could sit on the polyp there while training
    # and the check keep it clear; now every lesion pixel of every perturbed tile is the original's
    import cv2

    from robusttrain.cli.build import build
    from robusttrain.cli.compose import compose_recipe

    fams = ["feces", "blood", "instrument", "specularity"]
    out = tmp_path / "g.png"
    suite = f"callbacks.metamorphic.suite.perturbations=[{','.join(fams)}]"
    assert main(["gallery", "recipe=smoke", suite, f"out={out}", "n=2", "tile=64"]) == 0
    grid = cv2.imread(str(out))[:, :, ::-1]
    dm = build("data", compose_recipe("smoke", []).data)
    dm.setup("fit")
    masks = [dm.val_dataset[i]["mask"].numpy() for i in range(2)]  # the gallery's images: the first two
    assert grid.shape == (2 * len(fams) * 64, 4 * 64, 3) and all(m.shape == (64, 64) for m in masks)
    changed_outside = 0
    for i, mask in enumerate(masks):
        lesion = mask > 0
        lesion[:17] = False  # the label bar is drawn over each tile's top rows
        assert lesion.sum() > 50
        for f in range(len(fams)):
            row = grid[(i * len(fams) + f) * 64 : (i * len(fams) + f + 1) * 64]
            original = row[:, :64]
            for t in range(1, 4):
                tile = row[:, t * 64 : (t + 1) * 64]
                assert (tile[lesion] == original[lesion]).all(), (i, fams[f], t)
                changed_outside += int((tile[17:] != original[17:]).any())
    assert changed_outside >= 12  # most tiles are perturbed (off the lesion): the comparison can fail


def test_named_extra_validation_sets_can_be_added_on_the_command_line():
    from robusttrain.cli.compose import compose_recipe

    cfg = compose_recipe("polyp", ["data.root=/data/kvasir", "data.extra_val.etis=/data/etis"])
    assert dict(cfg.data.extra_val) == {"etis": "/data/etis"}
    with pytest.raises(Exception, match="unknown key 'data.nope.x'; valid keys under 'data': _target_, root"):
        compose_recipe("polyp", ["data.nope.x=1"])


@pytest.mark.slow
def test_ddp_fit_through_the_cli_shares_one_default_run_directory(tmp_path):
    # Lightning re-runs the command for rank 1 seconds later: it must find rank 0's timestamped folder.
    env = dict(os.environ, WANDB_MODE="offline")
    env.pop("ROBUSTTRAIN_RUN_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttrain",
            "fit",
            "recipe=smoke",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            "trainer.accelerator=cpu",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = list((tmp_path / "runs" / "smoke").iterdir())
    assert len(runs) == 1, runs
    assert proc.stdout.count("final validation val/dice=") == 1  # printed by rank 0 only
    for name in (
        "config.yaml",
        "history.csv",
        "efr.csv",
        "corner_cases.json",
        "balanced.ckpt",
        "balanced_average.ckpt",
        "balanced_average.json",
    ):  # rank 0 wrote them, both ranks agreed
        assert (runs[0] / name).is_file(), name
    assert not (runs[0] / "balanced_average_window").exists()


def test_each_robustness_callback_can_be_switched_off():
    from robusttrain.cli.build import build_callbacks
    from robusttrain.cli.compose import compose_recipe

    names = lambda cbs: sorted(type(c).__name__ for c in cbs)  # noqa: E731
    on = names(build_callbacks(compose_recipe("smoke", ["run_dir=/tmp/x"])))
    assert on == [
        "BalancedAverage",
        "BalancedCheckpoint",
        "EMACheckpoint",
        "FailureMiningCallback",
        "MetamorphicCallback",
        "MetamorphicTraining",
        "RobustnessReporter",
        "RunCheckpoint",
    ]
    off = names(
        build_callbacks(
            compose_recipe(
                "smoke",
                [
                    "run_dir=/tmp/x",
                    "callbacks.mining.enabled=false",
                    "callbacks.reporting.enabled=false",
                    "callbacks.balanced_average.enabled=false",
                    "callbacks.ema.enabled=false",
                    "callbacks.metamorphic_training.enabled=false",
                ],
            )
        )
    )
    assert off == ["BalancedCheckpoint", "MetamorphicCallback", "RunCheckpoint"]


def test_recipe_mining_steers_random_augmentation_and_goes_off_with_it(capsys):
    """The polyp recipe holds mining v2 (steer) beside random augmentation; switching the augmentation or the
    MR check off switches the mining that steers it off too, with a line saying so (not a fit-time refusal)."""
    from robusttrain.callbacks import FailureMiningCallback
    from robusttrain.cli.build import build_callbacks
    from robusttrain.cli.compose import compose_recipe

    (mining,) = [
        c
        for c in build_callbacks(compose_recipe("polyp", ["run_dir=/tmp/x"]))
        if isinstance(c, FailureMiningCallback)
    ]
    assert mining.mode == "steer" and mining.train_probe_size == 32
    cbs = build_callbacks(
        compose_recipe("polyp", ["run_dir=/tmp/x", "callbacks.metamorphic_training.enabled=false"])
    )
    assert not any(isinstance(c, FailureMiningCallback) for c in cbs)
    assert (
        "callbacks.mining is off: in steer mode it steers callbacks.metamorphic_training"
        in capsys.readouterr().out
    )
    replay = build_callbacks(
        compose_recipe(
            "polyp",
            [
                "run_dir=/tmp/x",
                "callbacks.metamorphic_training.enabled=false",
                "callbacks.mining.mode=replay",
            ],
        )
    )
    assert [c.mode for c in replay if isinstance(c, FailureMiningCallback)] == [
        "replay"
    ]  # replay needs no augmentation
    cbs = build_callbacks(compose_recipe("polyp", ["run_dir=/tmp/x", "callbacks.metamorphic.enabled=false"]))
    assert not any(isinstance(c, FailureMiningCallback) for c in cbs)
    assert (
        "callbacks.mining is off: in steer mode it mines the failures of callbacks.metamorphic's check"
        in capsys.readouterr().out
    )
