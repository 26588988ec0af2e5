"""Turn a composed recipe into objects: run directory, datamodule, model, callbacks, loggers, trainer.

Everything is created by ``_target_`` instantiation; this module adds no behaviour of its own
beyond the run directory and mapping construction errors to one clear line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from robusttrain.cli.errors import UsageError
from robusttrain.io import atomic_write_text


RUN_DIR_ENV = "ROBUSTTRAIN_RUN_DIR"


@dataclass
class Run:
    cfg: DictConfig
    run_dir: Path
    datamodule: Any
    model: Any
    trainer: L.Trainer | None = None
    callbacks: list = field(default_factory=list)


def resolve_run_dir(cfg: DictConfig) -> Path:
    """Fill ``cfg.run_dir`` (default ``runs/<recipe>/<timestamp>/``), create it, and resolve the config."""
    with open_dict(cfg):
        if not cfg.get("run_dir"):
            # Lightning's DDP launcher re-runs this command for the other ranks seconds later; they
            # inherit the environment, so they find the same timestamped directory here.
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            child = os.environ.get("LOCAL_RANK", "0") != "0"
            inherited = os.environ.get(RUN_DIR_ENV) if child else None
            cfg.run_dir = inherited or str(Path("runs") / str(cfg.recipe) / stamp)
        cfg.run_dir = str(Path(cfg.run_dir).expanduser().resolve())
        os.environ[RUN_DIR_ENV] = cfg.run_dir
    run_dir = Path(cfg.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create run_dir '{run_dir}': {e.strerror}") from None
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:  # an interpolation typo in a user recipe
        raise UsageError(f"cannot resolve recipe: {e}".splitlines()[0]) from None
    return run_dir


def write_config(cfg: DictConfig, run_dir: Path) -> Path:
    return atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg))


def build(section: str, node: Any) -> Any:
    """Instantiate one ``_target_`` node; any failure becomes one line naming the section."""
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise UsageError(f"cannot build '{section}': {_one_line(cause)}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"cannot build '{section}': {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def build_callbacks(cfg: DictConfig) -> list:
    out = []
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is None:
            continue
        node = OmegaConf.to_container(node, resolve=True)
        if not node.pop("enabled", True):  # `callbacks.<name>.enabled=false` switches one off
            continue
        out.append(build(f"callbacks.{name}", node))
    return out


def build_loggers(cfg: DictConfig) -> list | bool:
    loggers = [build(f"logger.{name}", node) for name, node in (cfg.get("logger") or {}).items()
               if node is not None]
    return loggers or False


def build_run(cfg: DictConfig, with_trainer: bool = True) -> Run:
    """Seed, create the run directory and instantiate datamodule, model, callbacks and trainer."""
    # W&B never reaches for the network unless the user asks for it.
    os.environ.setdefault("WANDB_MODE", "offline")
    run_dir = resolve_run_dir(cfg)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build("data", cfg.data)
    model = build("model", cfg.model)
    _check_compatible(datamodule, model)
    run = Run(cfg=cfg, run_dir=run_dir, datamodule=datamodule, model=model)
    if with_trainer:
        run.callbacks = build_callbacks(cfg)
        trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
        trainer_cfg["callbacks"] = run.callbacks
        trainer_cfg["logger"] = build_loggers(cfg)
        run.trainer = build("trainer", trainer_cfg)
    write_config(cfg, run_dir)
    return run


def _check_compatible(datamodule: Any, model: Any) -> None:
    """Catch a recipe whose model does not fit its data before Lightning fails deep inside."""
    hp = getattr(model, "hparams", {})
    for attr in ("num_classes", "in_channels"):
        d, m = getattr(datamodule, attr, None), hp.get(attr) if hasattr(hp, "get") else None
        if d is not None and m is not None and int(d) != int(m):
            raise UsageError(f"model.{attr}={m} does not match the data ({type(datamodule).__name__} "
                             f"has {attr}={d}); set model.{attr}={d}")
