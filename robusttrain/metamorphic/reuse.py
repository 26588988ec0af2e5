"""The MR check's clean pass (MetamorphicCallback) without a second forward: the validation loop has just forwarded
every validation image with the very weights the check scores; its outputs, keyed by the exact bytes
of each input, stand in for the check's clean forward. The check's own follow-up forwards are recorded
too, so the image strips of its worst violations (source and follow-up predictions) need no forward.

A forward hook on the LightningModule (attached during validation and the check) records, per input sample, a
digest of its bytes -> its labels. The check asks for a probe batch's labels and gets them only when
every sample's digest is known **and** the weights are still the ones that produced them (every
parameter's and buffer's storage and version counter: an optimiser step, a weight swap or a load
changes them) and the module was in eval mode; otherwise None, and the check forwards the batch
itself. Same inputs, same weights, same forward -> the same labels, so nothing reported changes; a
dataset that draws random numbers in ``__getitem__``, a ``validation_step`` that does not call
``self(x)`` or transforms applied on the device simply miss the cache.

>>> import torch
>>> net = torch.nn.Conv2d(3, 2, 1).eval()
>>> reuse = ValidationOutputs(lambda out: out.softmax(1))
>>> reuse.attach(net); x = torch.rand(4, 3, 8, 8); _ = net(x); reuse.detach()
>>> labels, k = reuse.lookup(net, x[1:3]); labels.shape, k
(torch.Size([2, 8, 8]), 2)
>>> with torch.no_grad(): _ = net.weight.add_(1.0)   # the weights moved: nothing is reused
>>> reuse.lookup(net, x[1:3]) is None
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .scoring import probabilities_to_labels


def _digest(x: torch.Tensor) -> bytes:
    a = x.detach().cpu().contiguous().numpy()
    h = hashlib.blake2b(a.tobytes(), digest_size=16)
    h.update(f"{a.dtype}{a.shape}".encode())
    return h.digest()


def _weights(module: torch.nn.Module) -> tuple:
    # storage + in-place version of every tensor: changes with any optimiser step, copy_ or swap
    return tuple((t.data_ptr(), t._version) for t in (*module.parameters(), *module.buffers()))


class ValidationOutputs:
    """Labels the validation loop's forwards produced, by input digest (module doc)."""

    def __init__(self, to_probabilities: Callable[[Any], torch.Tensor], max_bytes: int = 256 * 2**20):
        self.to_probabilities = to_probabilities
        self.max_bytes = int(max_bytes)  # large volumes: stop recording (the check then forwards)
        self.nbytes = 0
        self.labels: dict[bytes, tuple[np.ndarray, int]] = {}
        self.weights: tuple | None = None
        self._handle: Any = None  # torch.utils.hooks.RemovableHandle while attached

    def attach(self, module: torch.nn.Module) -> None:
        self.detach()
        self._handle = module.register_forward_hook(self._record)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def clear(self) -> None:
        self.labels, self.weights, self.nbytes = {}, None, 0

    def _record(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        x = args[0] if args else None
        if not torch.is_tensor(x) or x.ndim not in (4, 5) or not x.is_floating_point():
            return
        if any(m.training for m in module.modules()):
            return
        try:
            probs = self.to_probabilities(output)
            labels = probabilities_to_labels(probs)
        except Exception:  # noqa: BLE001 -- anything odd: the check forwards (and reports) it itself
            return
        if labels.shape[0] != x.shape[0]:
            return
        weights = _weights(module)
        if weights != self.weights:
            self.clear()
            self.weights = weights
        k = max(2, int(probs.shape[1]))
        lab = labels.detach().cpu().numpy()
        lab = lab.astype(np.uint8) if k <= 255 else lab
        if self.nbytes + lab.nbytes > self.max_bytes:
            return
        self.nbytes += lab.nbytes
        for xi, li in zip(x, lab):
            self.labels[_digest(xi)] = (li, k)

    def lookup(self, module: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, int] | None:
        """(labels (B,...) int64, classes) of ``images`` under ``module``'s current weights, or None."""
        if not self.labels or _weights(module) != self.weights:
            return None
        found = [self.labels.get(_digest(xi)) for xi in images]
        got = [g for g in found if g is not None]
        if len(got) != len(found) or len({g[1] for g in got}) != 1:
            return None
        return torch.from_numpy(np.stack([g[0] for g in got]).astype(np.int64)), got[0][1]

    def predict_fn(
        self, module: torch.nn.Module, predict: Callable[[torch.Tensor], torch.Tensor]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``predict`` for consumers of labels only (failure strips): recorded labels as one-hot
        probabilities (the same labels back), else ``predict`` itself."""

        def run(images: torch.Tensor) -> torch.Tensor:
            known = self.lookup(module, images.cpu())
            if known is None:
                return predict(images)
            return torch.nn.functional.one_hot(known[0], known[1]).movedim(-1, 1).float().to(images.device)

        return run
