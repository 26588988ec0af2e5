"""MetamorphicCallback's robustness budget glue: counting training work, the (reported) training
clock, and turning a plan into indices.

The plan itself (which pairs, how many) is :class:`robusttrain.metamorphic.budget.CheckBudget`;
here: how much the model trained since the last check -- pixels of the training batches
(:class:`TrainWork`, what the budget plans with: deterministic) and wall seconds (:class:`TrainClock`,
only reported) -- and which dataset indices a planned set of cases means.

>>> import torch
>>> work = TrainWork(); work.add({"image": torch.zeros(4, 3, 16, 16)}); work.add((torch.zeros(2, 3, 8, 8), None))
>>> work.take()   # 4 x 16 x 16 + 2 x 8 x 8 pixels
1152
>>> clock = TrainClock(); clock.start(0.0); clock.step(2.0); clock.pause(); clock.resume(10.0); clock.step(11.0)
>>> clock.take()   # 2 s + 1 s of batches; the 8 s in between (validation) do not count
3.0
>>> to_indices({0: {"a"}, 1: {"b"}}, [10, 11, 12], ["a", "a", "b"])
{0: {10, 11}, 1: {12}}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


class TrainWork:
    """Pixels (voxels) of the training images seen since the last :meth:`take`.

    ``get_images`` reads a batch's images (the MR hooks); a batch it cannot read (lists of crops,
    custom containers) is counted through every floating tensor of >= 3 dims in it, and a batch with
    none counts 0 (the budget then affords only its minimum)."""

    def __init__(self, get_images: Callable[[Any], torch.Tensor] | None = None) -> None:
        self.pixels = 0
        self.get_images = get_images

    def add(self, batch: Any) -> None:
        x = None
        if self.get_images is not None:
            try:
                x = self.get_images(batch)
            except Exception:  # noqa: BLE001 -- the fallback below counts any image-like tensor
                x = None
        self.pixels += _pixels(x) if torch.is_tensor(x) else sum(_pixels(t) for t in _image_tensors(batch))

    def take(self) -> int:
        out, self.pixels = self.pixels, 0
        return out


def _pixels(x: torch.Tensor) -> int:
    # (B,C,H,W[,D]) -> B*H*W[*D]; a 3-dim tensor is one (C,H,W) image
    if x.ndim < 3:
        return 0
    return int(x.numel() // x.shape[1]) if x.ndim >= 4 else int(x.numel() // x.shape[0])


def _image_tensors(batch: Any, depth: int = 0):
    if torch.is_tensor(batch):
        if batch.is_floating_point() and batch.ndim >= 4:
            yield batch
    elif depth < 4 and isinstance(batch, Mapping):
        for v in batch.values():
            yield from _image_tensors(v, depth + 1)
    elif depth < 4 and isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _image_tensors(v, depth + 1)


class TrainClock:
    """Wall time spent in training batches (data loading included, validation excluded); reported only."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._mark: float | None = None

    def start(self, now: float | None = None) -> None:
        """At the start of a training epoch (and when training resumes after validation)."""
        self._mark = time.perf_counter() if now is None else now

    resume = start

    def step(self, now: float | None = None) -> None:
        """At the end of a training batch: the time since the last mark was training."""
        now = time.perf_counter() if now is None else now
        if self._mark is not None:
            self.seconds += now - self._mark
        self._mark = now

    def pause(self) -> None:
        """At the start of validation: nothing counts until :meth:`resume`."""
        self._mark = None

    def take(self) -> float:
        """Training seconds since the last call (and reset)."""
        out, self.seconds = self.seconds, 0.0
        return out


def to_indices(
    plan: Mapping[int, set[str]] | None, indices: Sequence[int], case_ids: Sequence[str]
) -> dict[int, set[int]] | None:
    """A per-test set of case ids -> the dataset indices (every slice of each case)."""
    if plan is None:
        return None
    return {k: {int(i) for i, c in zip(indices, case_ids) if c in cases} for k, cases in plan.items()}
