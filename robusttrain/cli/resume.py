"""What a resume may change: a run directory holds one training regime.

``fit ckpt=...`` into a run directory whose ``config.yaml`` exists is compared with that file, key by
key (both resolved; a run directory that moved is compared with its old paths read as the new ones).
A resume may change only what sets how long or where the run trains, or what it prints:
:data:`MAY_CHANGE` (``trainer.max_epochs`` to extend a run, the device, the loggers, the data
loader's workers, the console). Each such change is recorded in ``resumes.jsonl``
(:mod:`robusttrain.rundir.resumes`) and ``config.yaml`` keeps the settings the run started with. Any
other change (a training argument, the data, the model, the seed, a callback switched on or off) is
refused before anything is written, in one line naming the key, the run's value and the new one.

>>> old = {"run_dir": "/a", "seed": 0, "trainer": {"max_epochs": 2, "default_root_dir": "/a"},
...        "callbacks": {"mt": {"k": 1}}}
>>> new = {"run_dir": "/b", "seed": 0, "trainer": {"max_epochs": 4, "default_root_dir": "/b"},
...        "callbacks": {"mt": {"k": 1}}}
>>> changes(old, new)
[('run_dir', '/a', '/b'), ('trainer.max_epochs', 2, 4)]
>>> refused(changes(old, dict(new, callbacks={"mt": {"k": 4}})))
[('callbacks.mt.k', 1, 4)]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from robusttrain.cli.errors import UsageError

# key prefixes a resume may change (a prefix covers the keys below it)
MAY_CHANGE = (
    "ckpt",
    "run_dir",  # the run directory moved or was copied
    "trainer.max_epochs",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.strategy",
    "trainer.num_nodes",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "logger",
    "data.num_workers",
    "data.cache_mb",
)
SAID = (
    "trainer.max_epochs, the device (trainer.accelerator / devices / strategy / num_nodes), logger, "
    "data.num_workers / cache_mb and the console (progress bar, model summary, log_every_n_steps)"
)
ABSENT = "<absent>"


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def _moved(value: Any, old_dir: str, new_dir: str) -> Any:
    """A path below the run's old folder read as the same path below its new one."""
    if (
        isinstance(value, str)
        and old_dir
        and (value == old_dir or value.startswith(old_dir.rstrip("/") + "/"))
    ):
        return new_dir + value[len(old_dir) :]
    if isinstance(value, list):
        return [_moved(v, old_dir, new_dir) for v in value]
    return value


def changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """Every ``(key, run's value, new value)`` that differs (``<absent>`` for a missing key), sorted."""
    a, b = _flat(old), _flat(new)
    old_dir, new_dir = str(a.get("run_dir") or ""), str(b.get("run_dir") or "")
    out = []
    for key in sorted(a.keys() | b.keys()):
        was = a.get(key, ABSENT)
        now = b.get(key, ABSENT)
        if key != "run_dir":
            was = _moved(was, old_dir, new_dir)
        if was != now:
            out.append((key, a.get(key, ABSENT), now))
    return out


def may_change(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in MAY_CHANGE)


def refused(found: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    return [c for c in found if not may_change(c[0])]


def _shown(v: Any) -> str:
    text = repr(v) if v != ABSENT else ABSENT
    return text if len(text) <= 60 else text[:57] + "..."


def run_config(run_dir: Path) -> dict | None:
    """The run's ``config.yaml`` as plain values (read as data, never instantiated), None when absent."""
    import yaml

    from robusttrain.cli.tools import yaml_error_line
    from robusttrain.rundir.paths import read_text

    text = read_text(run_dir, "config.yaml")
    if text is None:
        return None
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(yaml_error_line(run_dir / "config.yaml", e)) from None
    if not isinstance(cfg, dict):
        raise UsageError(
            f"'{run_dir / 'config.yaml'}' is not a recipe (a mapping of settings); cannot tell what the run "
            "was trained with, so it is not resumed"
        )
    return cfg


def check_resume(run_dir: Path, cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """Refuse a resume that changes a setting other than :data:`MAY_CHANGE` (one line); return the
    changes it makes (``ckpt`` left out), [] when the run directory has no ``config.yaml``."""
    import yaml

    old = run_config(run_dir)
    if old is None:
        return []
    new = yaml.safe_load(OmegaConf.to_yaml(cfg))  # the same text config.yaml would hold
    found = changes(old, new)
    bad = refused(found)
    if bad:
        key, was, now = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(k for k, _, _ in bad[1:4])})" if len(bad) > 1 else ""
        raise UsageError(
            f"cannot resume with other training settings: {key} is {_shown(was)} in the run's config.yaml, "
            f"{_shown(now)} now{more}; a resume may change only {SAID}; train other settings in a new run_dir"
        )
    return [c for c in found if c[0] != "ckpt"]


def record_resume(run_dir: Path, found: list[tuple[str, Any, Any]], ckpt: Path, epoch: int) -> None:
    """Append the changes a resume makes to ``resumes.jsonl`` (nothing when it changes nothing)."""
    from robusttrain.rundir import resumes

    if not found:
        return
    resumes.append(
        run_dir,
        {
            "ckpt": str(ckpt),
            "from_epoch": epoch,
            "changed": {
                k: {"was": None if w == ABSENT else w, "now": None if n == ABSENT else n} for k, w, n in found
            },
        },
    )
    shown = ", ".join(f"{k}: {_shown(w)} -> {_shown(n)}" for k, w, n in found[:4])
    print(f"[robusttrain] resume changes {shown}; recorded in {run_dir / resumes.NAME}", flush=True)
