"""Every Lightning hook the package's model, datamodules and callbacks override says so with
``@override`` (typing_extensions), so a hook renamed in Lightning, or misspelt here, is a type error
(mypy) instead of a hook that silently never runs (issue 47 item 5)."""

from __future__ import annotations

import inspect

import lightning.pytorch as L
import pytest

from robusttrain import callbacks, datamodules
from robusttrain.models import SegmentationModule

BASES = (L.LightningModule, L.LightningDataModule, L.Callback)


def _ours(cls: type) -> list[type]:
    return [c for c in inspect.getmro(cls) if c.__module__.startswith("robusttrain.")]


def _classes() -> list[type]:
    found = {SegmentationModule}
    for module in (callbacks, datamodules):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BASES) and obj.__module__.startswith("robusttrain."):
                found.add(obj)
    return sorted(found, key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_overridden_lightning_hook_is_marked(cls):
    lightning = [b for b in inspect.getmro(cls) if b.__module__.startswith(("lightning.", "torch."))]
    missing = []
    for own in _ours(cls):
        for name, value in vars(own).items():
            fn = value.fget if isinstance(value, property) else value
            if name.startswith("__") or not callable(fn) and not isinstance(value, property):
                continue
            if any(name in vars(b) for b in lightning) and not getattr(fn, "__override__", False):
                missing.append(f"{own.__name__}.{name}")
    assert not missing, f"Lightning hooks overridden without @override: {missing}"


def test_the_guard_sees_a_hook_without_the_mark():
    class Bare(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            pass

    assert "on_fit_start" in vars(Bare) and not getattr(Bare.on_fit_start, "__override__", False)
