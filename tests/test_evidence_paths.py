"""What an evidence run writes names no machine path (issue 47): config.yaml's output folder is
relative to the run folder (the data folder is $DATA_ROOT), and rescore.sh finds its checkpoint beside itself."""

import argparse
import subprocess

import yaml

from benchmarks.evidence.artifacts import write_config, write_rescore


def _args(tmp_path):
    return argparse.Namespace(
        dataset="synthetic",
        size=32,
        data_seed=0,
        out=str(tmp_path / "runs"),
        data_root=str(tmp_path / "data"),
    )


def test_config_yaml_keeps_its_folders_relative_to_the_run(tmp_path):
    run = tmp_path / "runs" / "synthetic_v4" / "plain_s0"
    run.mkdir(parents=True)
    write_config(run, _args(tmp_path), "plain", 0, (4, 4, 8, 8, 16, 4), ["blur"], (2,), None)
    text = (run / "config.yaml").read_text()
    args = yaml.safe_load(text)["evidence"]["args"]
    assert str(tmp_path) not in text
    assert args["out"] == "../.." and args["data_root"] == "$DATA_ROOT" and args["size"] == 32


def test_rescore_sh_runs_the_checkpoint_beside_it_wherever_the_run_moved(tmp_path):
    run = tmp_path / "runs" / "plain_s0"
    run.mkdir(parents=True)
    write_rescore(run, _args(tmp_path), (4, 4, 8, 8, 16, 4), ["least_loss"])
    text = (run / "rescore.sh").read_text()
    assert str(tmp_path) not in text and 'ckpt="$RUN/checkpoints/$POLICY.ckpt"' in text
    moved = tmp_path / "elsewhere"
    run.rename(moved)
    # the checkpoint path as the shell expands it (the CLI replaced by echo): the moved folder's
    script = (moved / "rescore.sh").read_text().replace("python -m robusttrain", "echo")
    (moved / "echo.sh").write_text(script)
    out = subprocess.run(
        ["sh", str(moved / "echo.sh"), "F", "O"], capture_output=True, text=True, check=True
    ).stdout
    assert f"ckpt={moved}/checkpoints/least_loss.ckpt" in out
