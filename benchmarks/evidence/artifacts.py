"""What an Evidence v3 run keeps outside the repository, and how a third party re-scores it.

Per run directory (``<out>/<dataset>/<condition>_s<seed>/``):

- ``epochs/epoch=NNN.pt`` — the weights after every epoch (written atomically by the recorder; they
  let a killed run resume, and a post-hoc weight average be built from them: the balanced-average
  hook, see ``run.py``);
- ``checkpoints/<policy>.ckpt`` — one Lightning-compatible file (``{"state_dict", "epoch"}``) per
  checkpoint policy of the tables, loadable by ``python -m robusttrain test|check ckpt=...``;
- ``config.yaml`` — the run's settings plus ``callbacks.metamorphic.suite``, the exact MR suite the
  evidence scored with (``robusttrain check`` reads it from the checkpoint's parent folder);
- ``rescore.sh`` — the product's own commands that re-score a kept checkpoint on any image folder.

Evidence v4 adds ``followups.csv.gz`` (every follow-up's Dice: per case, test and scored checkpoint)
and ``fp16/{least_loss,last}.ckpt`` + ``fp16/config.yaml`` (the weights in half precision, ~1 MB each,
with the run's config beside them so ``robusttrain check`` finds the test suite; seed 0's are
committed by ``archive.py save --weights-seeds 0``; ``rescore.py`` re-scores them).
"""

from __future__ import annotations

import gzip
import io
import os
import shlex
from pathlib import Path

import torch

from robusttrain.io import atomic_write_bytes, atomic_write_text


def portable_args(args: dict, base: Path) -> dict:
    """``args`` as a record keeps them, with no machine path: ``out`` relative to ``base`` (the folder the
    record is written in, so moving the whole tree keeps it true) and ``data_root`` as ``$DATA_ROOT``
    (the data folder of whichever machine re-runs it; ``benchmarks/paths.py``).

    >>> portable_args({"out": "/data/runs", "data_root": "/data/shared", "seed": 0}, Path("/data/runs/polyp256_v4"))
    {'out': '..', 'data_root': '$DATA_ROOT', 'seed': 0}
    """
    kept = dict(args)
    if isinstance(kept.get("out"), str) and kept["out"]:
        kept["out"] = os.path.relpath(os.path.abspath(kept["out"]), os.path.abspath(base))
    if "data_root" in kept:
        kept["data_root"] = "$DATA_ROOT"
    return kept


def save_weights(path: Path, state_dict: dict, **extra) -> Path:
    """``{"state_dict": ..., **extra}`` written atomically (a killed run never leaves half a file)."""
    import lightning

    buf = io.BytesIO()
    # the version key makes it a Lightning checkpoint that Trainer.test(ckpt_path=...) accepts
    torch.save({"state_dict": state_dict, "pytorch-lightning_version": lightning.__version__, **extra}, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(path, buf.getvalue())


def save_fp16(path: Path, state_dict: dict, config: Path, **extra) -> Path:
    """``state_dict`` with its floating tensors in half precision (:func:`save_weights`), and a copy of the
    run's ``config`` beside it (``robusttrain check`` reads the MR suite from the checkpoint's folder).
    The product loads it into its fp32 model (``load_state_dict`` casts), so scores move only by the
    rounding of the weights."""
    half = {k: v.half() if v.is_floating_point() else v for k, v in state_dict.items()}
    save_weights(path, half, **extra)
    atomic_write_text(path.parent / "config.yaml", Path(config).read_text())
    return path


def write_followups(path: Path, frames, columns) -> Path:
    """The per-(case, test) follow-up Dice of every scored checkpoint as one gzip csv (no timestamp in
    the gzip header and Dice rounded to 6 digits: the same run gives the same bytes)."""
    import pandas as pd

    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(columns))
    text = df[list(columns)].round({"src_dice": 6, "fol_dice": 6}).to_csv(index=False)
    return atomic_write_bytes(path, gzip.compress(text.encode(), compresslevel=9, mtime=0))


def load_weights(path: Path) -> dict:
    """The state dict of a file written by :func:`save_weights` (weights only: never runs code)."""
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def overrides(args, features, network: str = "basic_unet") -> list[str]:
    """The ``recipe=polyp`` overrides that build this evidence's model and image size (``features``: the
    network's widths, None for its recipe's own; ``network`` is its recipe group, always named: the
    recipe's default model changed with Evidence v5)."""
    return [
        "recipe=polyp",
        f"model={network}",
        f"data.image_size={args.size}",
        *(
            ["model.features=[" + ",".join(str(int(f)) for f in features) + "]"]
            if features is not None
            else []
        ),
    ]


def write_config(
    run_dir: Path,
    args,
    cond: str,
    seed: int,
    features,
    perturbations,
    severities,
    condition_kwargs: dict | None,
    model: dict | None = None,
) -> Path:
    """``config.yaml``: the run's settings and the MR suite (``robusttrain check`` picks it up).

    ``model``: the run's SegmentationModule keywords (default: BasicUNet with ``features``); the
    network's name, widths and pretrained flag go into ``model`` (what ``check`` builds it from)."""
    net: dict[str, object] = {"network": "basic_unet", "features": [int(f) for f in features]}
    if model is not None and model.get("network", "basic_unet") != "basic_unet":
        net = {"network": model["network"], "pretrained": bool(model.get("pretrained", False))}
        if model.get("features") is not None:
            net["features"] = [int(f) for f in model["features"]]
    import yaml

    cfg = {
        "evidence": {
            "dataset": args.dataset,
            "condition": cond,
            "seed": int(seed),
            "condition_kwargs": condition_kwargs or {},
            "args": {
                k: v
                for k, v in sorted(portable_args(vars(args), run_dir).items())
                if isinstance(v, (int, float, str))
            },
        },
        # the v4 key order kept (same run, same bytes): network first, then the data's, then the widths
        "model": {
            "network": net.pop("network"),
            "in_channels": 3,
            "num_classes": 2,
            "class_names": ["polyp"],
            **net,
        },
        "data": {"image_size": int(args.size)},
        "callbacks": {
            "metamorphic": {
                "suite": {
                    "_target_": "robusttrain.metamorphic.suite.MRSuite",
                    "perturbations": list(perturbations),
                    "severities": [int(s) for s in severities],
                    "seed": int(args.data_seed),
                }
            }
        },
    }
    return atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))


def rescore_commands(
    run_dir: Path,
    args,
    features,
    policy: str = "least_loss",
    folder: str = "$FOLDER",
    out: str = "$OUT",
    network: str = "basic_unet",
) -> list[str]:
    """``test`` (clean Dice) and ``check`` (the MR suite) of one kept checkpoint on an image folder.

    ``data.val_fraction=0`` makes the whole folder the evaluated split (nothing is split off)."""
    ckpt = run_dir / "checkpoints" / f"{policy}.ckpt"
    common = [
        *overrides(args, features, network),
        f"data.root={folder}",
        "data.val_fraction=0",
        f"ckpt={ckpt}",
    ]
    py = "python -m robusttrain"
    return [
        f"{py} test "
        + " ".join(shlex.quote(o) if "$" not in o else o for o in common)
        + f" run_dir={out}/test logger=none",
        f"{py} check "
        + " ".join(shlex.quote(o) if "$" not in o else o for o in common)
        + f" run_dir={out}/check",
    ]


def write_rescore(run_dir: Path, args, features, policies, network: str = "basic_unet") -> Path:
    """``rescore.sh FOLDER OUT [POLICY]``: the product's CLI on a kept checkpoint (default least_loss); the
    checkpoint is found beside the script (``$RUN``), wherever the run folder was moved."""
    lines = [
        "#!/bin/sh",
        "# Re-score a kept checkpoint of this run on any image folder with the product's CLI.",
        "# usage: sh rescore.sh FOLDER OUT [POLICY]   (POLICY: one of " + ", ".join(policies) + ")",
        "set -e",
        'FOLDER="$1"; OUT="$2"; POLICY="${3:-least_loss}"',
        'RUN=$(cd "$(dirname "$0")" && pwd)',
    ]
    cmds = rescore_commands(Path("$RUN"), args, features, "$POLICY", '"$FOLDER"', '"$OUT"', network)
    lines += [
        c.replace("ckpt=$RUN/checkpoints/$POLICY.ckpt", 'ckpt="$RUN/checkpoints/$POLICY.ckpt"') for c in cmds
    ]
    return atomic_write_text(run_dir / "rescore.sh", "\n".join(lines) + "\n")
