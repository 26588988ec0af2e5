"""The metamorphic relation as a training objective: divergences between the clean and the perturbed
prediction, the per-sample loss worst-of-k ranks candidates by, and the weight ramp.

The MR says the segmentation of a perturbed image should match the original one. Training with
``L = L_seg(x) + L_seg(x*) + lambda * D(p(x), p(x*))`` asks for exactly that, pixel by pixel (AugMix's
Jensen-Shannon consistency, Hendrycks et al. ICLR 2020). ``D`` is the per-pixel Jensen-Shannon
divergence by default (symmetric, bounded by log 2, no blow-up where a probability is 0), averaged
over pixels and samples; ``"kl"`` (clean -> perturbed) and ``"mse"`` (squared probability difference)
are the alternatives.

>>> import torch
>>> p = torch.tensor([[[[0.9]], [[0.1]]]])          # (B=1, K=2, H=1, W=1)
>>> round(float(divergence(p, p)), 6)
0.0
>>> q = torch.tensor([[[[0.1]], [[0.9]]]])
>>> round(float(divergence(p, q)), 4), round(float(divergence(p, q, "mse")), 4)
(0.3681, 1.28)
>>> ramp(0, 100, 0.2), ramp(10, 100, 0.2), ramp(50, 100, 0.2)
(0.0, 0.5, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from robusttrain.metamorphic.outputs import main_output

DIVERGENCES = ("js", "kl", "mse")
_EPS = 1e-7


def probabilities(outputs: Any, spec: str | Callable | None = None) -> torch.Tensor:
    """Differentiable (B,K,...) class probabilities of a model's outputs.

    ``spec`` is the hooks' ``to_probabilities``: ``"identity"`` (the model returns probabilities), a
    callable, or anything else for logits (one channel: sigmoid as ``[1-p, p]``; K: softmax). Unlike
    the check's conversion, nothing is guessed here: a training step never stops on a heuristic.
    """
    if callable(spec):
        return spec(outputs)
    out = main_output(outputs).float()
    if spec == "identity":
        return torch.cat([1 - out, out], 1) if out.shape[1] == 1 else out
    if out.shape[1] == 1:
        p = torch.sigmoid(out)
        return torch.cat([1 - p, p], 1)
    return torch.softmax(out, 1)


def divergence(p: torch.Tensor, q: torch.Tensor, kind: str = "js") -> torch.Tensor:
    """Mean per-pixel divergence between (B,K,...) probability maps ``p`` and ``q`` (a scalar)."""
    if kind not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")
    if p.shape != q.shape:
        raise ValueError(f"divergence: shapes differ, {tuple(p.shape)} vs {tuple(q.shape)}")
    if kind == "mse":
        return (p - q).pow(2).sum(1).mean()
    p, q = p.clamp_min(_EPS), q.clamp_min(_EPS)
    if kind == "kl":
        return (p * (p.log() - q.log())).sum(1).mean()
    m = (0.5 * (p + q)).log()
    return 0.5 * ((p * (p.log() - m)).sum(1) + (q * (q.log() - m)).sum(1)).mean()


def soft_dice_loss(probs: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-sample ``1 - soft Dice`` over the foreground classes: (B,K,...) probs, (B,...) int masks -> (B,).

    What worst-of-k ranks candidates by: the segmentation loss of the current model on a follow-up,
    any model, any resolution, empty lesions scored by their false positives (Dice of empty vs empty = 1).

    >>> pr = torch.zeros(2, 2, 4, 4); pr[:, 0] = 1.0                       # predicts background everywhere
    >>> m = torch.zeros(2, 4, 4, dtype=torch.long); m[0, :2] = 1
    >>> soft_dice_loss(pr, m).tolist()                                      # lesion missed / nothing to find
    [1.0, 0.0]
    """
    k = probs.shape[1]
    masks = masks.long()
    onehot = torch.stack([(masks == c) for c in range(1, k)], 1).to(probs.dtype)
    fg = probs[:, 1:]
    dims = tuple(range(2, probs.ndim))
    inter = (fg * onehot).sum(dims)
    total = fg.sum(dims) + onehot.sum(dims)
    dice = torch.where(total > 0, 2 * inter / total.clamp_min(_EPS), torch.ones_like(total))
    return 1 - dice.mean(1)


def ramp(step: int, total_steps: int, fraction: float) -> float:
    """Linear 0 -> 1 weight over the first ``fraction`` of ``total_steps`` (1 after; 1 when fraction == 0).

    The consistency term starts at 0: early predictions are noise, and asking noise to agree with
    noise pulls the model towards constant outputs."""
    if fraction <= 0 or total_steps <= 0:
        return 1.0
    return float(min(1.0, max(0, step) / (fraction * total_steps)))
