"""EMACheckpoint: Lightning's own ``EMAWeightAveraging``, its decay sized to the run, plus ``ema.ckpt`` / ``ema.json``.

The averaging is Lightning's (:class:`lightning.pytorch.callbacks.EMAWeightAveraging`, an
:class:`torch.optim.swa_utils.AveragedModel` updated after every optimizer step). What this subclass adds:

* **The decay from the run length** unless ``decay`` is given: a half-life of ``half_life`` (default
  5 %) of the run's EMA updates, ``decay = 0.5 ** (1 / (half_life * updates))``
  (:mod:`robusttrain.training.averaging`), resolved when training starts from
  ``trainer.estimated_stepping_batches``. A fixed decay means a different window in every run (0.999
  over 2,820 steps keeps ~6 % of the average on the first step's weights); a half-life of 5 % gives the
  last quarter of the run 97 % of the average and the first update ~1e-6, whatever the run's length.
* **BatchNorm**: with ``use_buffers=True`` (Lightning's default) the buffers are averaged with the same
  decay as the weights, so the EMA's running mean / variance are EMAs of the recent models' statistics
  (the same window); no re-estimation pass is needed. ``use_buffers=False`` leaves the average's BN
  statistics at their initial values (Lightning then expects ``update_bn`` by the user): a warning says so
  when the model has BatchNorm layers.
* **Files**: ``ema.ckpt`` (weights-only, the averaged model's ``state_dict``) and ``ema.json`` (the decay,
  where it came from and the window it gives: :mod:`robusttrain.rundir.ema`), written atomically under
  the product's temp pattern when training ends -- and, as BalancedAverage's, also by a fit resumed from
  the last epoch's checkpoint that has no epoch left to run (``on_train_end`` never comes then; the EMA
  restored from the checkpoint is written in ``on_fit_end``), so a kill in the end-of-fit window resumes
  to the same files. They are re-written by every fit, never taken as done because they exist.

As in Lightning, the EMA weights are swapped in for every validation and copied into the model when
training ends. With BalancedAverage in the same trainer: validation runs on the EMA weights, so
``val/loss``, the per-case history, the corner cases and the ECOD flags describe the EMA model, and
``last.ckpt`` / ``balanced.ckpt`` hold the EMA weights in ``state_dict`` (Lightning's
``on_save_checkpoint``). The balanced average still averages the *raw* weights of the window epochs (its
snapshots are taken after the swap back), so ``balanced_average.ckpt`` is a SWA-style average next to the
EMA, not an average of EMAs. Use one of the two as the final model; compare both with ``robusttrain check``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as L
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import get_ema_avg_fn
from typing_extensions import override

from robusttrain.rundir import ema as ema_file
from robusttrain.training.averaging import (
    DEFAULT_HALF_LIFE,
    ema_decay,
    first_update_share,
    half_life_updates,
    last_fraction_share,
)
from robusttrain.validate import check_fraction, check_int

from ._dist import barrier
from ._weights import save_weights
from .context import RobustnessContext
from .lifecycle import ContextMember

log = logging.getLogger(__name__)

NAME = ema_file.CHECKPOINT


def _check_optional_int(name: str, value: Any) -> int | None:
    return None if value is None else check_int(name, value, 0)


class EMACheckpoint(ContextMember, EMAWeightAveraging):
    """:class:`~lightning.pytorch.callbacks.EMAWeightAveraging` with a run-sized decay, plus
    ``<run_dir>/ema.ckpt`` and ``ema.json`` at the end of fit (see module docstring).

    Args:
        dirpath: run directory (default: the shared context's, as for the other robustness callbacks).
        decay: EMA decay per update, in [0, 1); ``None`` (default): derived from ``half_life``.
        half_life: the EMA's half-life as a fraction of the run's EMA updates, in (0, 1] (used when
            ``decay`` is None): ``decay = 0.5 ** (1 / (half_life * updates))``.
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.
        kwargs: passed to ``EMAWeightAveraging`` (``update_every_n_steps``, ``update_starting_at_step``,
            ``update_starting_at_epoch``, ``device``, ``use_buffers``).

    Raises:
        ValueError: a bad argument (named in the message), when the callback is built.

    Example::

        >>> from lightning.pytorch.callbacks import WeightAveraging
        >>> cb = EMACheckpoint(dirpath="runs/x", half_life=0.1, update_starting_at_step=10)
        >>> isinstance(cb, WeightAveraging), cb.update_starting_at_step, cb.decay
        (True, 10, None)
        >>> EMACheckpoint(half_life=0)
        Traceback (most recent call last):
        ...
        ValueError: half_life=0: expected a number in (0, 1]
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        decay: float | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        context: RobustnessContext | None = None,
        **kwargs: Any,
    ) -> None:
        if decay is not None and not (
            isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0.0 <= decay < 1.0
        ):
            raise ValueError(
                f"decay={decay!r}: expected a number in [0, 1), or null to derive it from half_life"
            )
        half_life = check_fraction("half_life", half_life, 0.0, 1.0, lo_open=True)
        kwargs["update_every_n_steps"] = check_int(
            "update_every_n_steps", kwargs.get("update_every_n_steps", 1), 1
        )
        for key in ("update_starting_at_step", "update_starting_at_epoch"):
            kwargs[key] = _check_optional_int(key, kwargs.get(key))
        if not isinstance(kwargs.get("use_buffers", True), bool):
            raise ValueError(f"use_buffers={kwargs['use_buffers']!r}: expected true or false")
        # Lightning's constructor wants a number; a derived decay replaces its averaging function at train start
        super().__init__(decay=0.999 if decay is None else float(decay), **kwargs)
        self.decay = None if decay is None else float(decay)
        self.half_life = half_life
        self.decay_used: float | None = self.decay
        self.updates: int | None = None  # EMA updates the run makes (resolved at train start)
        self.dirpath = None if dirpath is None else Path(dirpath)
        self._context_arg = context
        self._ctx = context
        self._dir: Path | None = self.dirpath

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)  # joins the context on fit
        averaged = self._use_buffers or stage != "fit"
        if not averaged and any(isinstance(m, _BatchNorm) for m in pl_module.modules()):
            log.warning(
                "EMACheckpoint(use_buffers=False): the EMA model's BatchNorm statistics are not averaged "
                "and stay at their initial values in ema.ckpt; use use_buffers=True (the default)"
            )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._finished = False

    # ------------------------------------------------------------------ the decay
    def planned_updates(self, trainer) -> int:
        """EMA updates the whole run makes: every ``update_every_n_steps``-th of the run's optimizer steps
        from ``update_starting_at_step`` on, plus one per epoch from ``update_starting_at_epoch`` on."""
        total = trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError(
                "EMACheckpoint: decay=None needs a finite run (trainer.max_epochs or max_steps) to size "
                "its half-life; give decay= or a run length"
            )
        n, start = self.update_every_n_steps, self.update_starting_at_step or 0
        first = -(-start // n) * n  # the first step index >= start that is a multiple of n
        updates = len(range(first, int(total), n))
        if self.update_starting_at_epoch is not None and trainer.max_epochs is not None:
            updates += max(0, int(trainer.max_epochs) - self.update_starting_at_epoch)
        return max(1, updates)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.updates = self.planned_updates(trainer)
        if self.decay is None:
            self.decay_used = ema_decay(self.half_life, self.updates)
            assert self._average_model is not None  # made in setup
            self._average_model.avg_fn = get_ema_avg_fn(decay=self.decay_used)

    # ------------------------------------------------------------------ end of fit
    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)  # Lightning copies the EMA weights into the model
        self._finished = True
        save_weights(trainer, self.fit_dir / ema_file.CHECKPOINT)
        if trainer.is_global_zero:
            ema_file.write(self.fit_dir, self._report(trainer))
        barrier(trainer, "EMACheckpoint.end")

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed from the last epoch's checkpoint runs no training loop, so no on_train_end: the EMA
        # that on_load_checkpoint restored is copied in and written here, as the uninterrupted fit did.
        if getattr(self, "_finished", True) or self._average_model is None or self._ctx is None:
            return
        self.on_train_end(trainer, pl_module)

    def _report(self, trainer) -> dict[str, Any]:
        assert self._average_model is not None
        decay = float(self.decay_used if self.decay_used is not None else 0.999)
        averaged = int(self._average_model.n_averaged.item())
        return {
            "checkpoint": ema_file.CHECKPOINT,
            "decay": decay,
            "decay_from": "given" if self.decay is not None else "half_life",
            "half_life": None if self.decay is not None else self.half_life,
            "half_life_updates": half_life_updates(decay),
            "updates": self.updates,
            "averaged": averaged,
            "first_update_share": first_update_share(decay, averaged) if averaged else None,
            "last_quarter_share": last_fraction_share(decay, averaged, 0.25) if averaged else None,
            "buffers": "averaged" if self._use_buffers else "not_averaged",
            "global_step": int(trainer.global_step),
        }

    # ------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "decay_used": self.decay_used, "updates": self.updates}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if state_dict.get("decay_used") is not None:
            self.decay_used = float(state_dict["decay_used"])
            if self._average_model is not None and self.decay is None:
                self._average_model.avg_fn = get_ema_avg_fn(decay=self.decay_used)
        if state_dict.get("updates") is not None:
            self.updates = int(state_dict["updates"])
