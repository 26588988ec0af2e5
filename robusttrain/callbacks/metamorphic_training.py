"""MetamorphicTraining: train on what the metamorphic check finds — perturbed follow-ups of each batch,
steered by the check's per-family violation rates, through one of three objectives.

The objective (``objective=``; the maths and the user's two lines are :mod:`robusttrain.training.objective`):

* ``"replace"`` (no code change; the recipes' setting): a fraction ``q`` of each batch's images is
  replaced *in place* by its follow-up before the training step. With ``k=1`` that is random
  augmentation with the suite's families, which Evidence v3 (docs/results.md) found cut the EFR by
  42-44 % at no clean-Dice cost.
* ``"consistency"`` (AugMix / AugMax / AdvChain): the supervised loss sees only the batch — clean, or
  with ``replace_q`` of it replaced in place by random draws (exactly what ``"replace"`` with ``k=1,
  q=replace_q`` trains on, same seed, same images) — and ``q`` of the batch, drawn among the rows left
  clean, get (hard) follow-ups that act **only** through ``lambda * D(p(x), p(x*))``, in one forward
  over batch + follow-ups::

      from robusttrain.callbacks import metamorphic_forward
      logits, mr = metamorphic_forward(self, images)      # instead of self(images)
      loss = self.loss_fn(logits, masks) + mr

* ``"paired"`` (Evidence v3's objective, by name only): the follow-ups wait beside the clean batch
  and ``metamorphic_loss(self, batch, logits, loss_fn)`` adds ``L_seg(x*) + lambda * D``; every paired
  run of one seed stalled in v3, at any ``lambda``.

The recipes' :class:`~robusttrain.models.SegmentationModule` has both lines built in. ``lambda`` ramps
from 0 over the first ``ramp`` fraction of the training steps.

**What is drawn** (per selected image, ``k`` candidates, steered by the latest check's per-family
violation rates, seeded by ``(seed, global step, global rank)``) and how it is selected:
:mod:`robusttrain.training.settings`. Per-epoch counts go to ``metamorphic_training.csv`` and a sample
of the kept follow-ups' recipes to ``metamorphic_training_samples.jsonl``
(:mod:`robusttrain.training.accounting`, :mod:`robusttrain.rundir.metamorphic_training`); any recorded
follow-up is re-created exactly by :func:`robusttrain.training.recreate_followup`.

Example::

    >>> import lightning.pytorch as L
    >>> mt = MetamorphicTraining(perturbations=["blur", "contrast"], objective="consistency", consistency=1.0,
    ...                          replace_q=0.5, k=4, selection="augmax")
    >>> trainer = L.Trainer(max_epochs=1, callbacks=[mt], logger=False)   # then trainer.fit(...)
    >>> MetamorphicTraining(severity_caps=7)
    Traceback (most recent call last):
    ...
    ValueError: severity_caps must be an int 1..5 or a mapping family -> 1..5 (default: the MR suite's highest severity), got 7
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Callable
from typing import Any, ClassVar

import lightning.pytorch as L
import pandas as pd
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from robusttrain.metamorphic.batch import BatchHooks, normalise_mask
from robusttrain.metamorphic.check import eval_state as scoring_state  # eval, no grad, modes + RNGs restored
from robusttrain.metamorphic.efr import VIOLATION_THRESHOLD, family_rates
from robusttrain.metamorphic.heldout import trained_by_records
from robusttrain.rundir import metamorphic_training as records_file
from robusttrain.training import WorstOfK, probabilities, ramp, scaled_for_scoring, soft_dice_loss
from robusttrain.training.accounting import TrainingLedger, kept_shares
from robusttrain.training.objective import StepFollowups
from robusttrain.training.objective import metamorphic_forward as metamorphic_forward
from robusttrain.training.objective import metamorphic_loss as metamorphic_loss
from robusttrain.training.settings import DEFAULT_CAP, MTSettings, check_training_images, setting_names
from robusttrain.training.steering import SteeredDraws, Steering
from robusttrain.training.worst_of_k import Followups

from ._dist import gather_objects
from .context import RobustnessConfigError, RobustnessContext
from .lifecycle import ContextMember


class MetamorphicTraining(ContextMember):
    """Metamorphic training for any Lightning model: follow-ups drawn (and selected) online, trained on
    through one of three objectives (module doc).

    Args:
        perturbations, k, q, epsilon, ...: the settings, keyword arguments checked when built and
            documented at :class:`~robusttrain.training.settings.MTSettings`; the callback holds them as
            ``settings`` (``mt.settings.k``).
        settings: the same as one :class:`~robusttrain.training.settings.MTSettings` (instead of its values).
        hooks: how batches are read (default: the MetamorphicCallback's, else dict / tuple batches).
        dirpath: run directory (default: the context's).
        context: a shared :class:`RobustnessContext` (default: the trainer's).
    """

    # what the recipe keys callbacks.metamorphic_training.* are (robusttrain.cli.settings_keys)
    settings_type: ClassVar[type[MTSettings]] = MTSettings

    def __init__(
        self,
        *,
        settings: MTSettings | None = None,
        hooks: BatchHooks | None = None,
        dirpath: str | os.PathLike | None = None,
        context: RobustnessContext | None = None,
        **values: Any,
    ):
        self.settings = _settings(settings, values)  # every value checked, one line naming a bad one
        if hooks is not None and not isinstance(hooks, BatchHooks):
            raise ValueError(f"hooks must be a BatchHooks, got {type(hooks).__name__}")
        self.hooks = hooks
        self.dirpath, self._context_arg = dirpath, context
        self.wok: WorstOfK | None = None
        self.replacer: WorstOfK | None = None
        self.steerer: SteeredDraws | None = None
        # what training drew and kept: per-family counts, sampled recipes, the run's stats (one object)
        self.ledger = TrainingLedger(records_file.STATS_COLUMNS)
        self._ctx: RobustnessContext | None = context
        # this training step's follow-ups, carried by the context to the model's training_step
        s = self.settings
        self._step = StepFollowups(s.objective, s.divergence, s.detach_source)
        self._steps_seen = 0
        self._rates_cache: tuple[Any, dict[str, float] | None] = (None, None)  # (efr table, its rates)

    # -- Lightning hooks ---------------------------------------------------------------
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":  # metamorphic_forward / metamorphic_loss read each step's follow-ups there
            self.context.followups = self._step

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self._steps_seen = 0

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ledger.counts.reset()
        # what the weights have trained on so far (a resumed run's earlier epochs included): the MR check
        # never labels such a family held out
        self.context.trained_families = trained_by_records(self.stats)

    @override
    @torch.no_grad()
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        hooks = self._hooks()
        self._step.start(hooks.to_probabilities)
        try:
            images = hooks.get_images(batch)
            masks = normalise_mask(hooks.get_masks(batch), images)
        except Exception as err:  # noqa: BLE001 -- one line saying which hook to set
            raise RobustnessConfigError(
                f"MetamorphicTraining cannot read the training batch: {err} "
                "(pass hooks=BatchHooks(get_images=..., get_masks=...))"
            ) from None
        if self.wok is None:
            self.wok, self.replacer = self._build(images)
        if self.wok.n_selected(images.shape[0]) == 0 and self.replacer is None:
            return
        check_training_images(
            images, int(trainer.global_step)
        )  # every batch: a later one can be out of range too
        step, rank = int(trainer.global_step), int(trainer.global_rank)
        rates = self._rates()
        eligible = None
        if self.replacer is not None:  # consistency objective: the random in-place part the loss sees
            rep = self.replacer(images.detach(), masks, None, step=step, rank=rank, rates=rates)
            rep = self._steered(trainer, rep, images, masks, self.replacer)
            self._write_into(batch, images, rep)
            keep = torch.ones(images.shape[0], dtype=torch.bool)
            keep[rep.index.cpu()] = False
            eligible = keep.nonzero().view(-1)
        warming = self.settings.warmup > 0 and step < self.settings.warmup * _total_steps(trainer)
        fol = self.wok(
            images.detach(),
            masks,
            self._scorer(trainer, pl_module),
            step=step,
            rank=rank,
            rates=rates,
            eligible=eligible,
            select=not warming,
        )
        if self.replacer is None:
            fol = self._steered(trainer, fol, images, masks, self.wok)
        self.ledger.add(self.wok, fol, rates)
        self._record(trainer, batch, fol)
        if self.settings.pair:  # they wait beside the batch for the model's training_step
            pending = self._step
            pending.followups, pending.target = fol, hooks.get_masks(batch)
            pending.weight = self._lambda(trainer)
            return
        self._write_into(batch, images, fol)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._steering() is not None and not self.settings.steerable:
            raise RobustnessConfigError(
                "FailureMiningCallback(mode='steer') steers MetamorphicTraining's random draws, but "
                f"{self.settings.describe_draw()} with objective={self.settings.objective!r} has none to steer; use "
                "objective='replace', k=1 without chains (random augmentation) or objective='consistency' with "
                "replace_q > 0"
            )

    def _steering(self) -> Steering | None:
        return getattr(self._ctx, "steering", None)

    def _steered(
        self, trainer: L.Trainer, fol: Followups, images: torch.Tensor, masks: torch.Tensor, sampler: WorstOfK
    ) -> Followups:
        """``fol`` with the share the mining callback asks for steered to its failure conditions (none
        without FailureMiningCallback(mode="steer"), or while its bank is empty: ``fol`` itself)."""
        st = self._steering()
        if st is None:
            return fol
        if self.steerer is None:
            self.steerer = SteeredDraws(st.steer, st.jitter, self.settings.seed)
        step, rank = int(trainer.global_step), int(trainer.global_rank)
        fol = self.steerer(fol, images.detach(), masks, st.bank, sampler, step=step, rank=rank)
        st.count(int(trainer.current_epoch), fol)
        return fol

    def _write_into(self, batch: Any, images: torch.Tensor, fol: Followups) -> None:
        images[fol.index] = fol.images.to(images.dtype)
        if self._steps_seen == 0 and self._hooks().get_images(batch).data_ptr() != images.data_ptr():
            raise RobustnessConfigError(
                "MetamorphicTraining could not write follow-ups into the batch: get_images returns a copy; "
                "use objective='consistency' with metamorphic_forward(self, images) in training_step instead"
            )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = self._step
        if self.settings.pair and step.followups is not None and not step.used and self._steps_seen == 0:
            line = (
                "logits, mr = metamorphic_forward(self, images)` in place of `self(images)` and add `mr` to the loss"
                if self.settings.objective == "consistency"
                else "loss = loss + metamorphic_loss(self, batch, logits, loss_fn)`"
            )
            raise RobustnessConfigError(
                f"MetamorphicTraining(objective={self.settings.objective!r}) prepared follow-ups but training_step never "
                f"called {'metamorphic_forward' if self.settings.objective == 'consistency' else 'metamorphic_loss'}; "
                f"add `{line} to training_step, or use objective='replace' (follow-ups then replace images in place)"
            )
        self._steps_seen += 1
        step.followups = step.target = None

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = int(trainer.current_epoch)
        part = self.ledger.take(epoch, self._worst_of_k().labels if self.wok is not None else None)
        record = self.ledger.combine(gather_objects(trainer, part))  # the same on every rank
        shares = kept_shares(record.rows)
        if shares:  # which artifacts the model trained on this epoch: one curve per family (W&B, CSV)
            pl_module.log_dict(shares, on_step=False, on_epoch=True, sync_dist=False)
        if not trainer.is_global_zero:
            return
        self.ledger.update(epoch, record)
        records_file.write_stats(self.context.resolved_run_dir, self.ledger.stats)
        self.context.trained_families = trained_by_records(self.ledger.stats)
        records_file.write_samples(self.context.resolved_run_dir, self.ledger.samples)

    def _lambda(self, trainer: L.Trainer) -> float:
        """The consistency weight at this step (``consistency``, ramped over the first ``ramp`` of the steps)."""
        s = self.settings
        return s.consistency * ramp(int(trainer.global_step), _total_steps(trainer), s.ramp)

    # -- internals ---------------------------------------------------------------------
    def _hooks(self) -> BatchHooks:
        if self.hooks is not None:
            return self.hooks
        shared = getattr(self._ctx, "hooks", None)
        return shared if isinstance(shared, BatchHooks) else BatchHooks()

    def _build(self, images: torch.Tensor) -> tuple[WorstOfK, WorstOfK | None]:
        """The follow-up sampler (and, for ``replace_q``, the in-place random one), from the first batch."""
        suite = getattr(self._ctx, "suite", None)
        heldout = getattr(self._ctx, "heldout_families", None) or ()
        families, dropped = self.settings.families_for(
            getattr(suite, "names", None), int(images.shape[1]), list(heldout)
        )
        caps = self.settings.caps_for(families, max(suite.severities) if suite is not None else DEFAULT_CAP)
        wok, replacer = self.settings.samplers(
            families, caps, getattr(suite, "slice_axis", -1) if suite is not None else -1
        )
        rank_zero_info(self.settings.describe(families, dropped, replacer is not None))
        return wok, replacer

    def _rates(self) -> dict[str, float] | None:
        """Per-family violation rates of the latest check (train probe if there is one, else val).

        Read every step but recomputed only when the MR callback has published a new table (each check
        replaces the frame), so the hot path does not filter a DataFrame per training step."""
        efr = getattr(self._ctx, "efr", None)
        if efr is None or not len(efr):
            return None
        if self._rates_cache[0] is efr:
            return self._rates_cache[1]
        t = getattr(self._ctx, "violation_threshold", None) or VIOLATION_THRESHOLD
        rates = family_rates(efr, "auto", "dice", t) or None
        self._rates_cache = (efr, rates)
        return rates

    def _scorer(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        spec = self._hooks().to_probabilities

        def score(candidates: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
            if masks is None:  # normalise_mask always gives masks; scoring needs them
                raise RobustnessConfigError("MetamorphicTraining scores candidates against masks; got none")
            x, m = scaled_for_scoring(candidates, masks, self.settings.score_scale)
            assert m is not None
            with scoring_state(pl_module), _forward_context(trainer):
                out = pl_module(x)
            return soft_dice_loss(probabilities(out, spec), m)

        return score

    def _worst_of_k(self) -> WorstOfK:
        if self.wok is None:  # built from the first training batch (its channel count)
            raise RobustnessConfigError("MetamorphicTraining: no training batch has been seen yet")
        return self.wok

    def _record(self, trainer: L.Trainer, batch: Any, fol: Followups) -> None:
        step = int(trainer.global_step)
        if self.settings.record_per_step == 0 or step % self.settings.record_every:
            return
        ids = None
        try:
            ids = self._hooks().get_case_ids(batch)
        except Exception:  # noqa: BLE001 -- case ids are optional
            ids = None
        self.ledger.sample(
            fol,
            ids,
            step,
            int(trainer.current_epoch),
            int(trainer.global_rank),
            self.settings.record_per_step,
        )

    # the run's records so far: the ledger's (read-only here)
    @property
    def stats(self) -> pd.DataFrame:
        return self.ledger.stats

    @property
    def samples(self) -> list[dict[str, Any]]:
        return self.ledger.samples

    # -- checkpoint state --------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, **self.ledger.state_dict()}  # stats, samples

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state_dict)


def _settings(settings: MTSettings | None, values: dict[str, Any]) -> MTSettings:
    """The callback's settings: ``settings`` itself, or built (and so checked) from ``values``."""
    unknown = [name for name in values if name not in setting_names()]
    if unknown:
        raise TypeError(
            f"MetamorphicTraining() got an unexpected keyword argument {unknown[0]!r}; its settings are "
            f"{', '.join(setting_names())} (and hooks, dirpath, context)"
        )
    if settings is None:
        return MTSettings(**values)
    if not isinstance(settings, MTSettings) or values:
        raise TypeError(
            "MetamorphicTraining takes settings=MTSettings(...) or the settings' values, not both"
        )
    return settings


def _signature() -> inspect.Signature:
    """``MetamorphicTraining(perturbations=..., k=..., ...)`` as help() and IDEs show it: the settings'
    fields (written once, in :class:`MTSettings`), then the callback's own arguments."""
    own = inspect.signature(MetamorphicTraining.__init__).parameters
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = [
        inspect.Parameter(p.name, keyword, default=p.default, annotation=p.annotation)
        for p in inspect.signature(MTSettings).parameters.values()
    ]
    return inspect.Signature(fields + [p for name, p in own.items() if name not in ("self", "values")])


MetamorphicTraining.__signature__ = _signature()  # type: ignore[attr-defined]


def _total_steps(trainer: Any) -> int:
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else 1000


def _forward_context(trainer: Any) -> Any:
    plugin = getattr(trainer, "precision_plugin", None)
    return plugin.forward_context() if plugin is not None else contextlib.nullcontext()
