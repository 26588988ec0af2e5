"""Weight-averaging maths sized to the run: the EMA decay from a half-life, and the windows it gives.

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
