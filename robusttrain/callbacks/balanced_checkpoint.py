"""BalancedCheckpoint: keep the weights of recent validation epochs, then save the balanced one.

At every validation of a fit it saves a candidate checkpoint (``<run_dir>/balanced_candidates/``),
prunes the ones selection can no longer choose, records the monitored value (least-loss epoch) and
runs the corner-case analysis once on the history so far (provisional corner cases, shared with the
reporter through the context). Every policy chooses among these kept candidates (``candidate_epochs`` of
``corner_cases.json``), so the epoch a policy picks always has its weights on disk. The per-case history is the MetamorphicCallback's when one is in the
trainer (through the shared :class:`~robusttrain.callbacks.context.RobustnessContext`), else the
callback computes volume-level per-case Dice itself from the validation batches (read with the
same :class:`~robusttrain.metamorphic.batch.BatchHooks`). At the end of fitting it runs
:func:`robusttrain.cornercases.select_balanced_epoch` (reference = least-loss epoch), writes
``balanced.ckpt`` (the epoch of ``policy``) and ``corner_cases.json`` and removes
``balanced_candidates/``. The epochs the *other* policies pick among the same candidates keep their
weights too, in ``balanced_picks/epoch=NNNN.ckpt`` (``policy_epochs`` / ``policy_checkpoints`` of
``corner_cases.json``): the report's trade-off table lists each policy's epoch, and each one it lists can
be scored or deployed without retraining (at most three more checkpoints, usually one or none).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import numpy as np
import pandas as pd
import torch
from typing_extensions import override

from robusttrain.cornercases import POLICIES, Selection, load_history, max_flagged, select_balanced_epoch
from robusttrain.cornercases.balanced import check_worst_fraction, epoch_table
from robusttrain.cornercases.ecod import MAX_CONTAMINATION, TAILS
from robusttrain.cornercases.history import metric_columns
from robusttrain.cornercases.margin import selection_margin
from robusttrain.cornercases.tradeoff import policy_tradeoff
from robusttrain.io import atomic_copy
from robusttrain.metamorphic.batch import BatchHooks, case_id_list, normalise_mask
from robusttrain.metamorphic.outputs import NonFiniteOutputError, main_output
from robusttrain.metamorphic.scoring import dice_from_sums, iou_from_sums, logits_sums
from robusttrain.rundir import corner_cases as corners_file
from robusttrain.rundir import history as history_file
from robusttrain.validate import check_choice, check_fraction, check_int

from ._dist import gather_objects
from .compat import fitting
from .context import RobustnessContext
from .lifecycle import ContextMember

log = logging.getLogger(__name__)

CANDIDATES = "balanced_candidates"
PICKS = corners_file.PICKS_DIR  # the other policies' epochs, kept after the fit


class BalancedCheckpoint(ContextMember):
    """Save the balanced checkpoint of paper 004 (see module docstring).

    Args:
        dirpath: run directory for the outputs (default: the shared context's, i.e. the other
            robustness callbacks' ``dirpath``, else ``trainer.log_dir`` / ``default_root_dir``).
        policy: ``last_inlier`` | ``maximin`` | ``pareto`` | ``cvar``.
        worst_fraction: share of cases whose mean Dice the ``cvar`` policy maximises, in (0, 1].
        contamination: expected share of corner cases / outlier epochs, in (0, 0.5].
        tail, metric: passed to the ECOD analysis (metric = column prefix;
            self-computed histories have ``dice_<class>`` and ``iou_<class>``).
        monitor, mode: the logged value that defines the least-loss (reference) epoch; when it is
            never logged, a warning lists the keys that were.
        min_epoch: epochs before it are warm-up: neither analysed nor candidates.
        retention: ``"auto"`` keeps only what the policy can still choose -- ``r = flags(cases)·flags(epochs)``
            bounds how many epochs ECOD can remove, so ``last_inlier`` needs only the last ``r+1`` epochs
            and ``cvar`` the ``r+1`` with the best worst-fraction Dice (an epoch's score is fixed once it
            is validated); ``maximin`` and ``pareto`` rank by the corner cases, which move with the
            least-loss epoch, so they keep every epoch --, ``"all"``, or an int N = last N epochs.
        compute_dice: None → compute per-case Dice only when no history provider is found.
        class_names: names for self-computed columns (default: the datamodule's ``class_names``).
        threshold: sigmoid threshold for 1-channel outputs.
        hooks: how to read validation batches when computing Dice itself (default: the
            MetamorphicCallback's hooks when there is one, else dict / ``(image, mask)`` batches).
        keep_candidates: keep ``balanced_candidates/`` after the fit (default: removed).
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.

    Raises:
        ValueError: a bad argument (named in the message), when the callback is built.

    Example::

        >>> import lightning.pytorch as pl
        >>> cb = BalancedCheckpoint(dirpath="runs/x", policy="last_inlier", monitor="val_loss")
        >>> isinstance(cb, pl.Callback), cb.state_key
        (True, "BalancedCheckpoint{'policy': 'last_inlier', 'monitor': 'val_loss'}")
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        policy: str = "last_inlier",
        contamination: float = 0.1,
        tail: str = "low",
        metric: str = "dice",
        monitor: str = "val/loss",
        mode: str = "min",
        min_epoch: int = 0,
        retention: str | int = "auto",
        compute_dice: bool | None = None,
        class_names: list[str] | None = None,
        threshold: float = 0.5,
        worst_fraction: float = 0.1,
        hooks: BatchHooks | None = None,
        keep_candidates: bool = False,
        context: RobustnessContext | None = None,
    ) -> None:
        self.policy = check_choice("policy", policy, POLICIES)
        self.worst_fraction = check_worst_fraction(worst_fraction)
        self.mode = check_choice("mode", mode, ("min", "max"))
        self.tail = check_choice("tail", tail, TAILS)  # the analysis' own list of valid values
        self.contamination = check_fraction(
            "contamination", contamination, 0.0, MAX_CONTAMINATION, lo_open=True
        )
        if not (
            retention in ("auto", "all")
            or (isinstance(retention, int) and not isinstance(retention, bool) and retention >= 1)
        ):
            raise ValueError(f"retention={retention!r}: expected 'auto', 'all' or an int >= 1")
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.metric, self.monitor, self.retention = metric, monitor, retention
        self.min_epoch = check_int("min_epoch", min_epoch, 0)
        self.threshold = check_fraction("threshold", threshold)
        self.compute_dice, self.class_names, self.hooks = compute_dice, class_names, hooks
        self.keep_candidates, self._context_arg = bool(keep_candidates), context
        self._rows: list[dict] = []  # self-computed history (standalone mode)
        self._monitor_values: dict[int, float] = {}
        self._saved: list[int] = []  # epochs with a candidate checkpoint on disk
        self._sums: dict[tuple[str, int | str], np.ndarray] = {}  # (case, slice index or sample key)
        self._ctx = context
        self._dir: Path | None = self.dirpath
        self._computing = False
        self._warned_monitor = False
        self._finished = False  # end-of-fit work done in this fit
        self.selection: Selection | None = None  # the last Selection, for programmatic use

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(policy=self.policy, monitor=self.monitor)

    # ------------------------------------------------------------------ setup / paths
    PROVIDES = ("corners",)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self._finished = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        # every setup has run: whether an MR callback provides the history is known now
        has_mr = self.context.provides("mr")
        self._computing = self.compute_dice if self.compute_dice is not None else not has_mr
        self._read = self.hooks or self.context.hooks or BatchHooks()

    def _candidate(self, epoch: int) -> Path:
        return self.fit_dir / CANDIDATES / f"epoch={epoch:04d}.ckpt"

    def _pick(self, epoch: int) -> str:
        """Where another policy's epoch is kept, relative to the run directory."""
        return corners_file.pick_name(epoch)

    @property
    def case_history(self) -> pd.DataFrame:
        """The self-computed history (empty unless computing Dice itself)."""
        return history_file.from_rows(self._rows)

    def _history(self) -> pd.DataFrame | None:
        h = self._ctx.history if self._ctx is not None else None
        if isinstance(h, pd.DataFrame) and not h.empty:
            return h
        if self._rows:
            return self.case_history
        return history_file.read(self.fit_dir)

    # ------------------------------------------------------------------ standalone per-case Dice
    def _active(self, trainer) -> bool:
        # only fitting validations are candidates; trainer.validate() and the sanity check are not
        return fitting(trainer) and self._ctx is not None

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sums, self._seen = {}, 0

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._computing or not self._active(trainer) or dataloader_idx != 0:
            return
        hooks = self._read
        images = hooks.get_images(batch)
        with torch.no_grad():
            out = pl_module(images)
        out = main_output(out)  # the head the MetamorphicCallback scores too
        if not bool(torch.isfinite(out).all()):  # NaN logits would score as "predicts background"
            raise NonFiniteOutputError("model outputs (logits)", trainer.current_epoch, "val")
        sums = logits_sums(out, normalise_mask(hooks.get_masks(batch), images).to(out.device), self.threshold)
        cids = hooks.get_case_ids(batch)
        cids = case_id_list(cids) if cids is not None else None
        slices = hooks.get_slice_indices(batch)
        for i, s in enumerate(sums):
            # keyed by slice so DistributedSampler's padded duplicates are counted once; without
            # case ids every sample is its own case (stable across epochs: validation isn't shuffled).
            # On one process the n-th validation sample is dataset index n: "idx<n>", as the
            # MetamorphicCallback names it; under DDP the rank's position identifies it.
            key = (
                f"idx{self._seen + i}"
                if trainer.world_size == 1
                else f"val/r{trainer.global_rank}b{batch_idx}i{i}"
            )
            cid = str(cids[i]) if cids is not None else key
            sl = int(slices[i]) if slices is not None else key
            self._sums[(cid, sl)] = s
        self._seen += len(sums)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._computing or not self._active(trainer):
            return
        merged: dict[tuple[str, int | str], np.ndarray] = {}
        for part in gather_objects(trainer, self._sums):
            merged.update(part)
        per_case: dict[str, np.ndarray] = {}
        for (cid, _), s in merged.items():
            per_case[cid] = per_case.get(cid, 0) + s
        if not per_case:
            return
        n = next(iter(per_case.values())).shape[0]
        dm = getattr(trainer, "datamodule", None)
        dm_names = getattr(dm, "class_names", None) if dm is not None else None
        names = self.class_names or dm_names
        names = list(names) if names and len(names) == n else [f"class{k}" for k in range(1, n + 1)]
        epoch = trainer.current_epoch
        self._rows = [r for r in self._rows if r["epoch"] != epoch]
        for cid in sorted(per_case):
            d, j = dice_from_sums(per_case[cid]), iou_from_sums(per_case[cid])
            self._rows.append(
                {
                    "case_id": cid,
                    "epoch": epoch,
                    **{f"dice_{c}": float(v) for c, v in zip(names, d)},
                    **{f"iou_{c}": float(v) for c, v in zip(names, j)},
                }
            )

    # ------------------------------------------------------------------ candidates
    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._active(trainer):
            return
        epoch = trainer.current_epoch
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None:
            self._monitor_values[epoch] = float(value)
        elif not self._warned_monitor and trainer.is_global_zero:
            self._warned_monitor = True
            keys = sorted(k for k in trainer.callback_metrics if not k.startswith(("mr/", "mining/")))
            log.warning(
                "BalancedCheckpoint: monitor=%r was not logged, so the least-loss epoch is "
                "unknown; logged keys: %s -- set monitor= to one of them",
                self.monitor,
                keys,
            )
        self._provisional(trainer)
        if epoch < self.min_epoch:
            return
        path = self._candidate(epoch)
        tmp = path.with_name(f".{path.name}.tmp")
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
        if epoch not in self._saved:
            self._saved.append(epoch)
        trainer.save_checkpoint(tmp, weights_only=False)  # collective: every rank calls it, rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, path)
        keep = set(self._keep(trainer))
        for e in [e for e in self._saved if e not in keep]:
            self._saved.remove(e)
            if trainer.is_global_zero:
                self._candidate(e).unlink(missing_ok=True)
        trainer.strategy.barrier("BalancedCheckpoint.candidates")

    def _provisional(self, trainer) -> None:
        """The corner-case analysis of the history so far (once per validation), for the reporter."""
        self.context.least_loss_epoch = self.best_epoch()
        h = self._history() if trainer.is_global_zero else None
        if h is None or h.empty or "case_id" not in h:
            return
        h = load_history(h)
        least = self.best_epoch()
        try:
            sel = select_balanced_epoch(
                h,
                self.policy,
                reference_epoch=least if least in set(h["epoch"]) else None,
                contamination=self.contamination,
                tail=self.tail,
                metric=self.metric,
                min_epoch=self.min_epoch,
                worst_fraction=self.worst_fraction,
            )
        except ValueError as err:  # too little history yet: the provisional view is optional
            log.info("BalancedCheckpoint: provisional corner cases unavailable: %s", err)
            return
        self.context.corners = corners_file.from_selection(
            sel, least, f"provisional ({sel.status}): {sel.reason}"
        )

    def _keep(self, trainer) -> list[int]:
        eps = sorted(self._saved)
        if self.retention == "all":
            return eps
        if isinstance(self.retention, int):
            return eps[-self.retention :]
        if self.policy not in ("last_inlier", "cvar"):
            return eps
        h = self._history()
        if h is None or "case_id" not in h:
            return eps
        # ECOD flags at most max_flagged(n) rows, so at most this many epochs can be removed;
        # sizing by max_epochs keeps the window from growing past epochs already pruned.
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 0
        n_ep = max(len(eps), total - self.min_epoch, 1)
        n_cases = int(h["case_id"].nunique())
        removable = max_flagged(n_cases, self.contamination) * max_flagged(n_ep, self.contamination)
        if self.policy == "last_inlier":
            return eps[-(removable + 1) :]
        return self._best_cvar(h, eps, removable + 1)

    def _best_cvar(self, history: pd.DataFrame, eps: list[int], n: int) -> list[int]:
        """The ``n`` epochs of ``eps`` with the best worst-fraction Dice (ties: the later epoch, as
        the policy breaks them); epochs not yet in the history are kept (their score is unknown)."""
        h = load_history(history)
        scored = [e for e in eps if e in set(h["epoch"].tolist())]
        if not scored:
            return eps
        h = h[h["epoch"].isin(scored)]
        cvar = epoch_table(h, metric_columns(h, self.metric), [], self.worst_fraction)["cvar"]
        ranked = sorted(scored, key=lambda e: (round(float(cvar.get(e, -math.inf)), 12), e), reverse=True)
        return sorted(set(ranked[:n]) | (set(eps) - set(scored)))

    def best_epoch(self) -> int | None:
        """Least (``mode="min"``) or greatest monitored epoch; ties go to the earliest."""
        vals = {e: v for e, v in self._monitor_values.items() if math.isfinite(v)}
        if not vals:
            return None
        sign = 1 if self.mode == "min" else -1
        return min(vals, key=lambda e: (sign * vals[e], e))

    # ------------------------------------------------------------------ decision
    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish(trainer)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed from a run that was stopped after its last epoch's checkpoint (kill -9,
        # SIGTERM during the end-of-fit work) has no epoch left: Lightning skips the training loop
        # and on_train_end. The end-of-fit work is idempotent, so it is simply done here when missing.
        if self._finished or self._ctx is None or self._dir is None:
            return
        done = (self._dir / corners_file.NAME).is_file() if trainer.is_global_zero else None
        if not trainer.strategy.broadcast(done, src=0):
            self._finish(trainer)
        elif trainer.is_global_zero and not self.keep_candidates:
            # stopped while removing the candidates, after corner_cases.json was committed
            shutil.rmtree(self._dir / CANDIDATES, ignore_errors=True)

    def _finish(self, trainer) -> None:
        """Select, then write ``balanced.ckpt``, the fallback history and ``corner_cases.json`` (the
        commit: written last but for the candidates' removal). Re-running it gives the same files."""
        self._finished = True
        report = None
        if trainer.is_global_zero:
            report = self._decide()
        chosen = trainer.strategy.broadcast(None if report is None else report["balanced_epoch"], src=0)
        if trainer.is_global_zero:
            assert report is not None  # rank 0 decided just above
            if chosen is not None and self._candidate(chosen).is_file():
                atomic_copy(self._candidate(chosen), self.fit_dir / "balanced.ckpt")
                report["checkpoint"] = "balanced.ckpt"
            kept = self._keep_picks(report, chosen)
            if self._rows:
                history_file.write(self.fit_dir, self.case_history, history_file.FALLBACK_NAME)
            corners_file.write(self.fit_dir, report)
            if self.selection is not None:
                self.context.corners = corners_file.from_selection(self.selection, report["least_loss_epoch"])
            for stale in sorted((self.fit_dir / PICKS).glob("epoch=*.ckpt")):
                if stale.name not in kept:  # an earlier fit's pick that no policy picks now
                    stale.unlink(missing_ok=True)
            if not self.keep_candidates:
                # the fit is over: its candidates (one checkpoint per kept epoch) are no longer needed
                shutil.rmtree(self.fit_dir / CANDIDATES, ignore_errors=True)
        trainer.strategy.barrier("BalancedCheckpoint.end")

    def _keep_picks(self, report: dict, chosen: int | None) -> set[str]:
        """Copy the candidate of every other policy's epoch to ``balanced_picks/`` (before
        corner_cases.json commits them) and record where each policy's weights are."""
        where: dict[str, str | None] = {}
        kept: set[str] = set()
        for policy, epoch in (report.get("policy_epochs") or {}).items():
            if epoch is None:
                where[policy] = None
            elif epoch == chosen and report.get("checkpoint"):
                where[policy] = report["checkpoint"]
            elif self._candidate(epoch).is_file():
                rel = self._pick(epoch)
                if rel not in where.values():  # several policies often pick one epoch: one copy
                    (self.fit_dir / PICKS).mkdir(exist_ok=True)
                    atomic_copy(self._candidate(epoch), self.fit_dir / rel)
                where[policy] = rel
                kept.add(Path(rel).name)
            else:
                where[policy] = None
        report["policy_checkpoints"] = where
        return kept

    def _decide(self) -> dict:
        best = self.best_epoch()
        base = {
            "policy": self.policy,
            "monitor": self.monitor,
            "mode": self.mode,
            "least_loss_epoch": best,
            "contamination": self.contamination,
            "tail": self.tail,
            "metric": self.metric,
            "min_epoch": self.min_epoch,
            "worst_fraction": self.worst_fraction,
            "checkpoint": None,
        }
        raw = self._history()
        if raw is None or raw.empty:
            self.selection = None
            return {
                **base,
                "status": "not_enough_data",
                "reason": "no per-case history was recorded",
                "balanced_epoch": None,
                "reference_epoch": None,
                "corner_cases": [],
                "outlier_epochs": {},
                "candidate_epochs": sorted(self._saved),
                "dice": {},
            }
        h = load_history(raw)
        # every policy on the same history and candidates (the report's trade-off table); this run's
        # policy's selection is the one balanced.ckpt holds
        others = policy_tradeoff(
            h,
            reference_epoch=best,
            candidates=[e for e in self._saved if self._candidate(e).is_file()],
            contamination=self.contamination,
            tail=self.tail,
            metric=self.metric,
            min_epoch=self.min_epoch,
            worst_fraction=self.worst_fraction,
        )
        sel = self.selection = others.selections[self.policy]
        cc = sel.corner_cases
        margin = selection_margin(h, sel, metric=self.metric)  # diagnostics: how sure is the choice?
        if margin["warning"]:
            log.warning("BalancedCheckpoint: %s", margin["warning"])
        return {
            **base,
            "status": sel.status,
            "reason": sel.reason,
            "balanced_epoch": sel.epoch,
            "margin": margin,
            "reference_epoch": sel.reference_epoch,
            "columns": cc.columns,
            "threshold": cc.threshold,
            "corner_cases": [
                {"case_id": c, "score": cc.scores[c], "contributions": cc.contributions[c]}
                for c in cc.case_ids
            ],
            "outlier_epochs": sel.outlier_epochs,
            "candidate_epochs": sel.candidates,
            # every policy's epoch among the same candidates (the report's trade-off table)
            "policy_epochs": {p: others.choices.get(p) for p in POLICIES},
            "dice": {
                "least_loss": dice_summary(h, cc.columns, best),
                "balanced": dice_summary(h, cc.columns, sel.epoch),
            },
        }

    # ------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self._rows),
            "monitor_values": dict(self._monitor_values),
            "saved": list(self._saved),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rows = list(state_dict.get("rows", []))
        self._monitor_values = {int(k): float(v) for k, v in state_dict.get("monitor_values", {}).items()}
        self._saved = [int(e) for e in state_dict.get("saved", [])]


def dice_summary(history: pd.DataFrame, columns: list[str], epoch: int | None) -> dict | None:
    """Per-case and cohort metric values (plus their class mean) at one epoch of a clean history."""
    if epoch is None:
        return None
    at = history[history["epoch"] == epoch].set_index("case_id")[columns].sort_index()
    at = at.assign(mean=at[columns].mean(axis=1))
    cohort = {c: float(v) for c, v in at.mean(axis=0).items()}
    per_case = {cid: {c: float(v) for c, v in r.items()} for cid, r in at.iterrows()}
    return {"epoch": int(epoch), "cohort": cohort, "per_case": per_case}
