"""Helpers of MetamorphicCallback that know Lightning: the outputs decision before training, the
trainer's predict (its precision context) and the progress bar. Probe selection, the checking state and
the check itself are :mod:`robusttrain.metamorphic.check` (shared with the audit)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from robusttrain.metamorphic.batch import iter_probe
from robusttrain.metamorphic.check import checking_state, predict_fn, select_probe
from robusttrain.metamorphic.outputs import NonFiniteOutputError, to_probabilities_fn

__all__ = [
    "checking_state",
    "decide_outputs",
    "make_predict",
    "make_to_probabilities",
    "progress_bar",
    "select_probe",
]


def make_to_probabilities(spec: str | Callable | None) -> Callable:
    """The callback's ``to_probabilities=``: None/"auto", "logits", "identity" or a callable
    (see :mod:`robusttrain.metamorphic.outputs`); a bad value raises at construction."""
    return to_probabilities_fn(spec)


# logits tensor, dict with logits, or tuple; refuses NaN/inf and outputs that are probabilities
default_to_probabilities = to_probabilities_fn(None)


def decide_outputs(
    trainer: Any, pl_module: Any, dataset: Any, hooks: Any, to_probabilities: Callable, batch_size: int = 2
) -> str | None:
    """Before training: show ``to_probabilities="auto"`` the model's outputs on the first validation
    samples, so outputs that are unambiguously probabilities stop ``fit`` now, not after an epoch
    (:meth:`~robusttrain.metamorphic.outputs.AutoProbabilities.decide`). Other converters, or no
    dataset: nothing to decide (None). No RNG stream or module mode changes.
    """
    decide = getattr(to_probabilities, "decide", None)
    if decide is None or dataset is None or not len(dataset):
        return None
    device = next((p.device for p in pl_module.parameters()), torch.device("cpu"))
    plugin = getattr(trainer, "precision_plugin", None)
    ctx = plugin.forward_context if plugin is not None else contextlib.nullcontext
    with checking_state(pl_module, 0):
        pb = next(iter_probe(dataset, list(range(min(batch_size, len(dataset)))), batch_size, hooks))
        with ctx():
            out = pl_module(pb.images.to(device))
    try:
        return decide(out)
    except NonFiniteOutputError:  # the check reports NaN/inf itself, naming the epoch, probe and cases
        return None


def make_predict(trainer: Any, pl_module: Any, to_probabilities: Callable) -> Callable:
    """``predict(images) -> probabilities`` under the trainer's precision (autocast) context."""
    plugin = getattr(trainer, "precision_plugin", None)
    return predict_fn(pl_module, to_probabilities, plugin.forward_context if plugin is not None else None)


def progress_bar(trainer: Any, total: int, desc: str):
    """A tqdm bar consistent with Lightning's (same class/position; off when Lightning's is off)."""
    bar_cb = getattr(trainer, "progress_bar_callback", None)
    disabled = bar_cb is None or getattr(bar_cb, "is_disabled", False) or not trainer.is_global_zero
    try:  # the trainer's own namespace (lightning.pytorch or pytorch_lightning)
        from .compat import tqdm_bar_class

        TQDMProgressBar, tqdm_cls = tqdm_bar_class(trainer)
    except (ImportError, AttributeError):  # pragma: no cover - lightning always ships both
        import tqdm

        TQDMProgressBar, tqdm_cls = (), tqdm.tqdm
    pos = 2 * getattr(bar_cb, "process_position", 0) + 1 if isinstance(bar_cb, TQDMProgressBar) else 0
    return tqdm_cls(
        total=total,
        desc=desc,
        leave=False,
        disable=disabled,
        position=pos,
        dynamic_ncols=True,
        file=sys.stdout,
        smoothing=0,
    )
