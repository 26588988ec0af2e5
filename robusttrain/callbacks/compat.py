"""Both Lightning namespaces: ``lightning.pytorch`` (2.x) and the standalone ``pytorch_lightning``.

The callbacks subclass ``lightning.pytorch.Callback``; a ``pytorch_lightning.Trainer`` calls their
hooks by name, so they work there too. What differs are the *classes* a callback compares
against (loggers, progress bars): they are looked up in the trainer's own namespace, and
``pytorch_lightning`` is never imported here unless the user's program already did.

>>> import lightning.pytorch as L
>>> namespace_of(L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False))
'lightning.pytorch'
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any

NAMESPACES = ("lightning.pytorch", "pytorch_lightning")


def namespace_of(trainer: Any) -> str:
    """``"pytorch_lightning"`` for a standalone-package trainer, else ``"lightning.pytorch"``."""
    mod = type(trainer).__module__
    return "pytorch_lightning" if mod.startswith("pytorch_lightning") else "lightning.pytorch"


def _imported(name: str) -> Any:
    # only namespaces the program has imported: importing the other one would set up its
    # loggers a second time, and a user of one namespace never has objects of the other
    return sys.modules.get(name) or (importlib.import_module(name) if name == "lightning.pytorch" else None)


def wandb_logger(trainer: Any) -> Any:
    """The trainer's ``WandbLogger`` (either namespace), or None."""
    classes = []
    for ns in NAMESPACES:
        if _imported(ns) is None:
            continue
        with contextlib.suppress(ImportError, AttributeError):  # pragma: no cover - both ship it
            classes.append(importlib.import_module(f"{ns}.loggers").WandbLogger)
    return next((lg for lg in getattr(trainer, "loggers", []) if isinstance(lg, tuple(classes))), None)


def tqdm_bar_class(trainer: Any) -> tuple[Any, Any]:
    """(TQDMProgressBar class, Tqdm class) of the trainer's namespace."""
    ns = namespace_of(trainer)
    bars = importlib.import_module(f"{ns}.callbacks")
    tqdm_mod = importlib.import_module(f"{ns}.callbacks.progress.tqdm_progress")
    return bars.TQDMProgressBar, tqdm_mod.Tqdm


def fitting(trainer: Any) -> bool:
    """True inside ``trainer.fit`` (not validate/test/predict), outside the sanity check."""
    fn = getattr(trainer.state, "fn", None)
    return str(getattr(fn, "value", fn)) == "fit" and not trainer.sanity_checking
