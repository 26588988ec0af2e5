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
:func:`robustness` returns them configured as the recipes have them on by default (the check, random
augmentation with the suite's families, the balanced checkpoint and average, the EMA, the reporter: what
the evidence supports, docs/results.md; mining, on in the recipes, on request: it must find the training set):

>>> cbs = robustness(run_dir="runs/x", perturbations=["blur"], severities=(2,))
>>> [type(c).__name__ for c in cbs]
['MetamorphicCallback', 'MetamorphicTraining', 'BalancedCheckpoint', 'BalancedAverage', 'EMACheckpoint', 'RobustnessReporter']
>>> [type(c).__name__ for c in robustness(perturbations=["blur"], training=False, average=False, ema=False, mining=True)]
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
    training: bool = True,
    average: bool = True,
    ema: bool = True,
    mining: bool = False,
    replay_ratio: float | None = None,
    train_probe_size: int = 32,
    **kwargs: Any,
) -> list:
    """The robustness callbacks the recipes switch on by default, configured, sharing one
    :class:`RobustnessContext`, in this order: :class:`MetamorphicCallback` (the check, ``budget=0.25``),
    :class:`MetamorphicTraining` (``training``: random augmentation, ``k=1, q=0.5``, the suite's families),
    :class:`BalancedCheckpoint`, :class:`BalancedAverage` (``average``), :class:`EMACheckpoint` (``ema``:
    Lightning's EMA sized to the run, ``ema.ckpt``; validation then sees the EMA weights), :class:`FailureMiningCallback`
    (``mining``: mining v2 steers the random draws; on in the recipes, off here by default because it must
    find your training set: ``mining__train_dataset=``, ``datamodule.train_dataset`` or a train loader over
    ``mining.wrap(train_dataset)``, which the frozen replay (``replay_ratio``) needs anyway) and
    :class:`RobustnessReporter` last. Find one by type, not by index.

    ``kwargs`` of the form ``<callback>__<arg>`` go to one callback (``metamorphic__``, ``training__``,
    ``balanced__``, ``average__``, ``ema__``, ``mining__``, ``reporter__``), e.g. ``ema__half_life=0.1``.
    """
    groups: dict[str, dict[str, Any]] = {
        name: {} for name in ("metamorphic", "training", "balanced", "average", "ema", "mining", "reporter")
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
    run_path = None if run_dir is None else os.fspath(run_dir)
    out: list = [
        MetamorphicCallback(
            suite=MRSuite(perturbations, severities, seed),
            hooks=hooks,
            max_cases=max_cases,
            dirpath=run_path,
            context=ctx,
            **{"budget": 0.25, **groups["metamorphic"]},
        )
    ]
    if training:
        training_args = {"objective": "replace", "k": 1, "q": 0.5, "seed": seed, **groups["training"]}
        out.append(MetamorphicTraining(dirpath=run_path, hooks=hooks, context=ctx, **training_args))
    out.append(
        BalancedCheckpoint(
            dirpath=run_dir,
            policy=policy,
            contamination=contamination,
            monitor=monitor,
            context=ctx,
            **groups["balanced"],
        )
    )
    if average:
        out.append(BalancedAverage(dirpath=run_dir, hooks=hooks, seed=seed, context=ctx, **groups["average"]))
    if ema:
        out.append(EMACheckpoint(dirpath=run_dir, context=ctx, **groups["ema"]))
    if mining:
        # replay_ratio selects the frozen replay; without it the callback's default mode (steer)
        mining_args = {"replay_ratio": replay_ratio} if replay_ratio else {}
        out.append(
            FailureMiningCallback(
                train_probe_size=train_probe_size,
                dirpath=run_dir,
                context=ctx,
                **{**mining_args, **groups["mining"]},
            )
        )
    out.append(RobustnessReporter(dirpath=run_dir, context=ctx, **groups["reporter"]))
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
