"""Lightning callbacks: the only part of robusttrain that knows about hooks, ranks and checkpoints.

``MetamorphicCallback`` runs the MR suite after validation, ``BalancedCheckpoint`` picks the
checkpoint that does not sacrifice corner cases, ``BalancedAverage`` averages the inlier epochs late
in training (``EMACheckpoint``: Lightning's EMA plus ``ema.ckpt``), ``MetamorphicTraining`` trains on
the worst of k perturbations (with the MR-consistency loss, :func:`metamorphic_loss`),
``FailureMiningCallback`` replays MR failures as training data and ``RobustnessReporter`` draws the
curves (PNG, W&B). They share one
:class:`RobustnessContext` (explicit composition); their order in ``trainer.callbacks`` does not
matter, and each works alone except FailureMiningCallback, which needs a MetamorphicCallback, and
BalancedAverage, which needs a BalancedCheckpoint (its ECOD flags).
:func:`robustness` returns the four configured (five with ``average=True``).

>>> cbs = robustness(run_dir="runs/x", perturbations=["blur"], severities=(2,), replay_ratio=0.2)
>>> [type(c).__name__ for c in cbs]
['MetamorphicCallback', 'BalancedCheckpoint', 'FailureMiningCallback', 'RobustnessReporter']
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from robusttrain.metamorphic.batch import BatchHooks
from robusttrain.metamorphic.suite import DEFAULT_SEVERITIES, MRSuite

from .balanced_average import BalancedAverage
from .balanced_checkpoint import BalancedCheckpoint
from .context import RobustnessConfigError, RobustnessContext
from .ema import EMACheckpoint
from .failure_mining import FailureMiningCallback
from .metamorphic import MetamorphicCallback
from .metamorphic_training import MetamorphicTraining, metamorphic_forward, metamorphic_loss
from .reporting import RobustnessReporter
from .run_checkpoint import RunCheckpoint


def robustness(
    run_dir: str | os.PathLike | None = None,
    perturbations: Sequence[str] | None = None,
    severities: Sequence[int] = DEFAULT_SEVERITIES,
    seed: int = 0,
    hooks: BatchHooks | None = None,
    max_cases: int | None = None,
    policy: str = "last_inlier",
    contamination: float = 0.1,
    monitor: str = "val/loss",
    replay_ratio: float = 0.2,
    train_probe_size: int = 32,
    mining: bool = True,
    average: bool = False,
    **kwargs: Any,
) -> list:
    """The four robustness callbacks, configured, sharing one :class:`RobustnessContext`.

    ``kwargs`` of the form ``<callback>__<arg>`` go to one callback (``metamorphic__``,
    ``balanced__``, ``mining__``, ``reporter__``, ``average__``), e.g. ``metamorphic__every_n_epochs=2``.
    With ``mining=True`` (and ``replay_ratio > 0``) build the train loader over
    ``callbacks[2].wrap(train_dataset)``. ``average=True`` appends a :class:`BalancedAverage`
    (``balanced_average.ckpt``) last, so the indices above stay.
    """
    groups: dict[str, dict[str, Any]] = {
        "metamorphic": {},
        "balanced": {},
        "mining": {},
        "reporter": {},
        "average": {},
    }
    for key, value in kwargs.items():
        name, _, arg = key.partition("__")
        if name not in groups or not arg:
            raise TypeError(
                f"robustness() got an unexpected argument {key!r}; use <callback>__<arg> "
                f"with callback one of {sorted(groups)}"
            )
        groups[name][arg] = value
    ctx = RobustnessContext()
    out = [
        MetamorphicCallback(
            suite=MRSuite(perturbations, severities, seed),
            hooks=hooks,
            max_cases=max_cases,
            dirpath=None if run_dir is None else os.fspath(run_dir),
            context=ctx,
            **groups["metamorphic"],
        ),
        BalancedCheckpoint(
            dirpath=run_dir,
            policy=policy,
            contamination=contamination,
            monitor=monitor,
            context=ctx,
            **groups["balanced"],
        ),
    ]
    if mining:
        out.append(
            FailureMiningCallback(
                replay_ratio=replay_ratio,
                train_probe_size=train_probe_size,
                dirpath=run_dir,
                context=ctx,
                **groups["mining"],
            )
        )
    out.append(RobustnessReporter(dirpath=run_dir, context=ctx, **groups["reporter"]))
    if average:
        out.append(BalancedAverage(dirpath=run_dir, hooks=hooks, seed=seed, context=ctx, **groups["average"]))
    return out


__all__ = [
    "MetamorphicCallback",
    "MetamorphicTraining",
    "metamorphic_forward",
    "metamorphic_loss",
    "BalancedCheckpoint",
    "BalancedAverage",
    "EMACheckpoint",
    "FailureMiningCallback",
    "RobustnessReporter",
    "RunCheckpoint",
    "RobustnessContext",
    "RobustnessConfigError",
    "robustness",
    "BatchHooks",
    "MRSuite",
]
