"""The training objectives of metamorphic training, and the two lines a ``training_step`` calls.

Three objectives (``OBJECTIVES``), named for what the loss sees:

* ``"replace"`` — follow-ups replace images of the batch in place; the loss is the model's own
  ``L_seg`` on the mixed batch (random augmentation when ``k=1``). No code change.
* ``"consistency"`` — the AugMix / AugMax / AdvChain formulation: the supervised loss sees exactly
  what a plain (or, with ``replace_q``, an in-place) step sees, and the (hard) follow-ups enter **only**
  through ``lambda * D(p(x), p(x*))``. One forward over the batch and its follow-ups concatenated, so
  normalisation layers see one batch. ``training_step`` calls :func:`metamorphic_forward` instead of
  ``self(images)``::

      logits, mr = metamorphic_forward(self, images)   # logits of the batch's own rows
      loss = self.loss_fn(logits, masks) + mr

* ``"paired"`` — Evidence v3's ``L_seg(x) + L_seg(x*) + lambda * JS``: the hard copies carry a full
  supervised loss beside the clean batch. Every paired run of one seed of three stalled, at any
  consistency weight (docs/results.md); kept only for users who ask for it by name, through
  :func:`metamorphic_loss`.

Both functions find the :class:`~robusttrain.callbacks.MetamorphicTraining` callback on the module's
trainer (duck-typed, so models import this module, never the callbacks) and do nothing without one.

>>> import torch
>>> class _M(torch.nn.Module):                  # no trainer callbacks: a plain forward, nothing added
...     trainer = type("T", (), {"callbacks": []})()
...     def forward(self, x): return x.mean(1, keepdim=True)
>>> out, mr = metamorphic_forward(_M(), torch.zeros(2, 3, 4, 4))
>>> tuple(out.shape), float(mr)
((2, 1, 4, 4), 0.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from robusttrain.errors import RobustnessConfigError
from robusttrain.metamorphic.outputs import main_output

OBJECTIVES = ("replace", "consistency", "paired")


class MissingCallbackError(RobustnessConfigError, RuntimeError):
    """A ``training_step`` asked for the MR term but no MetamorphicTraining callback is on the trainer
    (a :class:`~robusttrain.errors.RobustnessConfigError`; a ``RuntimeError`` as it always was)."""


def _provider(module: Any) -> Any:
    trainer = getattr(module, "trainer", None)
    for cb in getattr(trainer, "callbacks", None) or []:
        if hasattr(cb, "consistency_forward") and hasattr(cb, "paired_loss"):
            return cb
    return None


def zero_like_outputs(outputs: Any) -> torch.Tensor:
    """A 0 on the outputs' device that keeps the graph (adding it changes nothing)."""
    return main_output(outputs).sum() * 0.0


def metamorphic_forward(module: Any, images: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """``(outputs on images, MR term)``: with the consistency objective, one forward over ``images`` and
    this step's follow-ups, the outputs of ``images``' rows and ``lambda * D(p(x), p(x*))``; otherwise
    ``module(images)`` and 0."""
    cb = _provider(module)
    if cb is None:
        out = module(images)
        return out, zero_like_outputs(out)
    return cb.consistency_forward(module, images)


def metamorphic_loss(
    module: Any, batch: Any, outputs: Any, seg_loss: Callable | None = None, *, required: bool = True
) -> torch.Tensor:
    """The ``"paired"`` objective's term of this step: ``L_seg(x*) + lambda * D(p(x), p(x*))`` (0 for the
    other objectives or a step without follow-ups). Raises without a MetamorphicTraining callback on the
    trainer, unless ``required=False``.

    >>> import torch
    >>> class _M:
    ...     trainer = type("T", (), {"callbacks": []})()
    >>> float(metamorphic_loss(_M(), None, torch.zeros(1, 2, 4, 4), required=False))
    0.0
    """
    cb = _provider(module)
    if cb is None:
        if required:
            raise MissingCallbackError(
                "metamorphic_loss(...) needs a MetamorphicTraining(objective='paired') callback on the trainer"
            )
        return zero_like_outputs(outputs)
    return cb.paired_loss(module, batch, outputs, seg_loss)


def select_rows(outputs: Any, idx: torch.Tensor | slice) -> Any:
    """Rows ``idx`` of a tensor, or of every tensor in a dict / tuple of outputs.

    >>> select_rows({"out": torch.arange(4), "n": 1}, slice(1, 3))
    {'out': tensor([1, 2]), 'n': 1}
    """
    if torch.is_tensor(outputs):
        return outputs[idx]
    if isinstance(outputs, Mapping):
        return {k: select_rows(v, idx) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(select_rows(v, idx) for v in outputs)
    return outputs
