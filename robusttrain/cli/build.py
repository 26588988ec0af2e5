"""Turn a composed recipe into objects: run directory, datamodule, model, callbacks, loggers, trainer.

Everything is created by ``_target_`` instantiation; this module adds no behaviour of its own
beyond the run directory and mapping construction errors to one clear line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from robusttrain.callbacks.failure_mining import resolve_mode
from robusttrain.cli import claim
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


def resolve_run_dir(cfg: DictConfig, command: str) -> Path:
    """Fill ``cfg.run_dir`` (default ``runs/<recipe>/<timestamp>/``), create and lock it for ``command``
    (see :mod:`robusttrain.cli.claim`), and resolve the config."""
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
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f"run_dir '{run_dir}' is not writable")
    claim.claim(run_dir, command)  # before anything is written into it
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:  # an interpolation typo in a user recipe
        raise UsageError(f"cannot resolve recipe: {e}".splitlines()[0]) from None
    return run_dir


def write_config(cfg: DictConfig, run_dir: Path, command: str = "fit") -> Path:
    """``config.yaml`` for fit; other commands write ``config.<command>.yaml`` beside it."""
    return atomic_write_text(run_dir / claim.config_name(command), OmegaConf.to_yaml(cfg))


def build(section: str, node: Any) -> Any:
    """Instantiate one ``_target_`` node; any failure becomes one line naming the config key.

    Objects validate their own arguments when constructed (ValueError/TypeError naming the
    argument); the argument named in the message is mapped back to its recipe key here, so
    ``callbacks.metamorphic.severities=[6]`` fails before training with
    ``bad value for 'callbacks.metamorphic.severities' ([6]): ...``.
    """
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    nested = {}
    if isinstance(node, dict):  # nested objects first, so their errors name their own keys
        nested = {
            k: build(f"{section}.{k}", v) for k, v in node.items() if isinstance(v, dict) and "_target_" in v
        }
        node = {k: v for k, v in node.items() if k not in nested}
    try:
        return instantiate(node, _convert_="all", **nested)
    except InstantiationException as e:
        cause = e.__cause__ or e
    except (TypeError, ValueError, KeyError) as e:
        cause = e
    raise UsageError(construction_error(section, node, cause)) from None


def construction_error(section: str, node: Any, err: BaseException) -> str:
    """One line for an object that refused its arguments, naming ``<section>.<key>`` when the
    message names one of the node's keys (the first one it mentions)."""
    msg = _one_line(err)
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    keys = [str(k) for k in node if not str(k).startswith("_")] if isinstance(node, dict) else []
    hits = {
        k: m.start()
        for k in keys  # the key, or its singular ("unknown perturbation 'x'")
        if (m := re.search(rf"(?<![\w.])({re.escape(k)}|{re.escape(_singular(k))})(?![\w])", msg))
    }
    if hits:
        key = min(hits, key=lambda k: (hits[k], -len(k)))
        return f"bad value for '{section}.{key}' ({node[key]!r}): {msg}"
    return f"cannot build '{section}': {msg}"


def _singular(word: str) -> str:
    return word[:-3] + "y" if word.endswith("ies") else word[:-1] if word.endswith("s") else word


def _one_line(e: BaseException) -> str:
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    text = str(text).strip()
    return text.splitlines()[0] if text else type(e).__name__


def build_callbacks(cfg: DictConfig) -> list:
    out = []
    callbacks = cfg.get("callbacks") or {}
    for name, node in callbacks.items():
        if node is None:
            continue
        spec: Any = OmegaConf.to_container(node, resolve=True)
        if not spec.pop("enabled", True):  # `callbacks.<name>.enabled=false` switches one off
            continue
        off = _steer_mining_off(spec, callbacks) if name == "mining" else None
        if off:
            print(f"[robusttrain] callbacks.mining is off: in steer mode it {off}, which is off", flush=True)
            continue
        out.append(build(f"callbacks.{name}", spec))
    return out


def _steer_mining_off(mining: dict, callbacks: Any) -> str | None:
    """Why the recipes' steer-mode mining goes off, or None. It mines the failures of the MR check and
    steers random augmentation's draws, so ``callbacks.metamorphic.enabled=false`` or
    ``callbacks.metamorphic_training.enabled=false`` alone switches it off too (the recipes' default, not a
    fit-time refusal). Replay mode is a deliberate choice: without the check it is refused at fit time."""

    def on(name: str) -> bool:
        node = callbacks.get(name)
        return node is not None and bool(node.get("enabled", True))

    if resolve_mode(mining.get("mode"), mining.get("replay_ratio")) != "steer":
        return None
    if not on("metamorphic"):
        return "mines the failures of callbacks.metamorphic's check"
    if not on("metamorphic_training"):
        return "steers callbacks.metamorphic_training's draws"
    return None


def build_loggers(cfg: DictConfig, command: str = "fit") -> list | bool:
    """The recipe's loggers; for commands other than fit each one with a ``version`` (sub-folder)
    logs to ``<command>`` instead, so a run's ``logs/metrics.csv`` is never touched by them."""
    loggers = []
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        spec: Any = OmegaConf.to_container(node, resolve=True)
        if command != "fit" and "version" in spec:
            spec["version"] = claim.logger_version(command)
        loggers.append(build(f"logger.{name}", spec))
    return loggers or False


def check_trainer(trainer_cfg: dict) -> None:
    """Refuse trainer settings that never end or do nothing (Lightning accepts them silently)."""
    epochs, steps, time = (trainer_cfg.get(k) for k in ("max_epochs", "max_steps", "max_time"))
    bounded = (isinstance(steps, int) and steps > 0) or bool(time)
    if epochs in (None, -1) and not bounded:
        raise UsageError(
            f"trainer.max_epochs={'null' if epochs is None else epochs} would train without an "
            "end (Lightning: -1 forever, null 1000 epochs); set a positive number of epochs, or "
            "bound the run with trainer.max_steps=N or trainer.max_time=DD:HH:MM:SS"
        )
    if epochs is not None and epochs != -1 and (not isinstance(epochs, int) or epochs < 1):
        raise UsageError(
            f"bad value for 'trainer.max_epochs': {epochs!r} (expected a positive integer, "
            "or -1 together with trainer.max_steps=N or trainer.max_time)"
        )


def build_run(cfg: DictConfig, with_trainer: bool = True, command: str = "fit", write: bool = True) -> Run:
    """Seed, create the run directory and instantiate datamodule, model, callbacks and trainer.

    ``write=False``: the caller writes the resolved config (:func:`write_config`) once its own
    checks have passed, so a refused command leaves the run directory's config as it was."""
    from robusttrain.checkpoints import checkpoint_io

    if with_trainer:
        check_trainer({k: cfg.trainer.get(k) for k in ("max_epochs", "max_steps", "max_time")})
    run_dir = resolve_run_dir(cfg, command)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build("data", cfg.data)
    model = build("model", _without_download(cfg))
    _check_compatible(datamodule, model)
    run = Run(cfg=cfg, run_dir=run_dir, datamodule=datamodule, model=model)
    if with_trainer:
        run.callbacks = build_callbacks(cfg)
        _wire_replay(run.callbacks, datamodule)
        trainer_cfg: Any = OmegaConf.to_container(cfg.trainer, resolve=True)
        trainer_cfg["callbacks"] = run.callbacks
        trainer_cfg["logger"] = build_loggers(cfg, command)
        # checkpoints are written atomically in place and read back weights-only
        trainer_cfg.setdefault("plugins", [checkpoint_io()])
        run.trainer = build("trainer", trainer_cfg)
    if write:
        write_config(cfg, run_dir, command)
    return run


def _without_download(cfg: DictConfig) -> Any:
    """The model node; with a checkpoint to load (resume, validate, check) ``pretrained`` is off for a
    network that would download its weights: the checkpoint's weights replace the encoder's, so nothing
    is downloaded (and nothing fails offline). ``lite0_unet`` reads its weights from an installed package
    and keeps ``pretrained`` as given, so a resumed run records the same hyperparameters as the
    uninterrupted one."""
    node = cfg.model
    local = isinstance(node, DictConfig) and node.get("network") == "lite0_unet"
    if cfg.get("ckpt") and isinstance(node, DictConfig) and node.get("pretrained") and not local:
        node = OmegaConf.merge(node, {"pretrained": False})
    return node


def _wire_replay(callbacks: list, datamodule: Any) -> None:
    """The recipe's explicit replay wiring: the datamodule builds its train loader over mining.wrap."""
    from robusttrain.callbacks import FailureMiningCallback

    for cb in callbacks:
        if isinstance(cb, FailureMiningCallback) and cb.enabled and cb.replay_ratio > 0:
            if not hasattr(datamodule, "wrap_train"):
                raise UsageError(
                    f"callbacks.mining replays failures, but {type(datamodule).__name__} has no "
                    "wrap_train(); set callbacks.mining.replay_ratio=0"
                )
            datamodule.wrap_train(cb.wrap)


def _check_compatible(datamodule: Any, model: Any) -> None:
    """Catch a recipe whose model does not fit its data before Lightning fails deep inside."""
    hp = getattr(model, "hparams", {})
    for attr in ("num_classes", "in_channels"):
        d, m = getattr(datamodule, attr, None), hp.get(attr) if hasattr(hp, "get") else None
        if d is not None and m is not None and int(d) != int(m):
            raise UsageError(
                f"model.{attr}={m} does not match the data ({type(datamodule).__name__} "
                f"has {attr}={d}); set model.{attr}={d}"
            )
    # a size the network cannot take: refused before a trainer starts (forward checks every new shape too)
    size, multiple = getattr(datamodule, "image_size", None), getattr(model, "side_multiple", 1)
    if isinstance(size, int) and isinstance(multiple, int) and multiple > 1 and size % multiple:
        up = -(-size // multiple) * multiple
        raise UsageError(
            f"data.image_size={size} does not fit model.network={hp.get('network')}: it needs image sides "
            f"that are multiples of {multiple}; set data.image_size={up}"
        )
    _dry_forward(datamodule, model)


def _dry_forward(datamodule: Any, model: Any) -> None:
    """One forward of a zero batch of the data's shape through the built network, before anything is
    written: what the side rule cannot see (a norm layer at a 1x1 bottleneck, a 3-D network on 2-D images)
    otherwise failed at the first training step, after config.yaml and logs/ were written. Training mode,
    as the first step runs it (instance / batch norm refuse a too small input only then), with
    ``min(2, batch size)`` samples (a batch norm of one sample would refuse what a real batch passes);
    no gradient, and the norm layers' running statistics and the random state are restored, so the run
    is what it was without the check. Only for the recipes' SegmentationModule: another module's forward
    may take other inputs. Costs one small forward (see docs/bad_inputs.md, issue 46 item 10)."""
    import torch

    from robusttrain.models import SegmentationModule

    size, channels = getattr(datamodule, "image_size", None), getattr(datamodule, "in_channels", None)
    if (
        not isinstance(model, SegmentationModule)
        or not isinstance(size, int)
        or not isinstance(channels, int)
    ):
        return
    if getattr(datamodule, "resize", "stretch") == "none":
        return  # the images keep their own sizes: the forward checks each new shape
    n = max(1, min(2, int(getattr(datamodule, "batch_size", 2) or 2)))
    shape = (n, channels, size, size)
    saved = [b.detach().clone() for b in model.buffers()]
    was_training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.train()
            model(torch.zeros(shape))
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        hp = model.hparams
        dims = hp.get("spatial_dims", 2)
        hint = (
            "the data gives 2-D images: set model.spatial_dims=2"
            if dims != 2
            else "a larger data.image_size (the network's deepest level must keep more than one pixel) or "
            "other model settings"
        )
        raise UsageError(
            f"model.network={hp.get('network')} does not run on this data's images: one {'x'.join(map(str, shape))} "
            f"batch failed in the network ({_one_line(e)}); {hint}"
        ) from None
    finally:
        for b, v in zip(model.buffers(), saved):
            b.copy_(v)
        model.train(was_training)
