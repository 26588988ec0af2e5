"""Weight-averaging maths without a trainer: the EMA decay sized to the run (:class:`EMACheckpoint`)
and the balanced average's epoch windows, state averaging and seeded BatchNorm re-estimation
(:class:`BalancedAverage`; both callbacks are in :mod:`robusttrain.callbacks`).

An exponential moving average with decay ``d`` per update gives the weights of ``k`` updates ago the
share ``(1 - d) * d**k``; a fixed ``d`` therefore means a different window in every run: Lightning's
default 0.999 has a half-life of ~693 updates, a quarter of a 2,820-step run, and after that run still
keeps ``0.999**2819 ~ 6 %`` of its weight on the first update's weights (Evidence v3). Sizing the
half-life to the run fixes the window: with ``U`` updates and a half-life of ``half_life * U`` updates,

    ``decay = 0.5 ** (1 / (half_life * U))``

so the last ``w`` fraction of the updates carries ``1 - 0.5 ** (w / half_life)`` of the average and
the first update (copied, not blended, by :class:`torch.optim.swa_utils.AveragedModel`) keeps
``decay ** (U - 1) ~ 0.5 ** (1 / half_life)``. The default ``half_life = 0.05`` puts 97 % of the weight
on the last quarter of training (the constant-LR tail of the recipes) and ~1e-6 on the first update.

>>> d = ema_decay(0.05, 2820)
>>> round(d, 5), f"{first_update_share(d, 2820):.1e}", round(last_fraction_share(d, 2820, 0.25), 3)
(0.9951, '9.6e-07', 0.969)
>>> round(first_update_share(0.999, 2820), 3)  # the fixed default of Lightning on that run
0.06
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.optim.swa_utils import update_bn

from robusttrain.checkpoints import rng_state, set_rng_state
from robusttrain.validate import check_fraction, check_int

DEFAULT_HALF_LIFE = 0.05


def ema_decay(half_life: float, updates: int) -> float:
    """``0.5 ** (1 / (half_life * updates))``: the decay whose half-life is ``half_life`` of ``updates``.

    >>> ema_decay(0.5, 2)  # half-life of one update
    0.5
    """
    half_life = check_fraction("half_life", half_life, 0.0, 1.0, lo_open=True)
    updates = check_int("updates", updates, 1)
    return 0.5 ** (1.0 / (half_life * updates))


def first_update_share(decay: float, updates: int) -> float:
    """Share of the first update's weights in the EMA after ``updates`` updates: ``decay ** (updates - 1)``.

    >>> first_update_share(0.5, 3)
    0.25
    """
    return float(decay) ** max(0, int(updates) - 1)


def last_fraction_share(decay: float, updates: int, fraction: float) -> float:
    """Share of the last ``fraction`` of the updates in the EMA: ``1 - decay ** round(fraction * updates)``.

    >>> last_fraction_share(0.5, 4, 0.5)
    0.75
    """
    return 1.0 - float(decay) ** round(fraction * updates)


def half_life_updates(decay: float) -> float:
    """Updates after which a weight's share has halved: ``ln 0.5 / ln decay`` (inf for decay 1, 0 for 0).

    >>> round(half_life_updates(0.999), 1)
    692.8
    """
    if decay <= 0.0:
        return 0.0
    if decay >= 1.0:
        return math.inf
    return math.log(0.5) / math.log(decay)


# -- the balanced average (BalancedAverage) ------------------------------------------------------------
LR_TAIL = "lr_tail"
FALLBACK_WINDOW = 0.5  # window="lr_tail" on a run without a constant-LR tail: the last half


def window_epochs(epochs: Iterable[int], window: float) -> list[int]:
    """The last ``ceil(window * n)`` (at least one) of ``n`` validated epochs.

    >>> window_epochs(range(8), 0.5), window_epochs([0, 1, 2], 0.5), window_epochs([3], 0.1)
    ([4, 5, 6, 7], [1, 2], [3])
    """
    eps = sorted(set(int(e) for e in epochs))
    n = max(1, math.ceil(window * len(eps) - 1e-9))  # 1e-9: 0.3·10 must be 3, not 4
    return eps[-n:] if eps else []


def constant_lr_tail(epochs: Iterable[int], lrs: Mapping[int, Sequence[float]]) -> list[int]:
    """The trailing run of ``epochs`` trained at the last one's learning rate: every epoch whose recorded
    ``(lr at start, lr at end)`` both equal the last epoch's start LR (relative tolerance 1e-9). An epoch
    without a record ends the run.

    >>> lrs = {0: (1.0, 1.0), 1: (0.5, 0.5), 2: (0.2, 0.2), 3: (0.2, 0.2)}
    >>> constant_lr_tail([0, 1, 2, 3], lrs), constant_lr_tail([0, 1, 2], lrs), constant_lr_tail([], lrs)
    ([2, 3], [2], [])
    """
    eps = sorted(set(int(e) for e in epochs))
    if not eps or eps[-1] not in lrs:
        return []
    final = float(lrs[eps[-1]][0])
    tail: list[int] = []
    for e in reversed(eps):
        rec = lrs.get(e)
        if rec is None or not all(math.isclose(float(v), final, rel_tol=1e-9, abs_tol=0.0) for v in rec):
            break
        tail.append(e)
    return tail[::-1]


def inlier_epochs(
    epochs: Sequence[int], outlier_epochs: Mapping[str, Iterable[int]]
) -> tuple[list[int], str]:
    """The ``epochs`` no corner case flags (status ``"ok"``); when every one is flagged, those flagged by
    the fewest corner cases (status ``"no_inlier_epoch"``): the epochs a balanced average is taken over.

    >>> inlier_epochs([5, 6, 7], {"p1": [6], "p2": [6, 7]})
    ([5], 'ok')
    >>> inlier_epochs([6, 7], {"p1": [6], "p2": [6, 7]})
    ([7], 'no_inlier_epoch')
    """
    bad: dict[int, int] = {}
    for eps in outlier_epochs.values():
        for e in set(eps):
            bad[int(e)] = bad.get(int(e), 0) + 1
    inliers = [e for e in epochs if e not in bad]
    if inliers or not epochs:
        return inliers, "ok"
    fewest = min(bad[e] for e in epochs)
    return [e for e in epochs if bad[e] == fewest], "no_inlier_epoch"


def average_states(states: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Uniform average of state dicts (floating tensors, summed in float64); other tensors (e.g.
    BatchNorm's ``num_batches_tracked``) are taken from the last state.

    >>> a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    >>> b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    >>> avg = average_states([a, b]); avg["w"].tolist(), avg["n"].item()
    ([2.0, 4.0], 5)
    """
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    last: dict[str, torch.Tensor] = {}
    count = 0
    for state in states:
        count += 1
        for k, v in state.items():
            if torch.is_floating_point(v):
                dtypes[k] = v.dtype
                sums[k] = sums[k] + v.double() if k in sums else v.double().clone()
            else:
                last[k] = v.clone()
    if count == 0:
        raise ValueError("average_states: no state to average")
    return {**last, **{k: (s / count).to(dtypes[k]) for k, s in sums.items()}}


def check_window(window: Any) -> float | str:
    """``window``: a fraction of the validated epochs in (0, 1], or :data:`LR_TAIL`.

    >>> check_window(0.5), check_window("lr_tail")
    (0.5, 'lr_tail')
    """
    if window == LR_TAIL:
        return LR_TAIL
    if isinstance(window, str):
        raise ValueError(f"window={window!r}: expected a number in (0, 1] or {LR_TAIL!r}")
    return check_fraction("window", window, 0.0, 1.0, lo_open=True)


def seeded_update_bn(
    batches: Iterable[torch.Tensor], module: torch.nn.Module, seed: int, device: torch.device | None = None
) -> None:
    """BatchNorm statistics of ``module`` re-estimated over ``batches`` (train mode, cumulative mean;
    :func:`torch.optim.swa_utils.update_bn`), every RNG seeded with ``seed`` first -- the same seed reads
    the same batches, whatever ran before -- and put back after, so the run's streams do not move."""
    saved = rng_state()
    try:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        update_bn(batches, module, device=device)
    finally:
        set_rng_state(saved)
