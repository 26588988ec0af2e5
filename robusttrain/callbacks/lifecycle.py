"""ContextMember: the lifecycle every robustness callback shares, written once.

A robustness callback is a member of the trainer's shared :class:`~.context.RobustnessContext` for one
fit, and the base owns the three steps that every callback used to repeat:

* ``setup("fit")``: join the context (the ``context=`` given, else the trainer's), naming what the
  callback ``PROVIDES`` and ``REQUIRES`` and its ``dirpath``;
* ``on_fit_start`` (every ``setup`` done): the context resolves the run directory once
  (:meth:`~.context.RobustnessContext.finalize`), kept as :attr:`~ContextMember.fit_dir`;
* ``teardown("fit")``, and ``on_exception`` of a fit that failed (Lightning runs no ``teardown`` then):
  let go of the run-directory lock when this member is the one that holds it last
  (:meth:`~.context.RobustnessContext.release_lock`).

A callback adds its own work by overriding the hook and calling ``super()`` first (``teardown``: last,
after what it still writes). ``context`` and ``fit_dir`` raise one clear line when read too early.

>>> from types import SimpleNamespace
>>> class Probe(ContextMember):
...     PROVIDES = ("mr",)
>>> trainer = SimpleNamespace()
>>> Probe().context
Traceback (most recent call last):
...
robusttrain.errors.RobustnessConfigError: Probe.context is used before setup(): ...
>>> Probe().setup(trainer, None, "fit")
>>> trainer.robusttrain_context.members["Probe"]["provides"]
('mr',)
>>> Probe().fit_dir
Traceback (most recent call last):
...
robusttrain.errors.RobustnessConfigError: Probe.fit_dir is used before on_fit_start(): ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from lightning.pytorch import Callback
from typing_extensions import override

from robusttrain.errors import RobustnessConfigError

from .context import RobustnessContext, context_for


class ContextMember(Callback):
    """Base of the robustness callbacks: the shared context's join / finalize / release (module doc)."""

    PROVIDES: ClassVar[tuple[str, ...]] = ()  # what the others may require ("mr", "corners")
    REQUIRES: ClassVar[tuple[str, ...]] = ()
    dirpath: Any = None  # the run directory asked for (None: the context's)
    _ctx: RobustnessContext | None = None
    _context_arg: RobustnessContext | None = None  # the constructor's context= (None: the trainer's)
    _dir: Path | None = None  # the run directory: the dirpath= given, then on_fit_start's context.finalize()

    @property
    def joins(self) -> bool:
        """Whether this callback takes part in the fit (a switched-off one neither joins nor finalizes)."""
        return True

    def _too_early(self, attr: str, hook: str, run: str, why: str) -> RobustnessConfigError:
        return RobustnessConfigError(
            f"{type(self).__name__}.{attr} is used before {hook}(): add the callback to a Trainer's "
            f"callbacks and run {run} ({hook} {why})"
        )

    @property
    def context(self) -> RobustnessContext:
        if self._ctx is None:
            raise self._too_early("context", "setup", "fit/validate", "joins the shared RobustnessContext")
        return self._ctx

    @property
    def fit_dir(self) -> Path:
        if self._dir is None:
            raise self._too_early("fit_dir", "on_fit_start", "fit", "resolves the run directory")
        return self._dir

    def join_context(self, trainer: Any) -> RobustnessContext:
        """The trainer's shared context (the ``context=`` given, else the trainer's), now this callback's."""
        self._ctx = context_for(trainer, self._context_arg)
        return self._ctx

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and self.joins:
            ctx = self.join_context(trainer)
            ctx.join(type(self).__name__, self.dirpath, provides=self.PROVIDES, requires=self.REQUIRES)

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_fit_start(trainer, pl_module)
        if self.joins:
            self._dir = self.context.finalize(trainer)

    @override
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if stage == "fit" and self._ctx is not None:
            self._ctx.release_lock(trainer, type(self).__name__)

    @override
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """A fit that failed lets go of the run directory (Lightning calls no ``teardown`` then): the
        same process can fit again there, with this trainer or another."""
        super().on_exception(trainer, pl_module, exception)
        if self._ctx is not None:
            self._ctx.release_lock(trainer, type(self).__name__)
