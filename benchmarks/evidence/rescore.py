"""Re-score a kept Evidence v4 or v5 checkpoint on any image folder, through the product's own CLI.

    python -m benchmarks.evidence.rescore docs/evidence_v4/runs/random_s0/least_loss.ckpt FOLDER OUT

runs (and prints) exactly::

    python -m robusttrain check recipe=polyp model=basic_unet data.image_size=128 \\
        'model.features=[16,16,32,64,128,16]' data.root=FOLDER data.val_fraction=0 ckpt=CKPT \\
        run_dir=OUT heldout=motion_blur,gamma,...

with the image size, network widths and held-out families read from the ``config.yaml`` beside the
checkpoint (the run's own); ``check`` finds that same file and audits with the run's test suite (the
in-family and the held-out families, the evidence's severities and seed); ``heldout=`` labels the
families the run never trained on, so the tables pool them apart (``held-out families`` /
``trained families``) as the evidence's endpoints do. ``data.val_fraction=0``: the whole folder
is the scored split. The checkpoint holds fp16 weights; the product loads them into its fp32 model,
so a number can differ from the run's own in the third decimal (the weights' rounding).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path


def cli_command(ckpt: Path, folder: str, out: str, python: str = sys.executable) -> list[str]:
    """The ``robusttrain check`` command line for ``ckpt`` (its folder's ``config.yaml`` gives the model).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "config.yaml").write_text(
    ...     "data: {image_size: 64}\\nmodel: {features: [4, 4, 8, 8, 16, 4]}\\n"
    ...     "evidence: {condition_kwargs: {heldout_families: [gamma, jpeg]}}\\n")
    >>> cmd = cli_command(d / "last.ckpt", "F", "O", "python")
    >>> " ".join(cmd[4:8]), cmd[-1]
    ('recipe=polyp model=basic_unet data.image_size=64 model.features=[4,4,8,8,16,4]', 'heldout=gamma,jpeg')
    """
    import yaml

    where = ckpt.parent / "config.yaml"
    try:
        cfg = yaml.safe_load(where.read_text())
        size = int(cfg["data"]["image_size"])
        network = str(
            cfg["model"].get("network", "basic_unet")
        )  # v5: the pretrained U-Net's own recipe group
        if network not in ("basic_unet", "lite0_unet"):
            raise ValueError(f"model.network {network!r} is not an evidence model")
        widths = cfg["model"].get("features") if network != "basic_unet" else cfg["model"]["features"]
        feats = ",".join(str(int(f)) for f in widths) if widths is not None else None
        held = ((cfg.get("evidence") or {}).get("condition_kwargs") or {}).get("heldout_families") or []
        if not isinstance(held, list):  # a lone string would pass letter by letter
            raise TypeError(f"heldout_families is {type(held).__name__}, expected a list")
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(
            f"evidence_rescore: {where}: expected data.image_size, model.features (integers) and optionally "
            f"evidence.condition_kwargs.heldout_families ({type(e).__name__}: {' '.join(str(e).split())})"
        ) from None
    for f in held:  # names go on a command line: plain family names only, nothing the shell or CLI parses
        if not (isinstance(f, str) and f.replace("_", "").isalnum()):
            raise SystemExit(f"evidence_rescore: {where}: heldout_families has {f!r}, expected family names")
    return [
        python,
        "-m",
        "robusttrain",
        "check",
        "recipe=polyp",
        f"model={network}",  # always named: recipe=polyp's default model changed with Evidence v5
        f"data.image_size={size}",
        *([f"model.features=[{feats}]"] if feats is not None else []),
        f"data.root={override_value(folder)}",
        "data.val_fraction=0",
        f"ckpt={override_value(str(ckpt))}",
        f"run_dir={override_value(out)}",
        *([f"heldout={','.join(held)}"] if held else []),
    ]


# characters Hydra's override grammar reads as syntax in an unquoted value (a comma makes a sweep list:
# "Ambiguous value"), so a path holding one goes in quotes
_HYDRA_SYNTAX = frozenset(",[]{}()='\" \t\\$:*?<>|&;#")


def override_value(path: str) -> str:
    """``path`` as the value of a ``key=value`` override: as is when Hydra reads it as a plain string,
    else in single quotes (double quotes when it holds a single one). A path holding both quotes, a
    backslash or ``${`` (an interpolation, resolved even in quotes) is refused in one line.

    >>> override_value("/data/kvasir"), override_value("/data/a,b")
    ('/data/kvasir', "'/data/a,b'")
    >>> print(override_value("/data/it's"))
    "/data/it's"
    """
    if not set(path) & _HYDRA_SYNTAX:
        return path
    if "\\" in path or "${" in path or ("'" in path and '"' in path):
        raise SystemExit(
            f"evidence_rescore: {path!r}: a path with a backslash, '${{' or both quote characters cannot be "
            "passed to the robusttrain command line; rename or link it"
        )
    quote = '"' if "'" in path else "'"
    return f"{quote}{path}{quote}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "ckpt", type=Path, help="a kept checkpoint (docs/evidence_v4/runs/<condition>_s0/<policy>.ckpt)"
    )
    ap.add_argument("folder", help="an image folder the polyp recipe reads (images/, masks/)")
    ap.add_argument("out", help="the check's run directory (new or empty)")
    a = ap.parse_args(argv)
    ap.error = lambda msg: ap.exit(2, f"evidence_rescore: {msg}\n")  # type: ignore[method-assign,assignment]
    if not a.ckpt.is_file():
        ap.error(f"{a.ckpt}: no such checkpoint file")
    if not (a.ckpt.parent / "config.yaml").is_file():
        ap.error(
            f"{a.ckpt.parent / 'config.yaml'}: missing (the run's config travels beside its checkpoints)"
        )
    if not Path(a.folder).is_dir():
        ap.error(f"{a.folder}: not a folder")
    try:
        cmd = cli_command(a.ckpt, a.folder, a.out)
    except SystemExit as e:  # an untrusted config.yaml: one line, exit 2
        print(e.code, file=sys.stderr)
        return 2
    print("[evidence_rescore] " + " ".join(shlex.quote(c) for c in ["python", *cmd[1:]]), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
