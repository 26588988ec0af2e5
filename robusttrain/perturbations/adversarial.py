"""``adversarial``: a one-step FGSM / DAG-style attack on a segmentation model (paper 002).

Takes the model (any callable ``images -> logits``, (B,1,H,W) sigmoid or (B,K,H,W) softmax) and moves
each pixel by ``eps`` against the segmentation: untargeted (raise the loss of the given masks, or of
the model's own prediction when no masks are given) or DAG target A (push every pixel to background).
Severity -> eps (1: 1/255, 2: 2/255, 3: 4/255, 4: 6/255, 5: 8/255). The perturbation itself is stored in
params (``delta`` (B,C,H,W)), so replays on either path are exact. For the metamorphic checker only —
never use it as a blind augmentation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .base import Perturbation, image_to_batch


class Adversarial(Perturbation):
    """FGSM on the segmentation loss.

    Example:
        >>> import torch
        >>> model = torch.nn.Conv2d(3, 2, 3, padding=1)
        >>> adv = Adversarial(model, severity=5)
        >>> x = torch.rand(2, 3, 16, 16)
        >>> out, p = adv.apply_batch(x)
        >>> float((out - x).abs().max()) <= 8 / 255 + 1e-6
        True
    """

    name = "adversarial"
    trainable = False  # needs the model under training; the training callbacks draw data-only families
    rgb = False
    EPS = {1: 1 / 255, 2: 2 / 255, 3: 4 / 255, 4: 6 / 255, 5: 8 / 255}

    def __init__(
        self,
        model: Callable[[torch.Tensor], torch.Tensor] | None = None,
        severity: int = 3,
        target: str = "untargeted",
    ):
        super().__init__(severity)
        if model is None or not callable(model):
            raise ValueError(
                "adversarial: needs the model, a callable images -> logits, e.g. "
                "get('adversarial', severity=3, model=net)"
            )
        if target not in ("untargeted", "background"):
            raise ValueError(f"adversarial: target must be 'untargeted' or 'background', got {target!r}")
        self.model, self.target, self.eps = model, target, self.EPS[self.severity]

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.shape[1] == 1:
            return F.binary_cross_entropy_with_logits(logits[:, 0], (labels > 0).to(logits.dtype))
        return F.cross_entropy(logits, labels.clamp(0, logits.shape[1] - 1))

    def _sample_torch(self, images, masks, generator):
        x = images.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(x)
            if self.target == "background":
                labels = torch.zeros(
                    logits.shape[0], *logits.shape[2:], dtype=torch.long, device=logits.device
                )
                sign = -1.0  # descend towards all-background (DAG target A)
            else:
                if masks is not None:
                    labels = masks.long()
                elif logits.shape[1] == 1:
                    labels = (logits[:, 0] > 0).long().detach()
                else:
                    labels = logits.argmax(1).detach()
                sign = 1.0
            (grad,) = torch.autograd.grad(self._loss(logits, labels), x)
        delta = sign * self.eps * grad.sign()
        return {"delta": delta.detach()}

    def _sample_np(self, image, mask, rng):
        dev = (
            next(iter(self.model.parameters())).device
            if isinstance(self.model, torch.nn.Module) and any(True for _ in self.model.parameters())
            else torch.device("cpu")
        )
        t = image_to_batch(image).to(dev)
        m = None if mask is None else torch.from_numpy(np.asarray(mask, np.int64))[None].to(dev)
        # (C,H,W), the same schema as index_params of a batch
        return {"delta": self._sample_torch(t, m, None)["delta"][0].cpu().numpy()}

    def _apply_torch(self, images, masks, params):
        return (images + params["delta"].to(images.dtype)).clamp_(0, 1)

    def _apply_np(self, image, mask, params):
        d = np.asarray(params["delta"], np.float32).transpose(1, 2, 0)  # schema is (C,H,W)
        if d.shape != image.shape:
            raise ValueError(
                f"adversarial: params['delta'] has shape {d.shape[::-1]} (C,H,W) but the image is "
                f"{image.shape} (H,W,C); replay params on the image they were computed for"
            )
        if image.dtype == np.uint8:
            return np.clip(np.rint(image.astype(np.float32) + d * 255), 0, 255).astype(np.uint8)
        return np.clip(image + d, 0, 1).astype(np.float32)
