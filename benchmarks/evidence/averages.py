"""The two weight averages of Evidence v3, built beside a run without changing it.

- ``ema``: an exponential moving average of the weights after every optimizer step, kept by
  :class:`EMATracker` through torch's own ``AveragedModel`` + ``get_ema_multi_avg_fn`` (the machinery
  Lightning's ``EMAWeightAveraging`` wraps). Unlike the product's ``EMACheckpoint`` it never swaps the
  average into the model for validation: in the evidence, validation drives checkpoint selection and
  (through the MR check's violation rates) metamorphic training's family weights, so the EMA must
  watch the run, not steer it. Every condition's training is byte-for-byte the run without it.
- ``balanced_average``: :func:`balanced_average`, the same rule as the product's ``BalancedAverage``
  (uniform average of the inlier epochs in the last ``window`` of the validated epochs; the ECOD
  outlier epochs of the corner cases excluded), through the callback's own ``window_epochs``,
  ``inlier_epochs`` and ``average_states``, computed from the per-epoch weights the recorder keeps.

The evidence's BasicUNet has instance norm (no running statistics), so neither needs BatchNorm
re-estimation; :func:`has_batchnorm` lets the caller refuse a model where it would.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from robusttrain.callbacks.balanced_average import average_states, inlier_epochs, window_epochs


def has_batchnorm(module: torch.nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in module.modules())


class EMATracker(Callback):
    """EMA of ``pl_module.net`` (decay per optimizer step, buffers included), resumable.

    ``weights()`` is a state dict of the whole LightningModule (``net.`` prefix), so it loads like
    any per-epoch snapshot."""

    def __init__(self, decay: float = 0.999) -> None:
        self.decay = float(decay)
        self._avg: AveragedModel | None = None
        self._pending: dict[str, Any] | None = None

    def _ensure(self, pl_module) -> AveragedModel:
        if self._avg is None:
            self._avg = AveragedModel(
                pl_module.net, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True
            )
            if self._pending is not None:
                self._avg.load_state_dict(self._pending)
                self._pending = None
        return self._avg

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with torch.no_grad():
            self._ensure(pl_module).update_parameters(pl_module.net)

    def weights(self) -> dict[str, torch.Tensor]:
        if self._avg is None and self._pending is not None:
            # resumed from a checkpoint with no step left (a run stopped while it was scoring): the
            # checkpoint's average is the run's average; AveragedModel keys its copy as "module.<name>"
            return {
                f"net.{k[len('module.') :]}": v.detach().cpu().clone()
                for k, v in self._pending.items()
                if k.startswith("module.")
            }
        if self._avg is None:
            raise RuntimeError("EMATracker: no optimizer step was seen")
        return {f"net.{k}": v.detach().cpu().clone() for k, v in self._avg.module.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        if self._avg is None:
            return {"decay": self.decay, "avg": self._pending}
        return {"decay": self.decay, "avg": {k: v.cpu() for k, v in self._avg.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self._pending, self._avg = state.get("avg"), None


def ema_decay_for(steps: int, half_life: float = 0.05) -> float:
    """The EMA decay per step whose half-life is ``half_life`` of a run of ``steps`` optimiser steps
    (Evidence v4, issue 30: "sized to the run"; v3's fixed 0.999 over 2 820 steps kept ~6 % of its
    weight on the first steps' weights): ``0.5 ** (1 / (half_life * steps))``, the product's rule
    (``robusttrain.training.averaging.ema_decay``) where the library has it.

    >>> d = ema_decay_for(2820, 0.05); round(d, 5), round(d ** 141, 3)
    (0.9951, 0.5)
    """
    try:  # one home for the rule: the product's, once issue 30's averages are in the library
        from robusttrain.training.averaging import ema_decay
    except ImportError:  # older library: the same formula (docs/evidence_v4/PROTOCOL.md)
        if steps < 1 or not 0 < half_life <= 1:
            raise ValueError(
                f"ema_decay_for: steps must be >= 1 and half_life in (0, 1], got {steps}, {half_life}"
            ) from None
        return float(0.5 ** (1.0 / (half_life * steps)))
    return float(ema_decay(half_life, steps))


def balanced_average(
    epoch_weights, validated: list[int], outlier_epochs: dict[str, list[int]], window: float = 0.5
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Uniform average of the window's inlier epochs (all window epochs flagged: the least-flagged).

    ``epoch_weights(e)`` returns epoch ``e``'s state dict; ``outlier_epochs`` is
    ``{corner case: [epoch, ...]}`` from the validation history's ECOD analysis."""
    win = window_epochs(validated, window)
    inliers, status = inlier_epochs(win, outlier_epochs)
    info = {
        "status": status,
        "window": window,
        "window_epochs": win,
        "averaged_epochs": inliers,
        "excluded_epochs": [e for e in win if e not in inliers],
    }
    return average_states(epoch_weights(e) for e in inliers), info
