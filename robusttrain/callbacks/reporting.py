"""RobustnessReporter: per-epoch plots, W&B charts and a console summary of the robustness state.

Put it *last* in the callbacks list, after the MetamorphicCallback and BalancedCheckpoint it reads:

    >>> import lightning.pytorch as L
    >>> from robusttrain.callbacks import MetamorphicCallback, RobustnessReporter
    >>> cbs = [MetamorphicCallback(perturbations=["blur"], severities=(2,)), RobustnessReporter()]
    >>> trainer = L.Trainer(max_epochs=2, callbacks=cbs, logger=False)   # then trainer.fit(...)

After every ``every_n_epochs``-th validation of a fit (``on_validation_end``, i.e. after the other
callbacks' epoch-end work and after the epoch's metrics are collected), on global rank 0:

* regenerates ``<run_dir>/plots/*.png`` (:func:`robusttrain.reporting.write_plots`);
* with a Lightning ``WandbLogger``: corner-case line series per structure (``corners/dice_<c>``),
  new failures as rows of one incremental ``wandb.Table`` (``failures/table``; source and follow-up
  images with GT and prediction mask overlays), the corner-case summary in ``run.summary``, and
  the ``mr/efr/...`` scalars *only* when no MetamorphicCallback logs them already;
* prints the currently flagged corner cases (and the EFR table when no MR callback printed it).

Corner cases during training are provisional: the callback runs
:func:`robusttrain.cornercases.select_balanced_epoch` on the history so far (the same analysis
BalancedCheckpoint runs once at the end). At ``teardown`` the final ``corner_cases.json`` replaces
them in the plots, charts and summary. Nothing here needs network: W&B's mode is the user's
(the CLI defaults it to offline).
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from robusttrain.reporting import rundir, tables, wandb_charts
from robusttrain.reporting.plots import write_plots
from robusttrain.reporting.rundir import Corners

log = logging.getLogger(__name__)


class RobustnessReporter(Callback):
    """Plots, W&B charts and console summary after each robustness check (see module doc).

    Args:
        dirpath: run directory; None → the MetamorphicCallback's ``dirpath``, else the trainer's
            ``log_dir`` / ``default_root_dir`` (where the MR callback writes its files).
        every_n_epochs: report after every N-th validation of a fit; None → the MR callback's
            ``every_n_epochs`` (so each report follows a check), 1 without one.
        plots: write ``plots/*.png``.
        wandb: log to a ``WandbLogger`` found in ``trainer.loggers`` (ignored when there is none).
        console: print the compact corner-case (and, if nobody else did, EFR) table.
        max_failures_per_epoch: largest-drop failures added to the W&B table per epoch.
        live_corners: compute provisional corner cases each epoch (else only at the end).
        policy, contamination, monitor: used when no BalancedCheckpoint is present to take
            them from (BalancedCheckpoint's settings win, so the live view matches the final one).
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, every_n_epochs: int | None = None,
                 plots: bool = True, wandb: bool = True, console: bool = True,
                 max_failures_per_epoch: int = 16, live_corners: bool = True,
                 policy: str = "last_inlier", contamination: float = 0.1,
                 monitor: str = "val/loss") -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.every_n_epochs = None if every_n_epochs is None else int(every_n_epochs)
        self.max_failures_per_epoch = int(max_failures_per_epoch)
        self.plots, self.wandb, self.console, self.live_corners = plots, wandb, console, live_corners
        self.policy, self.contamination, self.monitor = policy, contamination, monitor
        self.corners: Corners | None = None      # what the last report showed
        self._mr = self._bc = None
        self._pending: list[tuple[Any, dict | None]] = []   # failures since the last report
        self._logged: set[str] = set()            # failure ids already in the W&B table
        self._monitor_values: dict[int, float] = {}
        self._table = None

    # ------------------------------------------------------------------ wiring
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        others = [cb for cb in trainer.callbacks if cb is not self]
        # duck-typed so user subclasses / look-alikes work: the MR callback has efr + history
        self._mr = next((cb for cb in others if hasattr(cb, "efr") and hasattr(cb, "history")), None)
        self._bc = next((cb for cb in others if hasattr(cb, "best_epoch") and hasattr(cb, "selection")), None)
        if self._mr is not None and hasattr(self._mr, "add_sink") and self._on_failure not in self._mr.sinks:
            self._mr.add_sink(self._on_failure)

    def _on_failure(self, record: Any, images: dict | None = None) -> None:
        # called by the MR callback on rank 0 for every violation; keep only the worst per epoch
        self._pending.append((record, images))
        if len(self._pending) > 4 * max(self.max_failures_per_epoch, 1):
            self._pending.sort(key=lambda ri: -ri[0].drop)
            del self._pending[self.max_failures_per_epoch:]

    def run_dir(self, trainer: Any) -> Path:
        d = self.dirpath or getattr(self._mr, "dirpath", None) or getattr(trainer, "log_dir", None) \
            or trainer.default_root_dir
        return Path(d)

    # ------------------------------------------------------------------ hooks
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or getattr(trainer.state.fn, "value", trainer.state.fn) != "fit":
            return
        epoch = int(trainer.current_epoch)
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None:
            self._monitor_values[epoch] = float(value)
        every = self.every_n_epochs if self.every_n_epochs is not None else \
            int(getattr(self._mr, "every_n_epochs", 1) or 1)
        if every > 0 and (epoch + 1) % every == 0 and trainer.is_global_zero:
            self._report(trainer, epoch, final=False)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # after on_fit_end / on_train_end: corner_cases.json is final now, the W&B run still open
        if stage == "fit" and trainer.is_global_zero and trainer.current_epoch > 0:
            try:
                self._report(trainer, int(trainer.current_epoch) - 1, final=True)
            except Exception:  # reporting must never turn a finished fit into a failure
                log.exception("RobustnessReporter: final report failed")

    # ------------------------------------------------------------------ one report
    def _report(self, trainer: Any, epoch: int, final: bool) -> None:
        run_dir = self.run_dir(trainer)
        # the MR callback's in-memory tables are fresher than the files (and the same data)
        history = self._frame("history")
        history = history if history is not None else rundir.load_history(run_dir)
        efr = self._frame("efr")
        efr = efr if efr is not None else rundir.load_efr(run_dir)
        corners = self._final_corners(run_dir) if final else None
        if corners is None:
            corners = self._live_corners(history)
        self.corners = corners
        if self.plots:
            write_plots(run_dir, corners=corners or Corners())
        logger = next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None) if self.wandb else None
        if logger is not None:
            self._log_wandb(trainer, logger, run_dir, history, efr, corners, final)
        if self.console and not final:
            self._print(epoch, efr, corners, history)

    def _frame(self, name: str) -> pd.DataFrame | None:
        frame = getattr(self._mr, name, None)
        return frame if isinstance(frame, pd.DataFrame) and len(frame) else None

    def _least_loss(self) -> int | None:
        if self._bc is not None:
            return self._bc.best_epoch()
        return min(self._monitor_values, key=lambda e: (self._monitor_values[e], e)) \
            if self._monitor_values else None

    def _final_corners(self, run_dir: Path) -> Corners | None:
        return rundir.load_corners(run_dir)

    def _live_corners(self, history: pd.DataFrame | None) -> Corners | None:
        if not self.live_corners or history is None or "case_id" not in history:
            return None
        from robusttrain.cornercases import select_balanced_epoch

        bc = self._bc
        least = self._least_loss()
        try:
            sel = select_balanced_epoch(
                history, getattr(bc, "policy", self.policy),
                reference_epoch=least if least in set(history["epoch"]) else None,
                contamination=getattr(bc, "contamination", self.contamination),
                tail=getattr(bc, "tail", "low"), metric=getattr(bc, "metric", "dice"),
                min_epoch=getattr(bc, "min_epoch", 0), worst_fraction=getattr(bc, "worst_fraction", 0.1))
        except Exception as err:  # a provisional view is optional; never break training for it
            log.warning("RobustnessReporter: provisional corner cases unavailable: %s", err)
            return None
        cc = sel.corner_cases
        return Corners(cases=[str(c) for c in cc.case_ids], scores=dict(cc.scores),
                       outlier_epochs={str(k): list(v) for k, v in sel.outlier_epochs.items()},
                       balanced_epoch=sel.epoch, least_loss_epoch=least, policy=sel.policy,
                       reason=f"provisional ({sel.status}): {sel.reason}")

    # ------------------------------------------------------------------ W&B
    def _log_wandb(self, trainer, logger, run_dir, history, efr, corners, final) -> None:
        import wandb

        run = logger.experiment
        payload: dict[str, Any] = {}
        # the MR callback logs mr/efr/... itself through pl_module.log; never log them twice
        if self._mr is None and efr is not None:
            payload.update(wandb_charts.efr_scalars(efr))
        if history is not None and corners is not None and corners.cases:
            payload.update(wandb_charts.corner_case_charts(history, corners))
        rows = self._new_failure_rows(run_dir, trainer)
        if rows:
            if self._table is None:
                # INCREMENTAL: each log uploads only the rows added since the previous log
                self._table = wandb.Table(columns=wandb_charts.FAILURE_COLUMNS, log_mode="INCREMENTAL")
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
        rows = []
        if self._mr is not None:
            pending, self._pending = self._pending, []
            pending.sort(key=lambda ri: -ri[0].drop)
            for rec, images in pending:
                rid = _record_id(rec)
                if rid in self._logged or len(rows) >= self.max_failures_per_epoch:
                    continue
                self._logged.add(rid)
                rows.append(wandb_charts.failure_row({**rec.to_dict()}, images, names))
            return rows
        # no MR callback in this trainer: the failure bank's files are the source
        records = rundir.load_failures(run_dir) or []
        fresh = [r for r in records if str(r.get("id")) not in self._logged]
        for rec in sorted(fresh, key=lambda r: -r.get("drop", 0.0))[: self.max_failures_per_epoch]:
            self._logged.add(str(rec.get("id")))
            rows.append(wandb_charts.failure_row(rec, None, names, rec.get("thumb")))
        return rows

    def _class_names(self, trainer: Any) -> list[str] | None:
        names = getattr(self._mr, "class_names", None) or \
            getattr(getattr(trainer, "datamodule", None), "class_names", None)
        return list(names) if names else None

    # ------------------------------------------------------------------ console
    def _print(self, epoch: int, efr: pd.DataFrame | None, corners: Corners | None,
               history: pd.DataFrame | None) -> None:
        lines = []
        # the MR callback prints its EFR table when verbose; print it only when nobody did
        if efr is not None and not (self._mr is not None and getattr(self._mr, "verbose", False)):
            table = tables.last_efr_by_perturbation(efr)
            lines += [f"EFR % (Dice) at epoch {int(efr['epoch'].max())}:", table.round(1).to_string()]
        if corners is None:
            lines.append(f"Corner cases, epoch {epoch}: not enough history yet")
        elif not corners.cases:
            lines.append(f"Corner cases, epoch {epoch}: none flagged ({corners.reason or ''})")
        else:
            lines.append(f"Corner cases, epoch {epoch} (least-loss epoch {corners.least_loss_epoch}, "
                         f"provisional balanced epoch {corners.balanced_epoch}):")
            table = tables.corner_case_table(history, corners) if history is not None else \
                pd.DataFrame({"case": corners.cases})
            now = history[history["epoch"] == history["epoch"].max()] if history is not None else None
            if now is not None:
                cols = rundir.dice_columns(now)
                dice_now = now.set_index("case_id")[cols].mean(axis=1)
                table["dice now"] = [round(float(dice_now.get(c, float("nan"))), 3) for c in table["case"]]
            keep = [c for c in ("case", "ECOD score", "outlier epochs", "dice now") if c in table]
            lines.append(table[keep].to_string(index=False))
        rank_zero_info("\n".join(lines))

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"logged": sorted(self._logged), "monitor_values": dict(self._monitor_values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._logged = set(state.get("logged", []))
        self._monitor_values = {int(k): float(v) for k, v in state.get("monitor_values", {}).items()}


def _record_id(record: Any) -> str:
    # same spelling as the failure bank's ids, so both sources de-duplicate against each other
    return hashlib.sha1(repr(record.key).encode()).hexdigest()[:16]
