"""Volume-level segmentation scores from sums (CaseScores).

Scores are kept as integer sums per class -- intersection, prediction sum, target sum --
so the slices of one case (and the shards of several DDP ranks) add up exactly; Dice and
IoU are computed from the sums only at the end. Empty target and empty prediction is a
perfect score (1.0).

>>> import torch
>>> pred = torch.tensor([[[0, 1], [1, 1]]]); gt = torch.tensor([[[0, 1], [0, 1]]])
>>> s = slice_sums(pred, gt, num_classes=2)      # (B, K-1, 3): I, P, T
>>> s.tolist()
[[[2, 3, 2]]]
>>> round(float(dice_from_sums(s)[0, 0]), 3), round(float(iou_from_sums(s)[0, 0]), 3)
(0.8, 0.667)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from .outputs import (  # noqa: F401
    NonFiniteOutputError,
    ProbabilityOutputError,
    check_probabilities,
    logits_to_probabilities,
)


def probabilities_to_labels(probs: torch.Tensor) -> torch.Tensor:
    """(B,K,H,W) class probabilities -> (B,H,W) int64 labels; volumes (B,K,H,W,D) -> (B,H,W,D).

    K == 1 is read as the foreground probability of a binary task (threshold 0.5). NaN/inf raise
    :class:`NonFiniteOutputError` (every consumer of labels gets the check), values outside [0,1]
    :class:`ProbabilityOutputError`.
    """
    if probs.ndim not in (4, 5):
        raise ValueError(
            f"expected probabilities of shape (B,K,H,W) or (B,K,H,W,D), got {tuple(probs.shape)}"
        )
    check_probabilities(probs)
    if probs.shape[1] == 1:
        return (probs[:, 0] > 0.5).long()
    if probs.shape[1] == 2 and not probs.is_complex():
        # argmax over a 2-channel dim is a strided reduction (tens of ms per batch on a busy CPU);
        # one comparison gives the same labels (argmax keeps the first index on ties).
        return (probs[:, 1] > probs[:, 0]).long()
    return probs.argmax(dim=1)


def slice_sums(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per sample and foreground class: (intersection, pred sum, target sum), int64 (B,K-1,3).

    ``pred`` / ``target`` are (B,H,W) label maps -- or (B,H,W,D) volumes, summed over all voxels,
    so a volume's Dice is one score per case; class 0 is background and not scored.
    """
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and mask {tuple(target.shape)} differ")
    # one bincount of (pred, target) pairs per sample = a confusion matrix; a single pass over
    # the pixels instead of three masked sums per class
    b, k = pred.shape[0], int(num_classes)
    codes = (pred.long().clamp(0, k - 1) * k + target.long().clamp(0, k - 1)).flatten(1)
    codes = codes + torch.arange(b, device=codes.device)[:, None] * (k * k)
    cm = torch.bincount(codes.flatten(), minlength=b * k * k).view(b, k, k)
    inter = torch.diagonal(cm, dim1=1, dim2=2)
    return torch.stack([inter, cm.sum(2), cm.sum(1)], dim=2)[:, 1:].long()


def logits_sums(logits: torch.Tensor, mask: torch.Tensor, threshold: float = 0.5) -> np.ndarray:
    """:func:`slice_sums` of raw logits, as int64 numpy (B, K-1, 3): intersection, prediction sum,
    target sum per sample and foreground class.

    K>1 channels: softmax classes (argmax of the logits, which is the argmax of the softmax);
    1 channel: sigmoid > ``threshold`` against ``mask > 0``. Sums run over every spatial dim, so
    a (B,K,H,W,D) volume gives one volume-level count per case.

    >>> logits = torch.zeros(1, 2, 4, 4, 3); logits[:, 1, :2] = 1.0      # predicts the top half
    >>> mask = torch.zeros(1, 4, 4, 3, dtype=torch.long); mask[:, :1] = 1  # the top quarter
    >>> logits_sums(logits, mask)[0, 0].tolist()                          # I, P, T over 48 voxels
    [12, 24, 12]
    """
    if logits.shape[1] == 1:
        pred, target, k = (torch.sigmoid(logits[:, 0]) > threshold).long(), (mask > 0).long(), 2
    else:
        pred, target, k = logits.argmax(1), mask, logits.shape[1]
    return slice_sums(pred, target, k).cpu().numpy()


def dice_from_sums(s: np.ndarray | torch.Tensor) -> np.ndarray:
    """Dice = 2I / (P+T) along the last axis of ``(..., 3)`` sums; 1.0 when P+T == 0."""
    s = np.asarray(s, dtype=np.float64)
    i, p, t = s[..., 0], s[..., 1], s[..., 2]
    den = p + t
    return np.where(den > 0, 2 * i / np.where(den > 0, den, 1), 1.0)


def iou_from_sums(s: np.ndarray | torch.Tensor) -> np.ndarray:
    """IoU = I / (P+T-I) along the last axis of ``(..., 3)`` sums; 1.0 when the union is empty."""
    s = np.asarray(s, dtype=np.float64)
    i, p, t = s[..., 0], s[..., 1], s[..., 2]
    den = p + t - i
    return np.where(den > 0, i / np.where(den > 0, den, 1), 1.0)


METRICS: dict[str, Callable] = {"dice": dice_from_sums, "iou": iou_from_sums}


class CaseScores:
    """Accumulates per-case sums over slices (and ranks); the unit of per-case metrics.

    >>> cs = CaseScores(["fg"])
    >>> cs.add(["a", "a"], torch.tensor([[[1, 2, 1]], [[0, 0, 3]]]))
    >>> cs.sums["a"].tolist(), round(float(cs.scores("dice")["a"][0]), 3)
    ([[1, 2, 4]], 0.333)
    """

    def __init__(self, class_names: Iterable[str]):
        self.class_names = list(class_names)
        self.sums: dict[str, np.ndarray] = {}

    def add(self, case_ids: Iterable[str], sums: np.ndarray | torch.Tensor) -> None:
        sums = np.asarray(sums.cpu() if isinstance(sums, torch.Tensor) else sums, dtype=np.int64)
        for cid, s in zip(case_ids, sums):
            if cid in self.sums:
                self.sums[cid] = self.sums[cid] + s
            else:
                self.sums[cid] = s.copy()

    def scores(self, metric: str = "dice") -> dict[str, np.ndarray]:
        """Per case, per foreground class score of ``metric`` (``dice`` or ``iou``)."""
        fn = METRICS[metric]
        return {cid: fn(s) for cid, s in self.sums.items()}

    def mean(self, metric: str = "dice") -> dict[str, float]:
        """Per case, the mean over foreground classes."""
        return {cid: float(np.mean(v)) for cid, v in self.scores(metric).items()}
