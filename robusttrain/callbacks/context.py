"""RobustnessContext: the one object the robustness callbacks share (explicit composition).

Each callback takes ``context=``. Left out, the first robustness callback whose ``setup`` runs
creates one and stores it on the trainer as ``trainer.robusttrain_context`` (the only attribute
robusttrain sets on a trainer); the others join it. No callback looks for its siblings or touches
their attributes: what one produces and another consumes goes through this object.

The lifecycle below is written once, in :class:`robusttrain.callbacks.lifecycle.ContextMember`, the
callbacks' base:

* ``setup``: every callback :meth:`~RobustnessContext.join` s, naming what it provides
  (``"mr"``: MR results, hooks and failures; ``"corners"``: corner cases and the least-loss
  epoch) and what it requires, and its ``dirpath``.
* ``on_fit_start`` (all ``setup`` s done, before any data is loaded): :meth:`finalize` resolves the
  run directory once (the callbacks' ``dirpath`` s must agree; default ``trainer.log_dir`` or
  ``default_root_dir``; under a first logger that keeps no per-run folder, e.g. W&B, whose
  ``save_dir`` would serve every run, ``<save_dir>/robusttrain/<run id>``: the logger's version,
  else a timestamp), says where it writes (one line, rank 0), broadcasts rank 0's choice, and raises
  :class:`RobustnessConfigError` naming what to add when a requirement has no provider.
  The order of the callbacks in ``trainer.callbacks`` does not matter.

>>> ctx = RobustnessContext()
>>> ctx.join("FailureMiningCallback", requires=("mr",))
>>> ctx.missing()
'FailureMiningCallback needs MetamorphicCallback results: add MetamorphicCallback(...) to the trainer callbacks'
>>> ctx.join("MetamorphicCallback", provides=("mr",))
>>> ctx.missing() is None
True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch.utilities import rank_zero_info

from robusttrain.errors import RobustnessConfigError

from ._dist import broadcast_object

ATTR = "robusttrain_context"
PROVIDERS = {"mr": "MetamorphicCallback", "corners": "BalancedCheckpoint"}
_WHAT = {"mr": "MetamorphicCallback results", "corners": "BalancedCheckpoint corner cases"}


@dataclass
class TrainProbe:
    """A request (by FailureMiningCallback) to check ``size`` training cases every N epochs.

    ``dataset`` is index-aligned with the training set (so a failure's index + params re-create
    the failing sample) and read through the MR callback's hooks.
    """

    dataset: Any
    size: int
    every_n_epochs: int = 1


@dataclass
class RobustnessContext:
    """What the robustness callbacks share (see module doc). Fields are filled by their owners:

    * ``run_dir``: set by :meth:`finalize`.
    * MetamorphicCallback: ``hooks``, ``suite``, ``violation_threshold``, ``every_n_epochs``,
      ``class_names``, ``heldout_families`` (the suite's test-only families: robustness training
      must never draw them) and, after each check, ``history`` / ``efr`` / ``cases`` (its tables).
    * BalancedCheckpoint: ``corners`` (provisional corner cases, computed once per validation)
      and ``least_loss_epoch``.
    * FailureMiningCallback: ``train_probe`` and, in ``mode="steer"``, ``steering`` (a
      :class:`~robusttrain.training.steering.Steering`: the failure conditions MetamorphicTraining's
      random draws are steered by).
    * MetamorphicTraining: ``trained_families`` (what it has trained on, from its records) and
      ``followups``, this training step's follow-ups (a
      :class:`~robusttrain.training.objective.StepFollowups`) for the model's ``training_step``.
    """

    run_dir: Path | None = None
    hooks: Any = None
    suite: Any = None
    violation_threshold: float | None = None
    every_n_epochs: int | None = None
    class_names: list[str] | None = None
    heldout_families: frozenset[str] | None = None  # None: no MetamorphicCallback (yet)
    # MetamorphicTraining: {family: why} it trained on (its records, resumed ones included); a held-out
    # family found here is labelled trained, never held out (robusttrain.metamorphic.heldout.label_heldout)
    trained_families: dict[str, str] = field(default_factory=dict)
    history: pd.DataFrame | None = None
    efr: pd.DataFrame | None = None
    cases: pd.DataFrame | None = None
    corners: Any = None
    least_loss_epoch: int | None = None
    train_probe: TrainProbe | None = None
    steering: Any = None  # FailureMiningCallback(mode="steer"): what MetamorphicTraining steers its draws by
    followups: Any = None  # MetamorphicTraining: this step's follow-ups (training.objective.StepFollowups)
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    sinks: list[Callable[..., None]] = field(default_factory=list)
    auto: bool = field(default=False, repr=False)  # made by context_for, not given by the user

    # -- membership -------------------------------------------------------------------
    def join(
        self,
        name: str,
        dirpath: str | os.PathLike | None = None,
        provides: tuple[str, ...] = (),
        requires: tuple[str, ...] = (),
    ) -> None:
        """Register one callback (its ``setup``); a second ``fit`` re-joins and re-finalizes."""
        self.members[name] = {
            "dirpath": None if dirpath is None else Path(dirpath),
            "provides": tuple(provides),
            "requires": tuple(requires),
        }
        self.run_dir = None

    def provides(self, capability: str) -> bool:
        return any(capability in m["provides"] for m in self.members.values())

    def missing(self) -> str | None:
        """One line naming the first requirement without a provider, or None."""
        for name, m in self.members.items():
            for cap in m["requires"]:
                if not self.provides(cap):
                    return (
                        f"{name} needs {_WHAT.get(cap, cap)}: add {PROVIDERS.get(cap, cap)}(...) "
                        "to the trainer callbacks"
                    )
        return None

    def finalize(self, trainer: Any) -> Path:
        """Resolve and broadcast the run directory, check requirements (idempotent; all ranks)."""
        if self.run_dir is not None:
            return self.run_dir
        problem = self.missing()
        if problem:
            raise RobustnessConfigError(problem)
        dirs = {n: m["dirpath"] for n, m in self.members.items() if m["dirpath"] is not None}
        distinct = {os.path.abspath(d) for d in dirs.values()}
        if len(distinct) > 1:
            raise RobustnessConfigError(
                "the robustness callbacks have different dirpath values ("
                + ", ".join(f"{n}: {d}" for n, d in sorted(dirs.items()))
                + "); give them the same dirpath (one run directory)"
            )
        d = next(iter(distinct), None) or default_run_dir(trainer)
        run_dir = Path(broadcast_object(trainer, str(d)))
        if getattr(trainer, "is_global_zero", True):
            rank_zero_info(f"robusttrain: writing the robustness files of this run to {run_dir}")
            # the CLI's run-directory lock, also in the API: shared with the CLI command that runs this
            # trainer, refused to another process or another trainer of this one
            from robusttrain.rundir.lock import hold

            hold(run_dir, "fit", holder=trainer)
            if getattr(trainer, "ckpt_path", None) is None:
                # a fresh fit: an earlier fit's results there go aside, said in one warning (the CLI
                # has refused or emptied such a directory before this point)
                from robusttrain.rundir.layout import set_aside_results

                set_aside_results(run_dir)
        self.run_dir = run_dir
        return self.run_dir

    @property
    def resolved_run_dir(self) -> Path:
        """``run_dir`` where :meth:`finalize` must have run (hooks after ``on_fit_start``): one clear
        :class:`RobustnessConfigError` instead of ``None`` deep in a hook when it has not."""
        if self.run_dir is None:
            raise RobustnessConfigError(
                "the run directory is used before on_fit_start() resolved it "
                "(RobustnessContext.finalize); run the callbacks through trainer.fit"
            )
        return self.run_dir

    def release_lock(self, trainer: Any, member: str) -> None:
        """Let go of this trainer's run-directory lock when the fit is over (``teardown``, or
        ``on_exception`` of a fit that failed: Lightning runs no ``teardown`` then; rank 0).

        RobustnessReporter (whose teardown still writes the final plots) or else BalancedCheckpoint does it
        when they are members; any other member only when neither is."""
        if self.run_dir is None or not getattr(trainer, "is_global_zero", True):
            return
        last = next((m for m in ("RobustnessReporter", "BalancedCheckpoint") if m in self.members), member)
        if last == member:
            from robusttrain.rundir.lock import release

            release(self.run_dir, holder=trainer)

    def absorb(self, other: RobustnessContext) -> None:
        """Take over what ``other``'s members registered (an auto-created context being replaced)."""
        for f in (
            "hooks",
            "suite",
            "violation_threshold",
            "every_n_epochs",
            "class_names",
            "heldout_families",
            "train_probe",
            "steering",
            "followups",
        ):
            if getattr(self, f) is None:
                setattr(self, f, getattr(other, f))
        self.trained_families = self.trained_families or other.trained_families
        self.members.update(other.members)
        for s in other.sinks:
            self.subscribe(s)

    # -- failures -----------------------------------------------------------------------
    def subscribe(self, sink: Callable[..., None]) -> None:
        """``sink(record, images)`` is called on global rank 0 for every MR violation."""
        if sink not in self.sinks:
            self.sinks.append(sink)

    def emit(self, record: Any, images: dict | None) -> None:
        for sink in self.sinks:
            sink(record, images)


def default_run_dir(trainer: Any) -> str:
    """``trainer.log_dir`` when it is a run's own folder; a first logger without one (``log_dir``
    None: W&B and most others give their shared ``save_dir``) gets ``<save_dir>/robusttrain/<run id>``,
    so two fits never share (and never replay) each other's files."""
    d = getattr(trainer, "log_dir", None) or trainer.default_root_dir
    loggers = list(getattr(trainer, "loggers", None) or [])
    if not loggers or getattr(loggers[0], "log_dir", None) is not None:
        return str(d)
    try:
        version = loggers[0].version
    except Exception:  # a logger that cannot name its run offline: the timestamp below
        version = None
    run_id = str(version) if version not in (None, "") else datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id).strip(".") or "run"
    return str(Path(d) / "robusttrain" / safe)


def context_for(trainer: Any, explicit: RobustnessContext | None = None) -> RobustnessContext:
    """The trainer's context: ``explicit`` (stored on the trainer), the stored one, or a new one."""
    current = getattr(trainer, ATTR, None)
    if explicit is not None and current is not explicit:
        if current is not None and not current.auto:
            raise RobustnessConfigError(
                "two different RobustnessContext objects in one trainer; pass "
                "the same context= to every robustness callback (or none)"
            )
        if current is not None:  # callbacks without context= joined first: theirs becomes this one
            explicit.absorb(current)
        current = explicit
    if current is None:
        current = RobustnessContext()
        current.auto = True
    setattr(trainer, ATTR, current)
    return current
