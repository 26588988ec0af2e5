"""Gather helpers for callbacks (shared; other callbacks may reuse them).

``gather_objects(trainer, obj)`` returns the list of every rank's ``obj`` (in rank order) on
*every* rank -- a collective, so all ranks must call it at the same point. With one process
it is ``[obj]`` and needs no process group. Objects are pickled, so send compact numpy
arrays / plain containers (e.g. per-case integer sums with their ids), not tensors on GPU.

>>> class _T: world_size = 1
>>> gather_objects(_T(), {"a": 1})
[{'a': 1}]
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


def world_size(trainer: Any) -> int:
    return int(getattr(trainer, "world_size", 1) or 1)


def is_global_zero(trainer: Any) -> bool:
    return bool(getattr(trainer, "is_global_zero", True))


def gather_objects(trainer: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order, on every rank (``all_gather_object``)."""
    if world_size(trainer) == 1 or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(trainer: Any, obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if world_size(trainer) == 1 or not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
