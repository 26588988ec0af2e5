"""The training conditions the evidence benchmarks compare, at one step budget (shared code).

Every condition trains on ``N`` samples per epoch, a fraction ``ratio`` of which are replaced by
*slot* samples (the ReplayDataset layout), so only what fills the slots differs:

- ``plain``  — clean random training samples;
- ``random`` — a random perturbation x severity with random params (standard augmentation with
  the same perturbation families: ``RandomPerturbationDataset``);
- ``mined``  — failures found by a MetamorphicCallback train probe, replayed by
  ``FailureMiningCallback`` (its ``jitter`` / ``fresh_image`` / ``clean_mix`` settings).

Used by ``mining_evidence.py`` and ``evidence.py``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.mining import RandomPerturbationDataset

CONDITIONS = ("plain", "random", "mined")
# the recipe's "family replay" (robusttrain/recipes/callbacks/robust.yaml), the best Kvasir/synthetic
# trade-off in docs/results.md (Failure mining)
MINING_DEFAULTS = {"jitter": 0.3, "fresh_image": 0.4, "clean_mix": 0.2}


def usable_families(names: Sequence[str] | None, in_channels: int) -> list[str]:
    """The families of ``names`` (None: the nine default ones) that run on ``in_channels`` images."""
    suite = MRSuite(names)
    suite.prepare(in_channels)
    return [n for n in suite.names if n not in suite.skipped]


def training_callbacks(cond: str, dm: Any, perturbations: Sequence[str], severities: Sequence[int], *,
                       seed: int, ratio: float = 0.2, probe: int = 64, mine_every: int = 1,
                       val_every: int = 0, run_dir: str | None = None, mining: dict | None = None,
                       batch_size: int = 8) -> tuple[list, MetamorphicCallback]:
    """Callbacks of one condition; the train loader of ``dm`` is built over the condition's wrapper
    (``dm.wrap_train``: FailureMiningCallback.wrap or a RandomPerturbationDataset).

    ``dm`` must be set up. The MetamorphicCallback's suite (seeded by ``seed``, the data seed, so
    follow-ups do not depend on the training seed) checks the validation set every ``val_every``
    epochs (0 = never) and, for ``mined`` only, ``probe`` training cases every ``mine_every`` epochs.
    """
    if cond not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {cond!r}")
    mr = MetamorphicCallback(suite=MRSuite(list(perturbations), tuple(severities), seed=seed),
                             every_n_epochs=val_every, dirpath=run_dir, verbose=False, batch_size=batch_size)
    if cond == "mined":
        mining_cb = FailureMiningCallback(replay_ratio=ratio, train_probe_size=probe, every_n_epochs=mine_every,
                                          **{**MINING_DEFAULTS, **(mining or {})})
        dm.wrap_train(mining_cb.wrap)
        return [mr, mining_cb], mr
    # same slot layout as ReplayDataset
    names = list(perturbations) if cond == "random" else []
    dm.wrap_train(lambda ds: RandomPerturbationDataset(ds, names, tuple(severities), ratio=ratio))
    return [mr], mr


def mean_std(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    """Mean and sample std (0 for one value), rounded."""
    v = np.asarray(list(values), dtype=np.float64)
    return {"mean": round(float(v.mean()), digits),
            "std": round(float(v.std(ddof=1)) if v.size > 1 else 0.0, digits)}
