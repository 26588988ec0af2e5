"""Learning-rate schedules sized to the run: warm-up, cosine, and an optional constant-LR tail.

Why a constant tail: weight averaging (SWA, Izmailov et al., UAI 2018; SWAD, Cha et al., NeurIPS
2021) averages points around *one* basin visited under a constant (or cyclic) learning rate. Averaging
the epochs of a cosine that decays to zero averages a descent path instead: the late epochs barely move
and the early ones are far from where the run ends. So with ``lr_tail = f`` the schedule runs as
before (linear warm-up, then a cosine over ``total - warmup`` epochs) up to the start of the last
``ceil(f * total)`` epochs, and the LR stays at the value the cosine has there until the end; the
balanced average (``BalancedAverage(window="lr_tail")``) averages the ECOD-inlier epochs of that tail.
``f = 0`` is no tail (the plain cosine), ``f = 1`` a constant LR after the warm-up (SWAD's setting).

The schedule is one closed-form multiplier (:class:`WarmupCosineTail`, in a ``LambdaLR``): its
state is three numbers that ride in the checkpoint, and :func:`stretch_tail` re-sizes it when a run
is resumed with a larger ``max_epochs``.

>>> f = WarmupCosineTail(total=8, warmup=0, lr_tail=0.25)
>>> [round(f(e), 3) for e in range(8)]
[1.0, 0.962, 0.854, 0.691, 0.5, 0.309, 0.146, 0.146]
>>> tail_epochs(8, 0.25), tail_epochs(8, 0.0), tail_epochs(8, 1.0)
(2, 0, 8)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from robusttrain.validate import check_fraction, check_int


def tail_epochs(total: int, lr_tail: float) -> int:
    """How many of ``total`` epochs are in the constant-LR tail: ``ceil(lr_tail * total)`` (0 for no tail).

    >>> tail_epochs(10, 0.3), tail_epochs(3, 0.1)
    (3, 1)
    """
    if lr_tail <= 0:
        return 0
    return min(int(total), max(1, math.ceil(lr_tail * total - 1e-9)))  # 1e-9: 0.3*10 is 3, not 4


class WarmupCosineTail:
    """LR multiplier for epoch ``e``: linear warm-up over ``warmup`` epochs (from ``1/(warmup+1)``, as
    ``LinearLR``), then a cosine to 0 over ``total - warmup`` epochs, frozen from the first tail epoch
    ``total - tail_epochs(total, lr_tail)`` on (never before the warm-up ends).

    A callable object, not a function, so ``LambdaLR.state_dict`` saves its fields with the checkpoint.

    >>> f = WarmupCosineTail(total=4, warmup=1, lr_tail=0.5)
    >>> [round(f(e), 3) for e in range(4)]
    [0.5, 1.0, 0.75, 0.75]
    """

    def __init__(self, total: int, warmup: int = 0, lr_tail: float = 0.0) -> None:
        self.total = check_int("total", total, 1)
        self.warmup = check_int("warmup_epochs", warmup, 0)
        self.lr_tail = check_fraction("lr_tail", lr_tail)

    @property
    def tail_start(self) -> int:
        return max(self.warmup, self.total - tail_epochs(self.total, self.lr_tail))

    def __call__(self, epoch: int) -> float:
        if epoch < self.warmup:
            start = 1.0 / (self.warmup + 1)
            return start + (1.0 - start) * epoch / self.warmup
        length = max(1, self.total - self.warmup)
        t = min(epoch, self.tail_start) - self.warmup
        return (1.0 + math.cos(math.pi * min(t, length) / length)) / 2.0


def warmup_cosine_tail(
    optimizer: torch.optim.Optimizer, total: int, warmup: int = 0, lr_tail: float = 0.0
) -> LambdaLR:
    """An epoch-interval scheduler following :class:`WarmupCosineTail`.

    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> s = warmup_cosine_tail(opt, total=4, lr_tail=0.5)
    >>> lrs = []
    >>> for _ in range(4): lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); s.step()
    >>> lrs
    [1.0, 0.854, 0.5, 0.5]
    """
    return LambdaLR(optimizer, WarmupCosineTail(total, warmup, lr_tail))


def stretch_tail(scheduler: Any, total: int) -> bool:
    """Re-size a :func:`warmup_cosine_tail` scheduler to ``total`` epochs mid-run (a resume with a larger
    ``max_epochs``): the tail is then the last ``lr_tail`` of the new length and the LR is set to the new
    schedule's value at the current epoch. Returns whether anything changed (other schedulers: False).

    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> s = warmup_cosine_tail(opt, total=2, lr_tail=0.5)
    >>> opt.step(); s.step(); opt.param_groups[0]["lr"]
    0.5
    >>> stretch_tail(s, 4), round(opt.param_groups[0]["lr"], 3)
    (True, 0.854)
    """
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not isinstance(scheduler, LambdaLR) or not lambdas:
        return False
    changed = False
    for group, base, fn in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, lambdas):
        if isinstance(fn, WarmupCosineTail) and fn.total != int(total):
            fn.total, changed = check_int("total", total, 1), True
            group["lr"] = base * fn(max(0, int(scheduler.last_epoch)))
    if changed:
        scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]
    return changed
