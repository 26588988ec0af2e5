"""BalancedAverage: ``balanced_average.ckpt``, the uniform average of the inlier epochs late in training.

Averaging weights helps the tail where selecting one epoch does not (SWA; SWAD, NeurIPS 2021). The
average is over the *window*, the last ``window`` fraction of the validated epochs of the fit
(default 0.5, the second half: SWA starts averaging at ~75 % of the budget, but the recipes train
8-50 epochs, and a quarter of 8 leaves 2 epochs, 1 after ECOD; the first half is still far from the
final basin), minus the epochs that BalancedCheckpoint's ECOD analysis flags as outlier (collapse)
epochs of a corner case -- the overfit-aware part, read from the shared
:class:`~robusttrain.callbacks.context.RobustnessContext` (``corners.outlier_epochs``, the analysis of
the full validation history, so a BalancedCheckpoint must be in the trainer). When every window epoch
is flagged, those flagged for the fewest corner cases are averaged (``status="no_inlier_epoch"``).

Each validation of the fit saves the model's weights (rank 0) to ``<run_dir>/balanced_average_window/``
and deletes those that left the window; the folder is removed when the fit ends. Then every rank loads
the average, re-estimates BatchNorm running statistics on at most ``bn_batches`` training batches
(:func:`torch.optim.swa_utils.update_bn`, seeded, the global RNG restored after), rank 0 writes
``balanced_average.ckpt`` (a weights-only Lightning checkpoint that
:func:`robusttrain.checkpoints.load_checkpoint` reads) and ``balanced_average.json`` (which epochs and
why), and the model gets its own weights back: the average is a file, as balanced.ckpt is.

Resume: the callback state (which epochs were validated and which are in the window) is in
``last.ckpt``; the weights of window epochs stay on disk until the fit *ends*, so a killed run resumed
from ``last.ckpt`` ends with the same average as an uninterrupted one. A fit that ended and is resumed
to more epochs no longer has the earlier window's weights: they are left out, with a warning, and
listed as ``missing_epochs``.
"""

from __future__ import annotations

import io
import itertools
import logging
import math
import os
import random
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import update_bn

from robusttrain.checkpoints import rng_state, set_rng_state
from robusttrain.io import atomic_write_bytes
from robusttrain.metamorphic.batch import BatchHooks
from robusttrain.rundir import balanced_average as average_file
from robusttrain.validate import check_fraction, check_int

from ._dist import barrier, broadcast_object
from .compat import fitting
from .context import RobustnessContext, UsesContext

log = logging.getLogger(__name__)


def window_epochs(epochs: Iterable[int], window: float) -> list[int]:
    """The last ``ceil(window * n)`` (at least one) of ``n`` validated epochs.

    >>> window_epochs(range(8), 0.5), window_epochs([0, 1, 2], 0.5), window_epochs([3], 0.1)
    ([4, 5, 6, 7], [1, 2], [3])
    """
    eps = sorted(set(int(e) for e in epochs))
    n = max(1, math.ceil(window * len(eps) - 1e-9))  # 1e-9: 0.3·10 must be 3, not 4
    return eps[-n:] if eps else []


def inlier_epochs(
    epochs: Sequence[int], outlier_epochs: Mapping[str, Iterable[int]]
) -> tuple[list[int], str]:
    """The ``epochs`` no corner case flags (status ``"ok"``); when every one is flagged, those flagged by
    the fewest corner cases (status ``"no_inlier_epoch"``): the epochs a balanced average is taken over.

    >>> inlier_epochs([5, 6, 7], {"p1": [6], "p2": [6, 7]})
    ([5], 'ok')
    >>> inlier_epochs([6, 7], {"p1": [6], "p2": [6, 7]})
    ([7], 'no_inlier_epoch')
    """
    bad: dict[int, int] = {}
    for eps in outlier_epochs.values():
        for e in set(eps):
            bad[int(e)] = bad.get(int(e), 0) + 1
    inliers = [e for e in epochs if e not in bad]
    if inliers or not epochs:
        return inliers, "ok"
    fewest = min(bad[e] for e in epochs)
    return [e for e in epochs if bad[e] == fewest], "no_inlier_epoch"


def average_states(states: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Uniform average of state dicts (floating tensors, summed in float64); other tensors (e.g.
    BatchNorm's ``num_batches_tracked``) are taken from the last state.

    >>> a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    >>> b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    >>> avg = average_states([a, b]); avg["w"].tolist(), avg["n"].item()
    ([2.0, 4.0], 5)
    """
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    last: dict[str, torch.Tensor] = {}
    count = 0
    for state in states:
        count += 1
        for k, v in state.items():
            if torch.is_floating_point(v):
                dtypes[k] = v.dtype
                sums[k] = sums[k] + v.double() if k in sums else v.double().clone()
            else:
                last[k] = v.clone()
    if count == 0:
        raise ValueError("average_states: no state to average")
    return {**last, **{k: (s / count).to(dtypes[k]) for k, s in sums.items()}}


class BalancedAverage(UsesContext, Callback):
    """Write ``balanced_average.ckpt`` (see module docstring).

    Args:
        dirpath: run directory (default: the shared context's, as for the other robustness callbacks).
        window: fraction of the validated epochs, the last ones, that are averaged, in (0, 1].
        bn_batches: training batches for re-estimating BatchNorm statistics (0: keep the averaged
            running statistics). Only models with BatchNorm layers are affected.
        seed: seeds the pass over the training batches (shuffling, augmentation) for the BN statistics.
        hooks: how to read images from a training batch (default: the MetamorphicCallback's, else
            dict / ``(image, mask)`` batches).
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.

    Raises:
        ValueError: a bad argument (named in the message), when the callback is built.

    Example::

        >>> cb = BalancedAverage(dirpath="runs/x", window=0.5, bn_batches=16)
        >>> cb.state_key
        "BalancedAverage{'window': 0.5}"
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        window: float = 0.5,
        bn_batches: int = 32,
        seed: int = 0,
        hooks: BatchHooks | None = None,
        context: RobustnessContext | None = None,
    ) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.window = check_fraction("window", window, 0.0, 1.0, lo_open=True)
        self.bn_batches = check_int("bn_batches", bn_batches, 0)
        self.seed = check_int("seed", seed, 0)
        self.hooks, self._context_arg = hooks, context
        self._ctx = context
        self._dir: Path | None = self.dirpath
        self._epochs: list[int] = []  # validated epochs of the fit(s), ascending
        self._kept: list[int] = []  # those in the window (weights on disk, written by rank 0)
        self.report: dict[str, Any] | None = None  # what balanced_average.json says, for programmatic use

    @property
    def state_key(self) -> str:
        return self._generate_state_key(window=self.window)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self.join_context(trainer)
        # the ECOD flags come from BalancedCheckpoint: without it fit stops before training, saying so
        self.context.join(type(self).__name__, self.dirpath, requires=("corners",))

    def on_fit_start(self, trainer, pl_module) -> None:
        self._dir = self.context.finalize(trainer)
        self._finished = False

    def on_fit_end(self, trainer, pl_module) -> None:
        # A fit resumed after its last epoch's checkpoint (kill -9 or SIGTERM in the end-of-fit window)
        # runs no training loop and no on_train_end: the average is made here when its report is missing
        # (BalancedCheckpoint, earlier in the list, has re-made the corner cases by then).
        if getattr(self, "_finished", True) or self._ctx is None or self._dir is None:
            return
        done = (self._dir / average_file.NAME).is_file() if trainer.is_global_zero else None
        if trainer.strategy.broadcast(done, src=0):
            return
        if trainer.train_dataloader is None:  # the skipped loop never built it; BN re-estimation reads it
            try:
                trainer.fit_loop.setup_data()
            except Exception:  # noqa: BLE001 -- then BN statistics stay averaged (said in the report)
                log.warning(
                    "BalancedAverage: could not rebuild the training dataloader at the end of the fit"
                )
        self.on_train_end(trainer, pl_module)

    def _snapshot(self, epoch: int) -> Path:
        return self.fit_dir / average_file.WINDOW_DIR / f"epoch={epoch:04d}.pt"

    # ------------------------------------------------------------------ per validation
    def on_validation_end(self, trainer, pl_module) -> None:
        if not fitting(trainer) or self._ctx is None:
            return
        epoch = int(trainer.current_epoch)
        if epoch not in self._epochs:
            self._epochs.append(epoch)
        keep = window_epochs(self._epochs, self.window)
        if trainer.is_global_zero:
            # DDP keeps the ranks' weights equal, so rank 0's copy is everyone's
            buf = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in pl_module.state_dict().items()}, buf)
            atomic_write_bytes(self._snapshot(epoch), buf.getvalue())
            for e in set(self._kept) - set(keep):
                self._snapshot(e).unlink(missing_ok=True)
        self._kept = keep

    # ------------------------------------------------------------------ end of fit
    def on_train_end(self, trainer, pl_module) -> None:
        if self._ctx is None or self._dir is None:
            return
        self._finished = True
        payload = self._average() if trainer.is_global_zero else None
        received = broadcast_object(trainer, payload, src=0)
        assert received is not None  # rank 0's payload, which _average always returns
        state, report = received
        if state is not None:  # collective from here: every rank loads the average and saves
            report["bn"] = self._save(trainer, pl_module, state)
            report["checkpoint"] = average_file.CHECKPOINT
        self.report = report
        if trainer.is_global_zero:
            average_file.write(self._dir, report)
            shutil.rmtree(self._dir / average_file.WINDOW_DIR, ignore_errors=True)
        barrier(trainer, "BalancedAverage.end")

    def _flags(self) -> tuple[dict[str, list[int]], str]:
        corners = self.context.corners
        if corners is None:
            return {}, "no corner-case analysis was available, so no epoch was flagged"
        flags = {str(c): [int(e) for e in eps] for c, eps in (corners.outlier_epochs or {}).items()}
        return (
            flags,
            f"{len(flags)} corner case(s) with ECOD outlier epochs {sorted({e for v in flags.values() for e in v})}",
        )

    def _average(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        flags, why = self._flags()
        window = list(self._kept)
        on_disk = [e for e in window if self._snapshot(e).is_file()]
        missing = [e for e in window if e not in on_disk]
        if missing:
            log.warning(
                "BalancedAverage: the weights of window epoch(s) %s are not in %s (that fit ended, or the "
                "folder was removed); balanced_average.ckpt leaves them out",
                missing,
                self.fit_dir / average_file.WINDOW_DIR,
            )
        report = {
            "status": "ok",
            "reason": "",
            "checkpoint": None,
            "window": self.window,
            "window_epochs": window,
            "outlier_epochs": flags,
            "averaged_epochs": [],
            "excluded_epochs": [],
            "missing_epochs": missing,
            "bn": {"reestimated": False, "batches": 0},
        }
        if not on_disk:
            report.update(
                status="not_enough_data",
                reason="no epoch weights in the window (no validation ran during the fit?)",
            )
            return None, report
        # every window epoch collapsing for some corner case: the least-flagged ones (status no_inlier_epoch)
        inliers, report["status"] = inlier_epochs(on_disk, flags)
        report["averaged_epochs"] = inliers
        report["excluded_epochs"] = [e for e in on_disk if e not in inliers]
        report["reason"] = (
            f"{why}; averaged {len(inliers)} of the {len(window)} epoch(s) in the last "
            f"{100 * self.window:g} % of the validated epochs"
        )
        state = average_states(
            torch.load(self._snapshot(e), map_location="cpu", weights_only=True) for e in inliers
        )
        return state, report

    def _save(self, trainer, pl_module, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        own = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        dst = self.fit_dir / average_file.CHECKPOINT
        tmp = dst.with_name(f".{dst.name}.tmp")
        try:
            pl_module.load_state_dict(state)
            bn = self._reestimate_bn(trainer, pl_module)
            # weights_only: no callback's on_save_checkpoint runs, so an EMA callback cannot swap in its weights
            trainer.save_checkpoint(tmp, weights_only=True)  # collective: every rank calls it, rank 0 writes
            if trainer.is_global_zero:
                os.replace(tmp, dst)
        finally:
            pl_module.load_state_dict(own)
        return bn

    def _reestimate_bn(self, trainer, pl_module) -> dict[str, Any]:
        if self.bn_batches == 0 or not any(isinstance(m, _BatchNorm) for m in pl_module.modules()):
            return {"reestimated": False, "batches": 0}
        loader = trainer.train_dataloader
        if isinstance(loader, dict):
            loader = next(iter(loader.values()), None)
        elif isinstance(loader, (list, tuple)):
            loader = loader[0] if loader else None
        if loader is None:
            log.warning(
                "BalancedAverage: no training dataloader at the end of the fit; the BatchNorm statistics "
                "of balanced_average.ckpt are the averaged ones, not re-estimated"
            )
            return {"reestimated": False, "batches": 0}
        hooks = self.hooks or self.context.hooks or BatchHooks()
        seen = [0]

        def images():
            for batch in itertools.islice(iter(loader), self.bn_batches):
                seen[0] += 1
                yield hooks.get_images(batch)

        saved = rng_state()
        try:  # same seed -> same batches, whatever the run did before; the run's RNG is left as it was
            torch.manual_seed(self.seed)
            np.random.seed(self.seed)
            random.seed(self.seed)
            update_bn(images(), pl_module, device=pl_module.device)
        finally:
            set_rng_state(saved)
        return {"reestimated": True, "batches": seen[0]}

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"epochs": list(self._epochs), "kept": list(self._kept)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._epochs = [int(e) for e in state_dict.get("epochs", [])]
        self._kept = [int(e) for e in state_dict.get("kept", [])]
