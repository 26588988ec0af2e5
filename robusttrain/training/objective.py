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

Both functions read this step's :class:`StepFollowups`, which the
:class:`~robusttrain.callbacks.MetamorphicTraining` callback publishes on the trainer's shared context
(``trainer.robusttrain_context.followups``) and refills before each training step: the model imports this
module, never the callbacks, and never searches the trainer's callback list. Without one, they do nothing.

>>> import torch
>>> class _M(torch.nn.Module):                  # no MetamorphicTraining: a plain forward, nothing added
...     trainer = type("T", (), {})()
...     def forward(self, x): return x.mean(1, keepdim=True)
>>> out, mr = metamorphic_forward(_M(), torch.zeros(2, 3, 4, 4))
>>> tuple(out.shape), float(mr)
((2, 1, 4, 4), 0.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from robusttrain.errors import RobustnessConfigError
from robusttrain.metamorphic.batch import normalise_mask
from robusttrain.metamorphic.outputs import main_output

from .consistency import divergence, probabilities, soft_dice_loss

OBJECTIVES = ("replace", "consistency", "paired")


class MissingCallbackError(RobustnessConfigError, RuntimeError):
    """A ``training_step`` asked for the MR term but no MetamorphicTraining callback is on the trainer
    (a :class:`~robusttrain.errors.RobustnessConfigError`; a ``RuntimeError`` as it always was)."""


@dataclass
class StepFollowups:
    """This training step's follow-ups and how its term is made: what MetamorphicTraining prepared before
    the step (``followups``, with ``target`` the batch's masks; None: none this step) for the model's
    ``training_step``, which reads it through :func:`metamorphic_forward` / :func:`metamorphic_loss`.
    ``used`` says whether the step asked for its term (the callback's check that ``training_step`` does).

    >>> step = StepFollowups("consistency", "js", detach_source=False)
    >>> step.followups is None and not step.used
    True
    """

    objective: str | None  # the settings' objective (None: replace)
    divergence: str = "js"
    detach_source: bool = False
    to_probabilities: Any = None  # the batch hooks' to_probabilities
    weight: float = 0.0  # lambda at this step (the ramp applied)
    followups: Any = None  # robusttrain.training.worst_of_k.Followups, or None
    target: Any = None
    used: bool = False

    def start(self, to_probabilities: Any) -> None:
        """A new training step: nothing prepared yet."""
        self.to_probabilities, self.followups, self.target, self.used = to_probabilities, None, None, False

    def consistency(self, module: Any, source: Any, followup: Any, n: int) -> torch.Tensor:
        """``lambda * D(p(source), p(followup))``, logged; the source detached with ``detach_source``."""
        p_src = probabilities(source, self.to_probabilities)
        if self.detach_source:  # the source is the reference: only the follow-up moves to agree
            p_src = p_src.detach()
        cons = divergence(p_src, probabilities(followup, self.to_probabilities), self.divergence)
        module.log("mt/consistency", cons.detach(), on_step=False, on_epoch=True, batch_size=n)
        module.log("mt/lambda", self.weight, on_step=False, on_epoch=True, batch_size=n)
        return self.weight * cons

    def forward(self, module: Any, images: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The ``"consistency"`` objective's forward: one forward over ``images`` and this step's
        follow-ups; ``images``' outputs and ``lambda * D`` (0 without follow-ups)."""
        self.used = True
        fol = self.followups
        if self.objective != "consistency" or fol is None or not len(fol):
            out = module(images)
            return out, zero_like_outputs(out)
        b = images.shape[0]
        out = module(torch.cat([images, fol.images.to(images.dtype)]))
        clean, follow = select_rows(out, slice(0, b)), select_rows(out, slice(b, None))
        return clean, self.consistency(module, select_rows(clean, fol.index), follow, len(fol))

    def loss(self, module: Any, outputs: Any, seg_loss: Callable | None = None) -> torch.Tensor:
        """The ``"paired"`` objective's term: ``L_seg(x*) + lambda * D(p(x), p(x*))`` for this step's
        follow-ups (0 for the other objectives, or when there are none)."""
        self.used = True
        zero = zero_like_outputs(outputs)
        if self.objective != "paired" or self.followups is None:
            return zero
        fol, target = self.followups, self.target
        idx = fol.index
        out_f = module(fol.images)
        if seg_loss is not None:
            seg = seg_loss(out_f, select_rows(target, idx))
        else:
            seg = soft_dice_loss(
                probabilities(out_f, self.to_probabilities),
                normalise_mask(select_rows(target, idx), fol.images),
            ).mean()
        n = int(idx.numel())
        module.log("mt/followup_loss", seg.detach(), on_step=False, on_epoch=True, batch_size=n)
        return seg + self.consistency(module, select_rows(outputs, idx), out_f, n)


def _step(module: Any) -> StepFollowups | None:
    """This step's follow-ups, from the trainer's shared context (None: no MetamorphicTraining)."""
    context = getattr(getattr(module, "trainer", None), "robusttrain_context", None)
    step = getattr(context, "followups", None)
    return step if isinstance(step, StepFollowups) else None


def zero_like_outputs(outputs: Any) -> torch.Tensor:
    """A 0 on the outputs' device that keeps the graph (adding it changes nothing)."""
    return main_output(outputs).sum() * 0.0


def metamorphic_forward(module: Any, images: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """``(outputs on images, MR term)``: with the consistency objective, one forward over ``images`` and
    this step's follow-ups, the outputs of ``images``' rows and ``lambda * D(p(x), p(x*))``; otherwise
    ``module(images)`` and 0."""
    step = _step(module)
    if step is None:
        out = module(images)
        return out, zero_like_outputs(out)
    return step.forward(module, images)


def metamorphic_loss(
    module: Any, batch: Any, outputs: Any, seg_loss: Callable | None = None, *, required: bool = True
) -> torch.Tensor:
    """The ``"paired"`` objective's term of this step: ``L_seg(x*) + lambda * D(p(x), p(x*))`` (0 for the
    other objectives or a step without follow-ups). Raises without a MetamorphicTraining callback on the
    trainer, unless ``required=False``.

    >>> import torch
    >>> class _M:
    ...     trainer = type("T", (), {})()
    >>> float(metamorphic_loss(_M(), None, torch.zeros(1, 2, 4, 4), required=False))
    0.0
    """
    step = _step(module)
    if step is None:
        if required:
            raise MissingCallbackError(
                "metamorphic_loss(...) needs a MetamorphicTraining(objective='paired') callback on the trainer"
            )
        return zero_like_outputs(outputs)
    return step.loss(module, outputs, seg_loss)


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
