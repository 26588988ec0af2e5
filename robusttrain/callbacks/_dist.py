"""Collectives for callbacks, all through ``trainer.strategy`` (the one way callbacks talk across ranks).

``gather_objects(trainer, obj)`` returns the list of every rank's ``obj`` (in rank order) on
*every* rank; ``broadcast_object`` sends rank ``src``'s object to all; ``barrier`` waits for all.
They are collectives: all ranks must call them at the same point. With one process they need no
process group. Objects are pickled, so send compact numpy arrays / plain containers (e.g. per-case
integer sums with their ids), not tensors on GPU.

Lightning's ``Strategy`` broadcasts any picklable object but gathers only tensors, so the gather is
one broadcast per rank: it works on every strategy (DDP, FSDP, single device ...) without reaching
for ``torch.distributed`` behind the strategy's back.

>>> class _T: world_size = 1
>>> gather_objects(_T(), {"a": 1})
[{'a': 1}]
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def world_size(trainer: Any) -> int:
    return int(getattr(trainer, "world_size", 1) or 1)


def is_global_zero(trainer: Any) -> bool:
    return bool(getattr(trainer, "is_global_zero", True))


def gather_objects(trainer: Any, obj: T) -> list[T]:
    """Every rank's ``obj`` in rank order, on every rank."""
    n = world_size(trainer)
    if n == 1:
        return [obj]
    return [trainer.strategy.broadcast(obj, src=r) for r in range(n)]


def broadcast_object(trainer: Any, obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` on every rank."""
    if world_size(trainer) == 1:
        return obj
    return trainer.strategy.broadcast(obj, src=src)


def barrier(trainer: Any, name: str) -> None:
    """Wait until every rank gets here (a no-op on one process)."""
    if world_size(trainer) > 1:
        trainer.strategy.barrier(name)
