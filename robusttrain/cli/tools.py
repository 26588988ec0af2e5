"""``check``, ``corners``, ``gallery``, ``report``: thin glue from the command line to library code."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import open_dict

from robusttrain.cli.errors import UsageError


def _only(overrides: list[str], allowed: set[str], command: str) -> dict[str, str]:
    out = {}
    for o in overrides:
        k, v = o.split("=", 1)
        if k not in allowed:
            raise UsageError(f"unknown key '{k}' for {command}; valid keys: {', '.join(sorted(allowed))}")
        out[k] = v
    return out


def _sample_images(datamodule, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """First ``n`` validation images of a datamodule as HWC uint8, and their (H,W) masks (for the gallery:
    the families that place objects keep them off the lesion, as in training and in the check)."""
    datamodule.setup("fit")
    ds = datamodule.val_dataset
    images, masks = [], []
    for i in range(min(n, len(ds))):
        item = ds[i]
        img = item["image"].permute(1, 2, 0).numpy()
        if img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        images.append((np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8))
        masks.append(np.ascontiguousarray(item["mask"].numpy()))
    return images, masks


def _suite_names(cfg) -> list[str] | None:
    """The recipe's metamorphic suite (e.g. ``mri`` for acdc) with ``motion_blur``/``melt`` kept for
    endoscopy; None (the gallery's default, the endoscopy families) when the recipe names none."""
    from omegaconf import OmegaConf

    from robusttrain.perturbations.suites import resolve

    spec = OmegaConf.select(cfg, "callbacks.metamorphic.suite.perturbations", default=None)
    if spec is None or spec == "endoscopy":
        return None
    return resolve(spec if isinstance(spec, str) else list(spec))


def gallery(recipe: str | None, overrides: list[str], positional: list[str]) -> int:
    from robusttrain.cli.build import build
    from robusttrain.cli.compose import compose_recipe
    from robusttrain.perturbations.gallery import render_gallery

    if positional:
        raise UsageError(f"unexpected argument '{positional[0]}' (expected key=value)")
    own = ("out=", "n=", "tile=", "colors=")
    opts = [o for o in overrides if not o.startswith(own)]
    extra = _only([o for o in overrides if o.startswith(own)], {"out", "n", "tile", "colors"}, "gallery")
    n, tile, colors = extra.get("n", "2"), extra.get("tile", "192"), extra.get("colors")
    if not n.isdigit() or int(n) < 1:
        raise UsageError(f"bad value for 'n': {n!r} (expected a positive integer: images per gallery)")
    if not tile.isdigit() or int(tile) < 32:
        raise UsageError(f"bad value for 'tile': {tile!r} (expected an integer >= 32: pixels per tile)")
    if colors is not None and (not colors.isdigit() or not 2 <= int(colors) <= 256):
        raise UsageError(f"bad value for 'colors': {colors!r} (expected an integer in 2..256: palette PNG)")
    cfg = compose_recipe(recipe or "polyp", opts)
    out = output_file(extra.get("out", "gallery.png"), "out", ".png")
    images, masks = _sample_images(build("data", cfg.data), int(n))
    out = render_gallery(
        images,
        out,
        names=_suite_names(cfg),
        masks=masks,
        tile=int(tile),
        colors=None if colors is None else int(colors),
    )
    print(f"[robusttrain] gallery written to {Path(out).resolve()}")
    return 0


def report(recipe: str | None, overrides: list[str], positional: list[str]) -> int:
    from robusttrain.reporting.html import write_report

    opts = _only(overrides, {"out"}, "report")
    if recipe is not None or len(positional) != 1:
        raise UsageError("usage: report RUN_DIR [out=report.html]")
    run_dir = Path(positional[0])
    if not run_dir.is_dir():
        raise UsageError(f"run directory not found: '{run_dir}'")
    out = output_file(opts["out"], "out", ".html") if "out" in opts else None
    out = write_report(run_dir, out)
    print(f"[robusttrain] report written to {Path(out).resolve()}")
    return 0


def progress_bar(command: str):
    """``progress(name, total)`` for long commands: a tqdm bar on stderr (as Lightning's), one per
    dataset, so a long run is never mistaken for a hang."""

    def start(name: str, total: int):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"{command} {name}", unit="img", file=sys.stderr, mininterval=1.0)

    return start


NUMERIC_CORNER_OPTS = {"contamination": "(0, 0.5]", "worst_fraction": "(0, 1]"}


def corners(recipe: str | None, overrides: list[str], positional: list[str]) -> int:
    from robusttrain.cornercases.report import corners_report

    opts = _only(overrides, {"policy", "contamination", "tail", "metric", "worst_fraction"}, "corners")
    if recipe is not None or len(positional) != 1:
        raise UsageError(
            "usage: corners RUN_DIR_OR_HISTORY_CSV [policy=last_inlier|maximin|pareto|cvar] "
            "[worst_fraction=0.1]"
        )
    kwargs: dict = {k: v for k, v in opts.items() if k not in NUMERIC_CORNER_OPTS}
    for key, expected in NUMERIC_CORNER_OPTS.items():
        if key in opts:
            try:
                kwargs[key] = float(opts[key])
            except ValueError:
                raise UsageError(
                    f"bad value for '{key}': {opts[key]!r} (expected a number in {expected})"
                ) from None
    try:
        print(corners_report(positional[0], **kwargs))
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UsageError(str(e).strip().splitlines()[0]) from None
    return 0


def _load_model(cfg, ckpt: str):
    """The recipe's model (LightningModule or plain nn.Module) with the checkpoint's weights.

    The model is built from the recipe, never from the file: the checkpoint is read weights-only
    (robusttrain.checkpoints), so a checkpoint cannot run code, and it must fit the recipe's model.
    """
    from robusttrain.checkpoints import load_checkpoint
    from robusttrain.cli.build import build

    model = build("model", cfg.model)
    model.load_state_dict(load_checkpoint(ckpt, model)["state_dict"])
    return model


def output_file(value: str, key: str, suffix: str) -> Path:
    """An output path the command can write: not a folder, the right suffix, a creatable parent."""
    path = Path(value).expanduser()
    if path.is_dir() or value.endswith(("/", os.sep)):
        raise UsageError(
            f"bad value for '{key}': '{value}' is a directory (expected a file path ending in {suffix})"
        )
    if path.suffix.lower() != suffix:
        raise UsageError(f"bad value for '{key}': '{value}' (expected a file path ending in {suffix})")
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UsageError(f"bad value for '{key}': '{value}' -- '{parent}' is a file, not a folder")
    if parent is not None and not os.access(parent, os.W_OK):
        raise UsageError(f"bad value for '{key}': '{value}' -- folder '{parent}' is not writable")
    return path


SUITE_TARGET = "robusttrain.metamorphic.suite.MRSuite"
SUITE_KEYS = {"perturbations", "severities", "seed", "perturbation_kwargs", "slice_axis"}


def _plain(value: Any, where: str, source: Path) -> Any:
    """``value`` if it is plain data (str, number, bool, None, lists / mappings of them) without a
    ``_target_`` anywhere; else UsageError naming the key."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or k.startswith("_"):
                raise UsageError(
                    f"'{source}': key '{where}.{k}' is not allowed (a run directory's config is read "
                    "as plain values, never instantiated)"
                )
            _plain(v, f"{where}.{k}", source)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain(v, f"{where}[{i}]", source)
    elif not isinstance(value, (str, int, float, bool, type(None))):
        raise UsageError(f"'{source}': '{where}' holds a {type(value).__name__}; expected plain values")
    return value


def suite_from_run_config(source: Path) -> Any:
    """The MR suite a run trained with, from its ``config.yaml``, as plain validated values.

    The file comes from a run directory, possibly someone else's: it is parsed with ``yaml.safe_load``
    (no Python tags), only ``callbacks.metamorphic.suite`` is used, its ``_target_`` must be
    robusttrain's MRSuite and its keys MRSuite's own, and the suite is built by calling MRSuite
    directly -- nothing from the file is ever instantiated. None when the run had no MR suite.
    """
    import yaml

    from robusttrain.metamorphic.suite import MRSuite
    from robusttrain.rundir.paths import read_text

    try:
        run_cfg = yaml.safe_load(read_text(source.parent, source.name) or "")
    except yaml.YAMLError as e:
        raise UsageError(yaml_error_line(source, e)) from None
    node = run_cfg
    for key in ("callbacks", "metamorphic", "suite"):
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return None
    where = "callbacks.metamorphic.suite"
    if not isinstance(node, dict):
        raise UsageError(f"'{source}': '{where}' is a {type(node).__name__}, expected a mapping")
    target = node.get("_target_", SUITE_TARGET)
    if target != SUITE_TARGET:
        raise UsageError(
            f"'{source}': '{where}._target_' is {target!r}; expected {SUITE_TARGET} (a run "
            "directory's config is read as plain values, never instantiated)"
        )
    values = {k: v for k, v in node.items() if k != "_target_"}
    unknown = sorted(set(values) - SUITE_KEYS)
    if unknown:
        raise UsageError(
            f"'{source}': unknown key '{where}.{unknown[0]}'; valid keys: {', '.join(sorted(SUITE_KEYS))}"
        )
    _plain(values, where, source)
    try:
        return MRSuite(**{k: v for k, v in values.items() if v is not None or k == "perturbations"})
    except (ValueError, TypeError, KeyError) as e:
        raise UsageError(f"'{source}': bad '{where}': {str(e).strip().splitlines()[0]}") from None


def yaml_error_line(source: Path, e: Exception) -> str:
    """One line naming the YAML file and line of a parse error (``!!python/...`` tags included)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    return f"cannot read '{source}{line}': {problem}"


def _training_suite(ckpt: Path, mr: Any, overridden: bool) -> Any:
    """The MR suite the checkpoint's run trained with (its ``config.yaml``, as plain values), else
    the recipe's; the recipe's when the command line sets ``callbacks.metamorphic.suite.*`` itself."""
    from robusttrain.cli.build import build

    for d in () if overridden else (ckpt.parent, ckpt.parent.parent):
        if (d / "config.yaml").exists() or (d / "config.yaml").is_symlink():
            suite = suite_from_run_config(d / "config.yaml")
            if suite is not None:
                print(f"[robusttrain] check: the MR suite of {d / 'config.yaml'}", flush=True)
                return suite
    node = mr.get("suite") if hasattr(mr, "get") else None
    return build("callbacks.metamorphic.suite", node) if node is not None else None


def _run_heldout(ckpt: Path) -> Any:
    """``callbacks.metamorphic.heldout`` of the checkpoint's run (its ``config.yaml``), as a plain value:
    the families that run held out, so a check of its weights labels (and tests) them too."""
    import yaml

    from robusttrain.rundir.paths import read_text

    for d in (ckpt.parent, ckpt.parent.parent):
        source = d / "config.yaml"
        if source.exists():
            try:
                node = yaml.safe_load(read_text(d, "config.yaml") or "")
            except yaml.YAMLError as e:
                raise UsageError(yaml_error_line(source, e)) from None
            for key in ("callbacks", "metamorphic", "heldout"):
                node = node.get(key) if isinstance(node, dict) else None
            return _plain(node, "callbacks.metamorphic.heldout", source)
    return None


def heldout_value(text: str) -> str | list[str]:
    """The command line's ``heldout=`` value: a suite or family name, or a list (``a,b`` or ``[a,b]``).

    >>> heldout_value("endoscopy_heldout"), heldout_value("[gamma, jpeg]")
    ('endoscopy_heldout', ['gamma', 'jpeg'])
    """
    items = [p.strip().strip("'\"") for p in text.strip().strip("[]").split(",") if p.strip()]
    return items[0] if len(items) == 1 and "," not in text else items


def check(recipe: str | None, overrides: list[str], positional: list[str]) -> int:
    import torch

    from robusttrain.cli import check_output
    from robusttrain.cli.build import build, construction_error, resolve_run_dir, write_config
    from robusttrain.cli.compose import compose_recipe
    from robusttrain.metamorphic.audit import audit
    from robusttrain.metamorphic.heldout import heldout_families, label_heldout, trained_note, with_families
    from robusttrain.metamorphic.suite import MRSuite
    from robusttrain.rundir import check as check_file

    if positional:
        raise UsageError(f"unexpected argument '{positional[0]}' (expected key=value)")
    from robusttrain.checkpoints import check_file as check_ckpt_file
    from robusttrain.cli import split_option

    # heldout=: test-only families (held out from training), validated before anything is read
    given = [heldout_value(o.split("=", 1)[1]) for o in overrides if o.startswith("heldout=")]
    names = [o.split("=", 1)[1] for o in overrides if o.startswith("name=")]
    overrides = [o for o in overrides if not o.startswith(("heldout=", "name="))]
    try:
        heldout = heldout_families(given[-1]) if given else None
    except ValueError as e:
        raise UsageError(f"bad value for 'heldout': {str(e).removeprefix('heldout: ')}") from None
    split = split_option(overrides, "check")
    overrides = [o for o in overrides if o.split("=", 1)[0] != "split"]
    cfg = compose_recipe(recipe, overrides)
    ckpt = cfg.get("ckpt")
    if not ckpt or not Path(str(ckpt)).expanduser().exists():
        raise UsageError(f"check needs ckpt=PATH to an existing checkpoint, got ckpt={ckpt}")
    check_ckpt_file(str(ckpt))
    ckpt_path = Path(str(ckpt)).expanduser().resolve()
    data_root = _config_value(cfg, "data.root")
    out_dir, target = check_output.output_dir(
        cfg.get("run_dir"), ckpt_path, names[-1] if names else None, data_root, split
    )
    run = check_output.training_run(ckpt_path)  # the checkpoint's own run: what its weights trained on
    mr = (cfg.get("callbacks") or {}).get("metamorphic") or {}
    try:  # the suite validates its own arguments; a bad one is named before anything is written
        # exactly the suite the checkpoint's run trained with (its config.yaml), else the recipe's
        overridden = any(o.lstrip("+~").startswith("callbacks.metamorphic.suite") for o in overrides)
        suite = _training_suite(ckpt_path, mr, overridden) or MRSuite(seed=int(cfg.seed))
    except (ValueError, TypeError, KeyError) as e:
        raise UsageError(construction_error("callbacks.metamorphic", mr, e)) from None
    if heldout is None:  # the command line's callbacks.metamorphic.heldout, else the run's, else the recipe's
        own = any(o.lstrip("+~").startswith("callbacks.metamorphic.heldout") for o in overrides)
        run_value = None if own else _run_heldout(ckpt_path)
        try:
            heldout = heldout_families(run_value if run_value is not None else mr.get("heldout"))
        except ValueError as e:
            raise UsageError(
                f"bad value for 'callbacks.metamorphic.heldout': {str(e).removeprefix('heldout: ')}"
            ) from None
    # a family the run trained on is tested but never labelled held out (one rule: metamorphic/heldout.py)
    held, trained = label_heldout(heldout, check_output.trained_families(run))
    suite = with_families(suite, heldout)
    if out_dir is not None and target is not None:  # writing into a training run: hold its lock
        out_dir = check_output.hold_run(target, out_dir, explicit=bool(cfg.get("run_dir")))
    with open_dict(cfg):
        cfg.run_dir = out_dir
    run_dir = resolve_run_dir(cfg, "check")
    write_config(cfg, run_dir, "check")
    print(f"[robusttrain] check recipe={cfg.recipe} ckpt={ckpt} run_dir={run_dir}", flush=True)
    if target is not None and run_dir.is_relative_to(target.resolve()):
        print(
            f"[robusttrain] check: writing into the training run {target} (report {target} shows it)",
            flush=True,
        )
    if trained:
        print(f"[robusttrain] check: {trained_note(trained)}", flush=True)
    model = _load_model(cfg, str(ckpt))  # a bad checkpoint fails before the data is read
    dm = build("data", cfg.data)
    if hasattr(dm, "cache_mb") and not any(o.lstrip("+").startswith("data.cache_mb=") for o in overrides):
        dm.cache_mb = 0  # one streamed pass over the cases: a decoded-image cache would only hold memory
    dm.setup("fit")
    whole = split == "all" and getattr(dm, "root", None) is not None and hasattr(dm, "whole_dataset")
    # the whole folder is "folder" (not "all": that is the row pooling every family)
    datasets = {"folder": dm.whole_dataset()} if whole else {"val": dm.val_dataset}
    datasets.update({name: loader.dataset for name, loader in dm.extra_val_dataloaders().items()})
    what = (
        "every case of data.root (add split=val to score only its validation split)"
        if whole
        else "the validation split"
    )
    print(
        f"[robusttrain] check scores {what}: "
        + ", ".join(f"{k}: {len(v)} images" for k, v in datasets.items())
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = audit(
        model,
        datasets,
        suite,
        device=device,
        batch_size=int(mr.get("batch_size", 8)),
        max_cases=mr.get("max_cases"),
        class_names=getattr(dm, "class_names", None),
        always=list(getattr(dm, "planted_hard_cases", []) or []),
        heldout=held,
        progress=progress_bar("check"),
    )  # as the training-time check
    check_output.write_audit(run_dir, out)
    check_file.write_summary(
        run_dir,
        {
            "ckpt": str(ckpt_path),
            "training_run": None if run is None else str(run.resolve()),
            "data_root": data_root,
            "split": split if whole else "val",
            "datasets": {
                k: {
                    "cases": out["n_cases"][k] + out["n_empty"][k],
                    "scored_cases": out["n_cases"][k],
                    "empty_cases": out["n_empty"][k],
                }
                for k in out["n_cases"]
            },
            "heldout": list(held),
            "trained": trained,
            "thresholds": [float(t) for t in out["tables"]],
        },
    )
    print(check_output.first_line(out["n_cases"], out["n_empty"], out["empty"]), flush=True)
    print(out["markdown"])
    clean = "  ".join(f"{name}: Dice={v['dice']:.4f} IoU={v['iou']:.4f}" for name, v in out["clean"].items())
    print(
        f"[robusttrain] clean (mean over cases with a lesion) {clean} ("
        + ", ".join(f"{k}: {n} cases" for k, n in out["n_cases"].items())
        + ")"
    )
    print(
        f"[robusttrain] written to {run_dir}: efr_table.csv/.md, {check_file.CASES} (per case), "
        f"{check_file.FOLLOWUPS} (per follow-up), {check_file.EMPTY}, {check_file.SUMMARY}"
    )
    print(f"[robusttrain] run_dir={run_dir}", flush=True)
    return 0


def _config_value(cfg: Any, key: str) -> str | None:
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key, default=None)
    return None if value in (None, "") else str(value)
