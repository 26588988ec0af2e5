"""EMACheckpoint: Lightning's own ``EMAWeightAveraging`` that also writes ``ema.ckpt`` into the run directory.

The averaging is Lightning's (:class:`lightning.pytorch.callbacks.EMAWeightAveraging`, an
:class:`torch.optim.swa_utils.AveragedModel` updated after every optimizer step, buffers included,
so BatchNorm statistics are averaged too); this subclass only adds the file. As in Lightning, the
EMA weights are swapped in for every validation and copied into the model when training ends;
``ema.ckpt`` is then written weights-only, so its ``state_dict`` is the averaged model's.

With BalancedAverage in the same trainer: validation runs on the EMA weights, so ``val/loss``, the
per-case history, the corner cases and the ECOD flags describe the EMA model, and ``last.ckpt`` /
``balanced.ckpt`` hold the EMA weights in ``state_dict`` (Lightning's ``on_save_checkpoint``). The
balanced average still averages the *raw* weights of the window epochs (its snapshots are taken after
the swap back), so ``balanced_average.ckpt`` is a SWA-style average next to the EMA, not an average
of EMAs. Use one of the two as the final model; compare both with ``robusttrain check``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import EMAWeightAveraging

from ._dist import barrier
from .context import RobustnessContext, UsesContext

NAME = "ema.ckpt"


class EMACheckpoint(UsesContext, EMAWeightAveraging):
    """:class:`~lightning.pytorch.callbacks.EMAWeightAveraging` plus ``<run_dir>/ema.ckpt`` at the end of fit.

    Args:
        dirpath: run directory (default: the shared context's, as for the other robustness callbacks).
        decay: EMA decay per optimizer step (Lightning's default 0.999: ~1000-step memory).
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.
        kwargs: passed to ``EMAWeightAveraging`` (``update_every_n_steps``, ``update_starting_at_step``,
            ``update_starting_at_epoch``, ``device``, ``use_buffers``).

    Example::

        >>> from lightning.pytorch.callbacks import WeightAveraging
        >>> cb = EMACheckpoint(dirpath="runs/x", decay=0.99, update_starting_at_step=10)
        >>> isinstance(cb, WeightAveraging), cb.update_starting_at_step
        (True, 10)
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        decay: float = 0.999,
        context: RobustnessContext | None = None,
        **kwargs: Any,
    ) -> None:
        if not (isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0.0 <= decay < 1.0):
            raise ValueError(f"decay={decay!r}: expected a number in [0, 1)")
        super().__init__(decay=float(decay), **kwargs)
        self.dirpath = None if dirpath is None else Path(dirpath)
        self._context_arg = context
        self._ctx = context
        self._dir: Path | None = self.dirpath

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self.join_context(trainer)
            self.context.join(type(self).__name__, self.dirpath)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._dir = self.context.finalize(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)  # Lightning copies the EMA weights into the model
        dst = self.fit_dir / NAME
        tmp = dst.with_name(f".{dst.name}.tmp")
        trainer.save_checkpoint(tmp, weights_only=True)  # collective: every rank calls it, rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, dst)
        barrier(trainer, "EMACheckpoint.end")
