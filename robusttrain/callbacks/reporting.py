"""RobustnessReporter: per-epoch plots, W&B charts and a console summary of the robustness state.

It reads what the other robustness callbacks share through the
:class:`~robusttrain.callbacks.context.RobustnessContext` (their tables, violations and the
corner cases BalancedCheckpoint computes once per validation) or, for what no callback in this
trainer provides, the run directory's files (:mod:`robusttrain.rundir`). It never recomputes an
analysis. Its place in the callbacks list does not matter: it reports at the end of every training
epoch that had a validation (after every validation hook).

On global rank 0:

* writes ``<run_dir>/plots/*.png`` (:func:`robusttrain.reporting.write_plots`) when the fit ends
  (``plots="end"``, the default) or after every report (``plots="epoch"``). Rendering them costs
  ~1-4 s per report on a CPU, 10-20 % of a short recipe's training time when done every epoch, for
  files nobody reads until the run is over; the W&B curves below follow every epoch regardless, and
  ``python -m robusttrain report RUN_DIR`` renders the plots of a run in progress on demand;
* with a ``WandbLogger`` (``lightning.pytorch`` or ``pytorch_lightning``): corner-case line series
  per structure (``corners/dice_<c>``), new failures as rows of one incremental ``wandb.Table``
  (``failures/table``), the corner-case summary in ``run.summary``, and the ``mr/efr/...``
  scalars *only* when no MetamorphicCallback logs them already;
* prints the currently flagged corner cases (and the EFR table when no MR callback printed it).

At ``teardown`` the final ``corner_cases.json`` replaces the provisional corner cases.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as L
import pandas as pd
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from robusttrain.metamorphic.records import failure_id
from robusttrain.reporting import tables, wandb_charts
from robusttrain.reporting.plots import write_plots
from robusttrain.rundir import corner_cases as corners_file
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir import failures as failures_file
from robusttrain.rundir import history as history_file
from robusttrain.rundir.corner_cases import Corners
from robusttrain.validate import check_choice, check_int

from .compat import fitting, wandb_logger
from .context import RobustnessContext
from .lifecycle import ContextMember

if TYPE_CHECKING:  # imported where W&B logs (an optional logger)
    from wandb import Table as WandbTable

log = logging.getLogger(__name__)


class RobustnessReporter(ContextMember):
    """Plots, W&B charts and console summary after each robustness check (see module doc).

    Args:
        dirpath: run directory (default: the shared context's).
        every_n_epochs: report after every N-th epoch with a validation; None: the MR callback's
            ``every_n_epochs`` (so each report follows a check), 1 without one.
        plots: when to write ``plots/*.png``: ``"end"`` (once, when the fit ends), ``"epoch"``
            (after every report; ``True`` means the same) or ``False`` (never).
        wandb: log to the trainer's ``WandbLogger`` (ignored when there is none).
        console: print the compact corner-case (and, if nobody else did, EFR) table.
        max_failures_per_epoch: largest-drop failures added to the W&B table per epoch.
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.

    Raises:
        ValueError: a bad argument, when built.

    Example::

        >>> import lightning.pytorch as L
        >>> from robusttrain.callbacks import MetamorphicCallback
        >>> cbs = [RobustnessReporter(every_n_epochs=1), MetamorphicCallback()]
        >>> trainer = L.Trainer(max_epochs=2, callbacks=cbs, logger=False)   # then trainer.fit(...)
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        every_n_epochs: int | None = None,
        plots: str | bool = "end",
        wandb: bool = True,
        console: bool = True,
        max_failures_per_epoch: int = 16,
        context: RobustnessContext | None = None,
    ) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.every_n_epochs = (
            None if every_n_epochs is None else check_int("every_n_epochs", every_n_epochs, 1)
        )
        self.max_failures_per_epoch = check_int("max_failures_per_epoch", max_failures_per_epoch, 0)
        self.plots = check_choice("plots", "epoch" if plots is True else plots, ("end", "epoch", False))
        self.wandb, self.console, self._context_arg = wandb, console, context
        self.corners: Corners | None = None  # what the last report showed
        self._ctx = context
        self._pending: list[tuple[Any, dict | None]] = []  # failures since the last report
        self._logged: set[str] = set()  # failure ids already in the W&B table
        self._validated = False
        self._table: WandbTable | None = None

    # ------------------------------------------------------------------ wiring
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self.context.subscribe(self._on_failure)

    def _on_failure(self, record: Any, images: dict | None = None) -> None:
        # called by the MR callback on rank 0 for every violation; keep only the worst per epoch
        self._pending.append((record, images))
        if len(self._pending) > 4 * max(self.max_failures_per_epoch, 1):
            self._pending.sort(key=lambda ri: -ri[0].drop)
            del self._pending[self.max_failures_per_epoch :]

    # ------------------------------------------------------------------ hooks
    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = self._validated or fitting(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after every validation hook of this epoch, whatever the callbacks' order
        if not self._validated:
            return
        self._validated = False
        epoch = int(trainer.current_epoch)
        every = self.every_n_epochs or int(self.context.every_n_epochs or 1)
        if (epoch + 1) % every == 0 and trainer.is_global_zero:
            self._report(trainer, epoch, final=False)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # after on_fit_end / on_train_end: corner_cases.json is final now, the W&B run still open
        if stage == "fit" and self._ctx is not None and trainer.is_global_zero and trainer.current_epoch > 0:
            try:
                self._report(trainer, int(trainer.current_epoch) - 1, final=True)
            except Exception:  # reporting must never turn a finished fit into a failure
                log.exception("RobustnessReporter: final report failed")
        super().teardown(trainer, pl_module, stage)  # then this trainer lets go of the run-directory lock

    # ------------------------------------------------------------------ one report
    def _report(self, trainer: Any, epoch: int, final: bool) -> None:
        run_dir = self.fit_dir
        ctx = self.context
        # the MR callback's tables in the context are the files' content, without re-reading them
        history = ctx.history if _rows(ctx.history) else history_file.read(run_dir)
        efr = ctx.efr if _rows(ctx.efr) else efr_file.read(run_dir)
        corners = corners_file.read(run_dir) if final else None
        if corners is None:
            corners = ctx.corners
        self.corners = corners
        if self.plots == "epoch" or (self.plots == "end" and final):
            write_plots(run_dir, corners=corners or Corners())
        logger = wandb_logger(trainer) if self.wandb else None
        if logger is not None:
            self._log_wandb(trainer, logger, run_dir, history, efr, corners, final)
        if self.console and not final:
            self._print(epoch, efr, corners, history)

    # ------------------------------------------------------------------ W&B
    def _log_wandb(self, trainer, logger, run_dir, history, efr, corners, final) -> None:
        import wandb

        run = logger.experiment
        payload: dict[str, Any] = {}
        # the MR callback logs mr/efr/... itself through pl_module.log; never log them twice
        if not self.context.provides("mr") and efr is not None:
            payload.update(wandb_charts.efr_scalars(efr))
        if history is not None and corners is not None and corners.cases:
            payload.update(wandb_charts.corner_case_charts(history, corners))
        rows = self._new_failure_rows(run_dir, trainer)
        if rows:
            if self._table is None:
                # INCREMENTAL: each log uploads only the rows added since the previous log
                # wandb's stub types columns as list[str | int], which a list[str] is not (invariance)
                self._table = wandb.Table(
                    columns=wandb_charts.FAILURE_COLUMNS,  # type: ignore[arg-type]
                    log_mode="INCREMENTAL",
                )
            for row in rows:
                self._table.add_data(*row)
            payload["failures/table"] = self._table
        if payload:
            payload.update({"trainer/global_step": trainer.global_step, "epoch": trainer.current_epoch})
            run.log(payload)
        if corners is not None:
            run.summary.update({**wandb_charts.summary_items(corners), "corners/final": bool(final)})

    def _new_failure_rows(self, run_dir: Path, trainer: Any) -> list[list[Any]]:
        names = self._class_names(trainer)
        rows: list[list[Any]] = []
        if self.context.provides("mr"):
            pending, self._pending = self._pending, []
            pending.sort(key=lambda ri: -ri[0].drop)
            for rec, images in pending:
                rid = failure_id(rec)
                if rid in self._logged or len(rows) >= self.max_failures_per_epoch:
                    continue
                self._logged.add(rid)
                rows.append(wandb_charts.failure_row({**rec.to_dict()}, images, names))
            return rows
        # no MR callback in this trainer: the failure bank's files are the source
        records = failures_file.read(run_dir) or []
        fresh = [r for r in records if str(r.get("id")) not in self._logged]
        for rec in sorted(fresh, key=lambda r: -r.get("drop", 0.0))[: self.max_failures_per_epoch]:
            self._logged.add(str(rec.get("id")))
            rows.append(wandb_charts.failure_row(rec, None, names, rec.get("thumb")))
        return rows

    def _class_names(self, trainer: Any) -> list[str] | None:
        names = self.context.class_names or getattr(getattr(trainer, "datamodule", None), "class_names", None)
        return list(names) if names else None

    # ------------------------------------------------------------------ console
    def _print(
        self, epoch: int, efr: pd.DataFrame | None, corners: Corners | None, history: pd.DataFrame | None
    ) -> None:
        lines = []
        # the MR callback prints its EFR table when verbose; print it only when nobody did
        if efr is not None and not self.context.provides("mr"):
            table = tables.last_efr_by_perturbation(efr)
            lines += [f"EFR % (Dice) at epoch {int(efr['epoch'].max())}:", table.round(1).to_string()]
        if corners is None:
            lines.append(f"Corner cases, epoch {epoch}: not enough history yet")
        elif not corners.cases:
            lines.append(f"Corner cases, epoch {epoch}: none flagged ({corners.reason or ''})")
        else:
            lines.append(
                f"Corner cases, epoch {epoch} (least-loss epoch {corners.least_loss_epoch}, "
                f"provisional balanced epoch {corners.balanced_epoch}):"
            )
            lines.append(tables.corner_console_table(history, corners).to_string(index=False))
        rank_zero_info("\n".join(lines))

    # ------------------------------------------------------------------ checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"logged": sorted(self._logged)}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._logged = set(state.get("logged", []))


def _rows(frame: Any) -> bool:
    return isinstance(frame, pd.DataFrame) and len(frame) > 0
