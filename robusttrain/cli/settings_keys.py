"""The recipe keys an object's settings class declares: a ``_target_`` class with a ``settings_type``
(a dataclass, e.g. :class:`~robusttrain.training.settings.MTSettings` for ``MetamorphicTraining``)
accepts each of its fields as a key under its recipe node, spelled out in the recipe or not. The CLI's
key checks (:mod:`robusttrain.cli.compose`) and ``fit --help`` read them here, so a new setting is
written once, as a field.

>>> from omegaconf import OmegaConf
>>> node = OmegaConf.create({"_target_": "robusttrain.callbacks.MetamorphicTraining", "k": 1})
>>> keys = settings_of(node)
>>> list(keys)[:3], keys["k"], len(keys)
(['perturbations', 'k', 'q'], 4, 24)
>>> settings_of(OmegaConf.create({"_target_": "robusttrain.datamodules.PolypDataModule"}))
{}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig


def settings_of(node: Any) -> dict[str, Any]:
    """``{setting: default}`` of the class a recipe node builds (``{}``: not a ``_target_`` node, or its
    class declares no settings dataclass; a ``_target_`` that does not import is reported when built)."""
    target = node.get("_target_") if isinstance(node, (DictConfig, dict)) else None
    if not isinstance(target, str):
        return {}
    try:
        kind = getattr(get_class(target), "settings_type", None)
    except Exception:  # noqa: BLE001 -- building the node names the bad _target_ in one line
        return {}
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return {}
    return {f.name: f.default for f in dataclasses.fields(kind) if f.init}
