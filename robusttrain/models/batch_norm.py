"""BatchNorm in training: refuse, before the first step, a training batch of one case.

A BatchNorm layer in train mode normalises by the batch's own statistics; with one case they are that
case's (at a 1x1 feature map PyTorch raises mid-epoch, at larger maps the layer trains on noise and its
running statistics drift). :func:`lone_batch` finds such a batch in a training loader from its batch size,
its dataset's length and ``drop_last``; :func:`check_batches` raises one line naming what to set.

>>> from torch.utils.data import DataLoader
>>> lone_batch(DataLoader(list(range(17)), batch_size=8))
'its 17 training cases in batches of 8 leave a last batch of 1 case'
>>> lone_batch(DataLoader(list(range(17)), batch_size=8, drop_last=True)) is None
True
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from robusttrain.errors import InputError


def lone_batch(loader: Any, world_size: int = 1, batches_used: float | None = None) -> str | None:
    """What makes ``loader`` yield a batch of one case (per process under DDP), or None when it cannot
    tell (a custom batch sampler, a dataset without a length) or it never does; ``batches_used``: the
    batches an epoch takes (``limit_train_batches``), when fewer than the loader has."""
    size = getattr(loader, "batch_size", None)
    if not isinstance(size, int):
        return None
    if size == 1:
        return "its batch size is 1"
    if getattr(loader, "drop_last", False):
        return None
    try:
        n = len(loader.dataset)
    except TypeError:
        return None
    per_process = math.ceil(n / max(1, world_size))  # DistributedSampler pads every process to this
    if batches_used is not None and batches_used < math.ceil(per_process / size):
        return None  # the epoch stops before the short last batch
    if per_process % size == 1:
        where = f" ({per_process} per process)" if world_size > 1 else ""
        return f"its {n} training cases{where} in batches of {size} leave a last batch of 1 case"
    return None


def check_batches(
    module: nn.Module,
    loader: Any,
    world_size: int = 1,
    batches_used: float | None = None,
    name: str = "the model",
) -> None:
    """Raise an :class:`~robusttrain.errors.InputError` when ``module`` has a BatchNorm layer in train
    mode and ``loader`` yields a batch of one case."""
    if not any(isinstance(m, _BatchNorm) and m.training for m in module.modules()):
        return
    why = lone_batch(loader, world_size, batches_used)
    if why is None:
        return
    fix = (
        "set data.batch_size to 2 or more"
        if why.endswith("is 1")
        else "set another data.batch_size, or drop_last=True in your own DataLoader"
    )
    raise InputError(
        f"{name} has BatchNorm layers, which cannot train on a batch of one case, and the training loader "
        f"gives one: {why}; {fix}"
    )
