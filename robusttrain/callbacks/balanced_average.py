"""BalancedAverage: ``balanced_average.ckpt``, the uniform average of the inlier epochs late in training.

Averaging weights helps the tail where selecting one epoch does not (SWA, Izmailov et al. 2018; SWAD,
Cha et al., NeurIPS 2021). Both average points around *one* basin visited under a constant (or cyclic)
learning rate -- SWA after a constant-LR phase, SWAD densely over a constant-LR run with an
overfit-aware window -- not a cosine's descent path, whose late epochs barely move and whose early ones
are far from the end. The rule, for ``window="lr_tail"`` (the recipes' default, with the model's
``lr_tail``: :mod:`robusttrain.training.schedules`):

1. **Window = the constant-LR tail.** The callback records the optimizer's LR at the start and the end
   of every training epoch; the window is the trailing run of validated epochs trained at the last
   epoch's LR. A run without such a tail (fewer than two epochs at the final LR: a cosine to the end)
   falls back to the last ``FALLBACK_WINDOW`` (half) of the validated epochs, with a warning and
   ``rule: "fraction"`` in the report. A number ``window`` is that fraction of the validated epochs,
   the last ones (SWA starts at ~75 % of the budget, but the recipes train 8-50 epochs, and a quarter of 8
   leaves 2 epochs, 1 after ECOD).
2. **Overfit-aware: ECOD inliers only** (SWAD's window ends where validation loss rises; here the
   per-case signal): the epochs that BalancedCheckpoint's ECOD analysis flags as a corner case's outlier
   (collapse) epoch are left out, read from the shared
   :class:`~robusttrain.callbacks.context.RobustnessContext` (``corners.outlier_epochs``, so a
   BalancedCheckpoint must be in the trainer). When every window epoch is flagged, those flagged for the
   fewest corner cases are averaged (``status="no_inlier_epoch"``).
3. **Uniform average of the epoch-end weights** (float64 sums), then **BatchNorm re-estimated**: averaged
   weights do not match averaged running statistics, so every rank runs the average in train mode over
   at most ``bn_batches`` training batches with BN momentum ``None`` (a cumulative mean:
   :func:`torch.optim.swa_utils.update_bn`), seeded, the global RNG restored after. Models without BN
   are not touched (``bn.reestimated: false``).

Each validation of the fit saves the model's weights (rank 0) to ``<run_dir>/balanced_average_window/``
and deletes those that can no longer be in the window; the folder is removed when the fit ends. Rank 0
then writes ``balanced_average.ckpt`` (a weights-only Lightning checkpoint that
:func:`robusttrain.checkpoints.load_checkpoint` reads) and ``balanced_average.json`` (which epochs and
why: :mod:`robusttrain.rundir.balanced_average`), each atomically under the product's temp pattern, and
the model gets its own weights back: the average is a file, as balanced.ckpt is.

This run's files only: every snapshot's SHA-256 is kept in the callback state, and ``run_id`` (a digest
of those and of the callback's settings) is written into ``balanced_average.json``. A snapshot whose
bytes do not match is another run's (left out, listed in ``missing_epochs``), and at the end of a fit
the average counts as done only when the json's ``run_id`` is this run's -- never because a file of
that name exists (an ``overwrite`` with another seed leaves the old run's json behind).

Resume: the callback state (validated epochs, their LRs and digests, the kept epochs) is in
``last.ckpt``; the weights of window epochs stay on disk until the fit *ends*, so a killed run resumed
from ``last.ckpt`` ends with the same average as an uninterrupted one, also when the kill fell in the
end-of-fit work (a resumed fit with no epoch left makes the average in ``on_fit_end``). A fit that ended
and is resumed to more epochs no longer has the earlier window's weights: they are left out, with a
warning, and listed as ``missing_epochs``.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from torch.nn.modules.batchnorm import _BatchNorm
from typing_extensions import override

from robusttrain.io import atomic_write_bytes
from robusttrain.metamorphic.batch import BatchHooks
from robusttrain.rundir import balanced_average as average_file
from robusttrain.training.averaging import (  # the averaging maths; re-exported here as before
    FALLBACK_WINDOW,
    LR_TAIL,
    average_states,
    check_window,
    constant_lr_tail,
    inlier_epochs,
    seeded_update_bn,
    window_epochs,
)
from robusttrain.validate import check_int

from ._dist import barrier, broadcast_object
from ._weights import save_weights
from .compat import fitting
from .context import RobustnessContext
from .lifecycle import ContextMember

log = logging.getLogger(__name__)


def seeded_loader(loader: Any, seed: int) -> Any:
    """A new in-process loader over ``loader``'s dataset, batch size and collate whose order depends on
    ``seed`` only (shuffled when ``loader`` shuffles): the trained loader's own shuffle state at the end of
    a fit is not the same in a run and in its resumption after a kill at the end of the fit (measured:
    the same generator state, other batches), so re-estimating on it gave other BN statistics. Under DDP
    every rank reads the same first batches. A loader without a batch size (a batch sampler) is used as is.
    """
    from torch.utils.data import DataLoader, RandomSampler

    if getattr(loader, "batch_size", None) is None or not hasattr(loader, "dataset"):
        return loader
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        shuffle=isinstance(getattr(loader, "sampler", None), RandomSampler),
        generator=torch.Generator().manual_seed(int(seed)),
        collate_fn=loader.collate_fn,
        drop_last=bool(getattr(loader, "drop_last", False)),
    )


class BalancedAverage(ContextMember):
    """Write ``balanced_average.ckpt`` (see module docstring for the rule and why).

    Args:
        dirpath: run directory (default: the shared context's, as for the other robustness callbacks).
        window: ``"lr_tail"``: the validated epochs of the run's constant-LR tail (falling back to the
            last half when the run has none); a number in (0, 1]: that fraction of the validated epochs,
            the last ones.
        bn_batches: training batches for re-estimating BatchNorm statistics (0: keep the averaged
            running statistics). Only models with BatchNorm layers are affected.
        seed: seeds the pass over the training batches (shuffling, augmentation) for the BN statistics.
        hooks: how to read images from a training batch (default: the MetamorphicCallback's, else
            dict / ``(image, mask)`` batches).
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.

    Raises:
        ValueError: a bad argument (named in the message), when the callback is built.

    Example::

        >>> cb = BalancedAverage(dirpath="runs/x", window="lr_tail", bn_batches=16)
        >>> cb.state_key
        "BalancedAverage{'window': 'lr_tail'}"
        >>> BalancedAverage(window="last")
        Traceback (most recent call last):
        ...
        ValueError: window='last': expected a number in (0, 1] or 'lr_tail'
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        window: float | str = 0.5,
        bn_batches: int = 32,
        seed: int = 0,
        hooks: BatchHooks | None = None,
        context: RobustnessContext | None = None,
    ) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.window = check_window(window)
        self.bn_batches = check_int("bn_batches", bn_batches, 0)
        self.seed = check_int("seed", seed, 0)
        self.hooks, self._context_arg = hooks, context
        self._ctx = context
        self._dir: Path | None = self.dirpath
        self._epochs: list[int] = []  # validated epochs of the fit(s), ascending
        self._kept: list[int] = []  # those that may be in the window (weights on disk, written by rank 0)
        self._lrs: dict[int, list[float]] = {}  # epoch -> [LR at its start, LR at its end]
        self._digests: dict[int, str] = {}  # epoch -> SHA-256 of its snapshot (rank 0)
        self._saved_flags: dict[str, list[int]] | None = None  # ECOD flags restored from the checkpoint
        self.report: dict[str, Any] | None = None  # what balanced_average.json says, for programmatic use

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(window=self.window)

    # the ECOD flags come from BalancedCheckpoint: without it fit stops before training, saying so
    REQUIRES = ("corners",)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._finished = False

    @property
    def run_id(self) -> str:
        """SHA-256 of this fit's snapshots (every validated epoch's) and the callback's settings: what
        ``balanced_average.json`` must carry to count as this run's."""
        key = {
            "window": self.window,
            "bn_batches": self.bn_batches,
            "seed": self.seed,
            "epochs": {str(e): self._digests.get(e) for e in self._epochs},
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed after its last epoch's checkpoint (kill -9 or SIGTERM in the end-of-fit window)
        # runs no training loop and no on_train_end: the average is made here unless this run's report
        # is already there (BalancedCheckpoint, earlier in the list, has re-made the corner cases by then).
        if getattr(self, "_finished", True) or self._ctx is None or self._dir is None:
            return
        done = None
        if trainer.is_global_zero:
            written = average_file.read(self._dir)
            done = written is not None and written.get("run_id") == self.run_id
            if done:  # killed after the report, before the folder was removed
                shutil.rmtree(self._dir / average_file.WINDOW_DIR, ignore_errors=True)
        if trainer.strategy.broadcast(done, src=0):
            self._finished = True
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

    # ------------------------------------------------------------------ per epoch / validation
    def _record_lr(self, trainer, at: int) -> None:
        if not fitting(trainer) or not trainer.optimizers:
            return
        lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        rec = self._lrs.setdefault(int(trainer.current_epoch), [lr, lr])
        rec[at] = lr

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record_lr(trainer, 0)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # before Lightning steps epoch-interval schedulers: the LR this epoch ended with
        self._record_lr(trainer, 1)

    def _may_be_in_window(self) -> list[int]:
        if self.window == LR_TAIL:  # the tail may still grow, the fallback needs the last half
            keep = set(constant_lr_tail(self._epochs, self._lrs))
            return sorted(keep | set(window_epochs(self._epochs, FALLBACK_WINDOW)))
        return window_epochs(self._epochs, float(self.window))

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not fitting(trainer) or self._ctx is None:
            return
        epoch = int(trainer.current_epoch)
        if epoch not in self._epochs:
            self._epochs.append(epoch)
        keep = self._may_be_in_window()
        if trainer.is_global_zero:
            # DDP keeps the ranks' weights equal, so rank 0's copy is everyone's
            buf = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in pl_module.state_dict().items()}, buf)
            data = buf.getvalue()
            atomic_write_bytes(self._snapshot(epoch), data)
            self._digests[epoch] = hashlib.sha256(data).hexdigest()
            for e in set(self._kept) - set(keep):
                self._snapshot(e).unlink(missing_ok=True)
        self._kept = keep

    # ------------------------------------------------------------------ end of fit
    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
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
            if state is None:  # no average: no file of an earlier run may pass for this one's
                (self._dir / average_file.CHECKPOINT).unlink(missing_ok=True)
            average_file.write(self._dir, report)
            shutil.rmtree(self._dir / average_file.WINDOW_DIR, ignore_errors=True)
        barrier(trainer, "BalancedAverage.end")

    def _context_flags(self) -> dict[str, list[int]] | None:
        """The ECOD outlier epochs of the corner cases as the shared context has them now (rank 0), or None."""
        corners = None if self._ctx is None else self._ctx.corners
        if corners is None:
            return None
        return {str(c): [int(e) for e in eps] for c, eps in (corners.outlier_epochs or {}).items()}

    def _flags(self) -> tuple[dict[str, list[int]], str]:
        # a resumed fit with no epoch left may have no analysis in the context (BalancedCheckpoint found its
        # file): the one saved with the checkpoint, i.e. of the full validation history, is the same analysis
        flags = self._context_flags()
        if flags is None:
            flags = self._saved_flags
        if flags is None:
            return {}, "no corner-case analysis was available, so no epoch was flagged"
        return (
            flags,
            f"{len(flags)} corner case(s) with ECOD outlier epochs {sorted({e for v in flags.values() for e in v})}",
        )

    def _window(self) -> tuple[list[int], str, str]:
        """(window epochs, rule, why) at the end of the fit."""
        if self.window != LR_TAIL:
            window = window_epochs(self._epochs, float(self.window))
            return window, "fraction", f"the last {100 * float(self.window):g} % of the validated epochs"
        tail = constant_lr_tail(self._epochs, self._lrs)
        if len(tail) >= 2:
            lr = self._lrs[tail[-1]][0]
            return tail, LR_TAIL, f"the {len(tail)} validated epoch(s) of the constant-LR tail (LR {lr:.3g})"
        window = window_epochs(self._epochs, FALLBACK_WINDOW)
        log.warning(
            "BalancedAverage(window='lr_tail'): the run has no constant-LR tail (the LR changed up to the "
            "last epoch); averaging the last %g %% of the validated epochs instead -- give the model an "
            "LR tail (SegmentationModule(lr_tail=0.25)) for the SWA-style average",
            100 * FALLBACK_WINDOW,
        )
        why = (
            f"no constant-LR tail (the LR changed up to the last epoch), so the last "
            f"{100 * FALLBACK_WINDOW:g} % of the validated epochs"
        )
        return window, "fraction", why

    def _on_disk(self, epoch: int) -> bool:
        """The epoch's snapshot is there and is this run's (its SHA-256 is the one recorded when written)."""
        path = self._snapshot(epoch)
        if not path.is_file():
            return False
        want = self._digests.get(epoch)
        if want is None or hashlib.sha256(path.read_bytes()).hexdigest() == want:
            return True
        log.warning("BalancedAverage: %s is not this run's snapshot of epoch %d; left out", path, epoch)
        return False

    def _average(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        flags, why = self._flags()
        window, rule, which = self._window()
        on_disk = [e for e in window if self._on_disk(e)]
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
            "run_id": self.run_id,
            "window": self.window,
            "rule": rule,
            "window_epochs": window,
            "window_lr": [self._lrs.get(e, [None])[0] for e in window],
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
        report["reason"] = f"{why}; averaged {len(inliers)} of the {len(window)} epoch(s) in {which}"
        state = average_states(
            torch.load(self._snapshot(e), map_location="cpu", weights_only=True) for e in inliers
        )
        return state, report

    def _save(
        self, trainer: L.Trainer, pl_module: L.LightningModule, state: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        own = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        try:
            pl_module.load_state_dict(state)
            bn = self._reestimate_bn(trainer, pl_module)
            # weights-only: no callback's on_save_checkpoint runs, so an EMA callback cannot swap in its weights
            save_weights(trainer, self.fit_dir / average_file.CHECKPOINT)
        finally:
            pl_module.load_state_dict(own)
        return bn

    def _reestimate_bn(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
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

        fresh = seeded_loader(loader, self.seed)

        def images():
            for batch in itertools.islice(iter(fresh), self.bn_batches):
                seen[0] += 1
                yield hooks.get_images(batch)

        seeded_update_bn(images(), pl_module, self.seed, device=pl_module.device)
        return {"reestimated": True, "batches": seen[0]}

    # ------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "epochs": list(self._epochs),
            "kept": list(self._kept),
            "lrs": {int(e): list(v) for e, v in self._lrs.items()},
            "digests": {int(e): d for e, d in self._digests.items()},
            # the corner-case analysis when this checkpoint is saved (after every validation hook)
            "flags": self._context_flags() if self._context_flags() is not None else self._saved_flags,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._epochs = [int(e) for e in state_dict.get("epochs", [])]
        self._kept = [int(e) for e in state_dict.get("kept", [])]
        self._lrs = {int(e): [float(x) for x in v] for e, v in state_dict.get("lrs", {}).items()}
        self._digests = {int(e): str(d) for e, d in state_dict.get("digests", {}).items()}
        flags = state_dict.get("flags")
        self._saved_flags = None if flags is None else {str(c): [int(e) for e in v] for c, v in flags.items()}
