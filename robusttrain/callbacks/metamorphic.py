"""MetamorphicCallback: a fixed, seeded metamorphic test suite after validation, every N epochs.

Each check scores the probe clean (-> ``history``) and under every perturbation x severity
(-> ``cases``, ``efr``), logs ``mr/efr/<perturbation>/<metric>@<t>`` and writes ``history.csv``,
``efr.csv``, ``mr_cases.csv`` to the run directory (global rank 0). Its tables, hooks, suite and
violations are shared with the other robustness callbacks through the
:class:`~robusttrain.callbacks.context.RobustnessContext`; a FailureMiningCallback asks it (there)
to check training cases too.

``budget`` (a fraction of training time in (0, 1], e.g. 0.25; None = the full suite every check):
each check then scores the clean pass over the whole validation probe plus a seeded, stratified
subset of the (case, perturbation x severity) pairs sized so that the check costs about ``budget``
x the training since the previous one (the train probe shares it), rotating through all pairs over
the epochs (:mod:`robusttrain.metamorphic.budget`). Costs are counted in forward passes scaled by
pixels, never in seconds, so the subset depends on (seed, epoch, data, settings) only: the same
under any machine load and after a kill + resume. The last epoch's check -- or, after an early
stop, one at the end of training -- makes the final EFR table (``efr.csv`` rows with ``final=True``):
by default (``final="rotation"``) it scores its budgeted share plus every (case, test) pair no check
of the run has scored yet, and the table takes every pair's latest score exactly once -- the whole
suite's coverage and Wilson intervals without a whole-suite check on top of the rotation
(:mod:`robusttrain.metamorphic.rotation`; ``basis="rotation"``, ``from_epoch`` = the earliest epoch
whose weights scored one of its pairs); ``final="suite"`` runs the whole suite on the final weights
instead (``basis="suite"``). Every EFR row has a 95 % Wilson interval (``efr_low``, ``efr_high``),
``suite_cases`` (``cases / suite_cases`` = how much of the suite was scored) and ``basis``
(``subset`` | ``suite`` | ``rotation``).

The clean pass over the validation probe reuses the validation loop's own forwards when they were of
the very same inputs and weights (:mod:`robusttrain.metamorphic.reuse`), so the complete per-case clean history costs
no second forward.

Volumes (B,C,H,W,D) work as images do: the suite perturbs them slice-wise (``MRSuite(slice_axis=)``),
the model predicts whole volumes and Dice is per volume (failure mining replays them slice-wise too).
Shapes the check cannot read are refused in ``setup`` with one line naming the shape and the hook to set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as L
import pandas as pd
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from robusttrain.metamorphic.batch import BatchHooks, iter_probe
from robusttrain.metamorphic.budget import (
    CheckBudget,
    TrainClock,
    TrainWork,
    check_budget,
    plan_check,
    plans_subset,
)
from robusttrain.metamorphic.check import (
    Probe,
    checking_state,
    id_prefix,
    probe_cases,
    run_check,
)
from robusttrain.metamorphic.efr import THRESHOLDS, VIOLATION_THRESHOLD, efr_metrics
from robusttrain.metamorphic.failures import build_failures
from robusttrain.metamorphic.heldout import heldout_families, label_heldout, trained_note, with_families
from robusttrain.metamorphic.ledger import CheckEntry, CheckLedger
from robusttrain.metamorphic.reuse import ValidationOutputs
from robusttrain.metamorphic.runner import ProbeResult, aggregate
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir import history as history_file
from robusttrain.rundir import mr_cases as cases_file
from robusttrain.validate import check_choice, check_fraction, check_int

from ._dist import broadcast_object, gather_objects
from ._mr_probe import decide_outputs, make_predict, make_to_probabilities, progress_bar
from .compat import fitting
from .context import RobustnessConfigError, RobustnessContext, TrainProbe
from .lifecycle import ContextMember

Sink = Callable[..., None]
DEGENERATE_DICE = 0.05  # mean clean Dice below which the check's numbers are said to mean nothing


class MetamorphicCallback(ContextMember):
    """Metamorphic checks of the validation set (and, on request, of a training probe).

    Works on any trainer whose model's forward returns (B,1,H,W) (sigmoid) or (B,K,H,W)
    (softmax) logits -- (B,K,H,W,D) for volumes -- and whose samples are dicts (``image``,
    ``mask``, optional ``case_id``, ``slice_index``) or ``(image, mask)`` tuples; anything else:
    set ``hooks``.

    Args:
        suite: the perturbations x severities, their seed and the volume slice axis (default: the
            nine MedTest families at severities 2 and 4, seed 0). Validated when built.
        hooks: how to read images / masks / case ids from a batch and turn outputs into
            probabilities (:class:`~robusttrain.metamorphic.batch.BatchHooks`, its
            ``to_probabilities``: None/"auto", "logits", "identity" or a callable); the other
            robustness callbacks use the same hooks.
        every_n_epochs: check the validation set after every N-th epoch (0: never).
        max_cases: a seeded subset of this many validation cases (None: all).
        budget: fraction of training time the checks may take, in (0, 1] (None: the whole suite
            every check; see the module doc).
        final: with a budget, what the final EFR table rests on: ``"rotation"`` (every pair's
            latest score, the last check completing the rotation) or ``"suite"`` (the whole suite
            on the final weights, its cost reserved from every epoch's budget).
        thresholds: EFR thresholds reported (relative Dice / IoU drop).
        violation_threshold: a test case whose Dice drops by more than this is a violation (a
            failure record; the failure mining's rates use the same value).
        failure_images: image strips (source, follow-up, predictions) for the worst N violations.
        batch_size, num_workers: of the probe's own loader (it reads the dataset, not the trainer's
            loader, so every sample's index is known).
        path: ``"torch"`` (batched, GPU), ``"numpy"`` (per image, CPU) or ``"auto"``.
        dirpath: run directory (default: the context's, i.e. ``trainer.log_dir``).
        val_dataset: dataset to check (default ``datamodule.val_dataset``, else the first
            validation loader's dataset).
        class_names: foreground class names (default: the datamodule's ``class_names``).
        context: a :class:`~robusttrain.callbacks.context.RobustnessContext` shared with the other
            robustness callbacks (default: the trainer's).
        verbose: print the EFR table after each check.
        heldout: test-only families (held out from training): a suite name such as
            ``"endoscopy_heldout"`` or family names; added to the suite when missing, labelled
            ``heldout`` in ``efr.csv`` and every table, and published as
            ``RobustnessContext.heldout_families`` so MetamorphicTraining never draws them; their
            violations are not handed to the context's sinks (failure mining would replay them).

    Raises:
        ValueError: a bad argument (named in the message), when the callback is built.

    Example::

        >>> import lightning.pytorch as L
        >>> from robusttrain.metamorphic.suite import MRSuite
        >>> cb = MetamorphicCallback(suite=MRSuite(["blur", "contrast"], severities=(2,)), max_cases=8)
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False)   # then trainer.fit(...)
    """

    def __init__(
        self,
        suite: MRSuite | None = None,
        hooks: BatchHooks | None = None,
        every_n_epochs: int = 1,
        max_cases: int | None = None,
        budget: float | None = None,
        final: str = "rotation",
        thresholds: Sequence[float] = THRESHOLDS,
        violation_threshold: float = VIOLATION_THRESHOLD,
        failure_images: int = 16,
        batch_size: int = 8,
        num_workers: int = 0,
        path: str = "auto",
        dirpath: str | None = None,
        val_dataset: Any = None,
        class_names: Sequence[str] | None = None,
        context: RobustnessContext | None = None,
        verbose: bool = True,
        heldout: str | Sequence[str] | None = None,
    ):
        if suite is not None and not isinstance(suite, MRSuite):
            raise ValueError(f"suite must be an MRSuite, got {type(suite).__name__}")
        if hooks is not None and not isinstance(hooks, BatchHooks):
            raise ValueError(f"hooks must be a BatchHooks, got {type(hooks).__name__}")
        # test-only families: an unknown name is one line now, not after an epoch
        self.heldout = heldout_families(heldout)
        self.suite = with_families(suite if suite is not None else MRSuite(), self.heldout)
        if "adversarial" in self.suite.names and "model" not in self.suite.perturbation_kwargs.get(
            "adversarial", {}
        ):
            # each case's perturbation is drawn once and replayed every epoch: an attack on one epoch's
            # weights would be scored against the next ones' as if it were adversarial to them
            held = "adversarial" in self.heldout
            raise ValueError(
                f"{'heldout' if held else 'suite perturbations'}: 'adversarial' attacks fixed weights; the "
                "training-time check replays each case's perturbation every epoch, so check a checkpoint "
                "instead: python -m robusttrain check ckpt=RUN/checkpoints/last.ckpt "
                + ("heldout=adversarial" if held else "with adversarial in its suite")
            )
        self.hooks = hooks if hooks is not None else BatchHooks()
        self.seed = self.suite.seed
        self.budget = CheckBudget(check_budget(budget), self.seed)
        self.clock = TrainClock()  # reported only (mr/train_s)
        self.work = TrainWork(self.hooks.get_images)  # what the budget plans with
        self._last_check_epoch = -1  # epoch of the last val check (the final check re-runs it in full)
        self._last_val_full = True
        self._last_trained_epoch = -1
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, 0)
        self.max_cases = None if max_cases is None else check_int("max_cases", max_cases, 1)
        self.violation_threshold = check_fraction("violation_threshold", violation_threshold)
        self.thresholds = tuple(
            sorted({check_fraction("thresholds", t) for t in thresholds} | {self.violation_threshold})
        )
        self.failure_images = check_int("failure_images", failure_images, 0)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.num_workers = check_int("num_workers", num_workers, 0)
        self.path = check_choice("path", path, ("auto", "torch", "numpy"))
        self.final = check_choice("final", final, ("rotation", "suite"))
        self.dirpath, self.val_dataset, self._context_arg = dirpath, val_dataset, context
        self.class_names = list(class_names) if class_names is not None else None
        self.to_probabilities = make_to_probabilities(self.hooks.to_probabilities)
        self.reuse = ValidationOutputs(self.to_probabilities)  # the validation loop's clean labels
        self.verbose = verbose
        self.ledger = CheckLedger(self.thresholds)  # history, efr, cases of every check (one object)
        self.last_failures: list = []
        self._ctx: RobustnessContext | None = context

    @property
    @override
    def state_key(self) -> str:
        # suite-independent, so a resume with a changed suite reaches load_state_dict and is refused
        return self._generate_state_key()

    # -- Lightning hooks ---------------------------------------------------------------
    PROVIDES = ("mr",)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        ctx = self.context
        ctx.hooks, ctx.suite, ctx.violation_threshold = self.hooks, self.suite, self.violation_threshold
        ctx.every_n_epochs, ctx.class_names = self.every_n_epochs, self.class_names
        ctx.heldout_families = frozenset(self.heldout)
        ds = self._dataset(trainer, "val", quiet=True)
        if ds is not None and len(ds):  # refuse shapes the check cannot read now, not after an epoch
            next(iter_probe(ds, [0], 1, self.hooks))

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._publish()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # "auto" outputs: unambiguous probabilities stop fit here, before anything trains
        decide_outputs(trainer, pl_module, self._dataset(trainer, "val"), self.hooks, self.to_probabilities)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.start()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.clock.step()
        if self.budget.enabled:
            self.work.add(batch)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.pause()
        self.reuse.clear()
        if fitting(trainer):
            self.reuse.attach(pl_module)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reuse.detach()
        self.clock.resume()

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not fitting(trainer):
            return
        epoch = int(trainer.current_epoch)
        splits = []
        if self.every_n_epochs > 0 and (epoch + 1) % self.every_n_epochs == 0:
            splits.append("val")
        last = (
            self.budget.enabled
            and trainer.max_epochs is not None
            and trainer.max_epochs > 0
            and epoch + 1 >= trainer.max_epochs
        )
        probe = self._ctx.train_probe if self._ctx is not None else None
        if probe is not None and probe.size > 0 and (epoch + 1) % probe.every_n_epochs == 0 and not last:
            splits.append("train")  # nothing trains on what the last epoch would mine
        if last and "val" not in splits:
            splits.append("val")
        if splits:
            self.check(trainer, pl_module, epoch, splits, full=last)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_trained_epoch = int(trainer.current_epoch)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # stopped early (or by steps / time): the final EFR table is still made (the rotation completed,
        # or the whole suite), on the weights training ended with
        if self.budget.enabled and not self._last_val_full and self._last_check_epoch >= 0:
            epoch = max(self._last_check_epoch, self._last_trained_epoch)
            self.check(trainer, pl_module, epoch, ["val"], full=True, log=False)

    def check(
        self,
        trainer: Any,
        pl_module: Any,
        epoch: int,
        splits: Sequence[str] = ("val",),
        full: bool = False,
        log: bool = True,
    ) -> None:
        """Run the suite on ``splits`` now (all ranks must call it), update tables and files.

        With a ``budget``, a subset of the pairs unless ``full`` (the final check: ``final=True``).
        The check itself is :func:`robusttrain.metamorphic.check.run_check` (what the audit runs too);
        here: which probes, the budget's plan, the trainer's ranks, clock and logging.
        """
        device = next((p.device for p in pl_module.parameters()), torch.device("cpu"))
        path = self.path if self.path != "auto" else ("torch" if device.type == "cuda" else "numpy")
        predict = make_predict(trainer, pl_module, self.to_probabilities)
        metrics: dict[str, float] = {}
        t_start, train_s, train_px = time.perf_counter(), self.clock.take(), self.work.take()
        self.reuse.attach(pl_module)  # the follow-ups' labels too: the failure strips reuse them
        with checking_state(pl_module, self.seed):
            probes: dict[str, Probe] = {}
            for split in splits:
                ds = self._dataset(trainer, split)
                if ds is not None:
                    idx, ids = self._probe(trainer, split, ds)
                    reuse = (lambda pb: self.reuse.lookup(pl_module, pb.images)) if split == "val" else None
                    probes[split] = Probe(ds, idx, ids, id_prefix=id_prefix(split), clean=reuse)
            plan = self._plan(trainer, probes, train_px, epoch, full)
            for split, p in probes.items():
                p.plan = plan.get(split)
            results = run_check(
                predict,
                probes,
                self.suite,
                path=path,
                device=device,
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                hooks=self.hooks,
                epoch=epoch,
                rank=trainer.global_rank,
                world_size=max(1, trainer.world_size),
                gather=lambda obj: gather_objects(trainer, obj),
                progress=lambda split, n: progress_bar(trainer, n, f"MR check ({split})"),
            )
            for split, res in results.items():
                final = full and self.budget.enabled
                basis = (
                    "rotation"
                    if final and self.final == "rotation"
                    else "suite"
                    if probes[split].plan is None
                    else "subset"
                )
                metrics.update(
                    self._record(
                        trainer, pl_module, res, probes[split], epoch, split, predict, path, final, basis, log
                    )
                )
                if split == "val":
                    self._last_check_epoch = epoch
                    self._last_val_full = final or probes[split].plan is None
        if metrics:  # reported only: this check's wall time, the training it follows, clean forwards spared
            metrics.update({"mr/check_s": time.perf_counter() - t_start, "mr/train_s": train_s})
            timing = results["val"].extra.get("timing", {}) if "val" in results else {}
            if timing.get("n_clean"):
                metrics["mr/clean_reused"] = timing.get("n_reused", 0) / timing["n_clean"]
        if metrics and log:
            pl_module.log_dict(metrics, on_step=False, on_epoch=True, sync_dist=False)
        elif metrics and trainer.is_global_zero:  # on_train_end: self.log is not allowed there
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)
        self.reuse.detach()
        self._publish()
        if trainer.is_global_zero:
            self._write()
        self.clock.resume()  # the check's own time is not training

    def _plan(
        self, trainer: L.Trainer, probes: dict[str, Probe], train_px: int, epoch: int, full: bool
    ) -> dict[str, Any]:
        """Per split, the cases to test under each test (None: all); rank 0 decides
        (:func:`~robusttrain.metamorphic.budget.plan_check`), every rank follows."""
        if not plans_subset(self.budget, self.final, full) or not probes:
            return {}
        px = gather_objects(trainer, int(train_px))  # every rank's pixels: ranks train on their own shards
        plan = None
        if trainer.is_global_zero:
            plan = plan_check(
                self.budget,
                probes,
                px,
                self.suite,
                self.hooks,
                epoch=epoch,
                last_check_epoch=self._last_check_epoch,
                max_epochs=trainer.max_epochs,
                final=self.final,
                full=full,
                cases=self.ledger.cases,
            )
        shared = broadcast_object(trainer, plan)
        assert shared is not None  # rank 0 always plans; the other ranks receive its plan
        return shared

    # -- internals ---------------------------------------------------------------------
    def _dataset(self, trainer: Any, split: str, quiet: bool = False) -> Any:
        if split == "train":
            return self._train_probe().dataset
        if self.val_dataset is not None:
            return self.val_dataset
        dm = getattr(trainer, "datamodule", None)
        ds = getattr(dm, f"{split}_dataset", None)
        if ds is None and quiet:  # at setup the trainer's loaders do not exist yet
            return None
        if ds is None:
            loaders = trainer.val_dataloaders if split == "val" else trainer.train_dataloader
            if isinstance(loaders, (list, tuple)):
                loaders = loaders[0] if loaders else None
            ds = getattr(loaders, "dataset", None)
        return ds

    def _probe(self, trainer: Any, split: str, ds: Any) -> tuple[list[int], list[str]]:
        dm = getattr(trainer, "datamodule", None)
        always = list(getattr(dm, "planted_hard_cases", []) or []) if split == "val" else []
        size = self.max_cases if split == "val" else self._train_probe().size
        return probe_cases(ds, split, size, self.seed, always)

    def _labelled_heldout(self) -> tuple[str, ...]:
        """The held-out families minus those this run's training has used (a resume that added ``heldout=``
        after epochs that drew them): those are labelled trained, said once in one line."""
        trained = getattr(self._ctx, "trained_families", None) or {}
        held, used = label_heldout(self.heldout, trained)
        if used and set(used) != getattr(self, "_said_trained", set()):
            self._said_trained = set(used)
            rank_zero_warn(f"MetamorphicCallback: {trained_note(used)}")
        return held

    def _warn_if_degenerate(self, trainer: Any, entry: CheckEntry) -> None:
        """Say once when the clean Dice is ~0: a case with no Dice cannot lose any, so EFR 0 %% and
        "no corner cases" then mean nothing (issue 23)."""
        if entry.split != "val" or getattr(self, "_warned_degenerate", False):
            return
        clean = entry.clean_dice()
        if clean is not None and clean < DEGENERATE_DICE and trainer.is_global_zero:
            self._warned_degenerate = True
            rank_zero_warn(
                f"MR check, epoch {entry.label.epoch}: the validation probe's clean Dice is {clean:.3f}: the "
                "model segments (almost) nothing yet, so its EFR and corner cases mean nothing (a case with no "
                "Dice cannot lose any); they become informative once the clean Dice rises"
            )

    def _train_probe(self) -> TrainProbe:
        probe = self.context.train_probe
        if probe is None:  # only reached for split "train", which is checked only when a probe was asked for
            raise RobustnessConfigError(
                "MetamorphicCallback: a training probe was checked but none was requested"
            )
        return probe

    def _names(self, trainer: Any, res: ProbeResult) -> list[str]:
        if self.class_names is not None:
            return self.class_names
        names = getattr(getattr(trainer, "datamodule", None), "class_names", None)
        kf = res.src.shape[1]
        if names and len(names) == kf:
            return list(names)
        return ["fg"] if kf == 1 else [f"class{i + 1}" for i in range(kf)]

    def _record(
        self,
        trainer: Any,
        pl_module: Any,
        res: ProbeResult,
        probe: Probe,
        epoch: int,
        split: str,
        predict: Callable,
        path: str,
        final: bool = False,
        basis: str = "subset",
        sinks: bool = True,
    ) -> dict[str, float]:
        """One split's check into the ledger; its failures to the context's sinks, its table to the console;
        the metrics to log."""
        hist, scored = aggregate(res, self._names(trainer, res), epoch, self.suite)
        entry = self.ledger.update(
            hist,
            scored,
            epoch,
            split,
            suite_cases=len(dict.fromkeys(probe.case_ids)),
            final=final,
            basis=basis,
            heldout=self._labelled_heldout(),
        )
        self._warn_if_degenerate(trainer, entry)
        if trainer.is_global_zero and sinks:
            # a held-out family's violations stay in the tables but never reach the sinks: the failure
            # bank would replay them into training, and training must never see a test-only family
            self.last_failures = build_failures(
                res,
                entry.without(self.heldout),
                self.suite,
                probe.dataset,
                self.hooks,
                self.reuse.predict_fn(pl_module, predict),
                path,
                self.violation_threshold,
                self.failure_images,
                epoch,
                device=next(pl_module.parameters()).device,
                id_prefix=id_prefix(split),
            )
            for rec, imgs in self.last_failures:
                self.context.emit(rec, imgs)
        if trainer.is_global_zero and self.verbose:
            rank_zero_info(entry.console())
        return efr_metrics(entry.table, "mr/efr" if split == "val" else f"mr/{split}_efr")

    def _publish(self) -> None:
        if self._ctx is not None:  # the other callbacks read the tables here, never from this object
            self._ctx.history, self._ctx.efr, self._ctx.cases = self.ledger.tables()

    def _write(self) -> None:
        d, tables = self.context.resolved_run_dir, self.ledger.tables()
        history_file.write(d, tables.history)
        efr_file.write(d, tables.efr)
        cases_file.write(d, tables.cases)

    # the run's tables so far: the ledger's (read-only here)
    @property
    def history(self) -> pd.DataFrame:
        return self.ledger.history

    @property
    def efr(self) -> pd.DataFrame:
        return self.ledger.efr

    @property
    def cases(self) -> pd.DataFrame:
        return self.ledger.cases

    # -- checkpoint state --------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 2,
            **self.ledger.state_dict(),  # history, efr, cases
            "suite": self.suite.state_dict(),
            "budget": self.budget.state_dict(),
            "train_pixels": int(self.work.pixels),
            "last_check": [self._last_check_epoch, self._last_val_full],
        }

    def check_resume(self, state: dict[str, Any]) -> None:
        """Refuse (``InputError``) a checkpoint state this callback could not continue: another suite.

        The CLI calls it before it writes anything into the run directory; ``load_state_dict``
        refuses the same state when Lightning restores it."""
        self.suite.check_state(state.get("suite", {}))

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a changed suite is refused before anything is replaced (its tables would not compare)
        self.suite.load_state_dict(state.get("suite", {}))
        self.ledger.load_state_dict(state)
        self.budget.load_state_dict(state.get("budget", {}))
        self.work.pixels = int(state.get("train_pixels", 0))  # a mid-epoch checkpoint: work since the check
        self._last_check_epoch, self._last_val_full = state.get("last_check", [-1, True])
