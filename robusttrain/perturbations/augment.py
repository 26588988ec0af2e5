"""Any registered perturbation as a Kornia-style batch augmentation (:class:`BatchAugmentation`).

Callable on a (B,C,H,W) float batch in [0,1] on any device, so it can run on the GPU in a
LightningModule's ``on_after_batch_transfer``::

    self.aug = BatchAugmentation("blur", severity=(1, 5), p=0.5)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if self.trainer.training:
            batch["image"] = self.aug(batch["image"], mask=batch["mask"])
        return batch

Parameters are sampled (:meth:`BatchAugmentation.generate_parameters`) separately from being applied
(:meth:`BatchAugmentation.apply`); the last ones are kept in ``aug._params`` and
``aug(x, params=aug._params)`` reproduces the output bit-exactly. The params are a flat
``dict[str, torch.Tensor]``:

* ``batch_prob`` (B,) bool: which samples were perturbed (each with probability ``p``);
* ``severity`` (B,) int64: each perturbed sample's severity (0 for the others);
* ``s<k>.<key>``: the family's own params (its ``sample_params`` schema) for the perturbed samples of
  severity ``k``, in batch order (leading dim = their count; the schema may differ between severities).

``batch_prob`` / ``severity`` are drawn on the generator's device (the CPU unless you pass a CUDA
generator), so deciding which samples to perturb never waits for the accelerator. Masks are only read
(families that must not cover the lesion look at them) and never changed.
``Perturbation.apply_batch`` stays the functional form the metamorphic suite uses.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any, overload

import torch

from .base import Params, Perturbation, check_batch, check_masks
from .grey import grey_error
from .placement import PlacedSampling, SharedMaps
from .registry import family_class


def _check_severity(severity: Any, name: str) -> tuple[int, int]:
    def ok(s: Any) -> bool:
        return isinstance(s, numbers.Integral) and not isinstance(s, bool) and 1 <= int(s) <= 5

    if ok(severity):
        return int(severity), int(severity)
    if (
        isinstance(severity, (tuple, list))
        and len(severity) == 2
        and all(map(ok, severity))
        and severity[0] <= severity[1]
    ):
        return int(severity[0]), int(severity[1])
    raise ValueError(
        f"BatchAugmentation({name}): severity must be an int in 1..5 or a (low, high) pair with "
        f"1 <= low <= high <= 5 (a severity is drawn per sample), got {severity!r}"
    )


class BatchAugmentation(torch.nn.Module):
    """Apply perturbation ``family`` to each sample of a batch with probability ``p``.

    Args:
        family: a registered name (``robusttrain.perturbations.available()``) or a perturbation object
            (its constructor arguments are reused for the other severities).
        severity: an int 1..5, or ``(low, high)`` to draw each sample's severity uniformly from.
            Defaults to 3 (or the object's severity).
        p: probability that a sample is perturbed; the others are returned unchanged.
        **kwargs: the family's other constructor arguments (e.g. ``noise=False`` for ``blur``).

    Example:
        >>> import torch
        >>> aug = BatchAugmentation("white_balance", severity=(2, 5), p=0.5, cast="green")
        >>> x = torch.rand(6, 3, 32, 32)
        >>> out = aug(x, generator=torch.Generator().manual_seed(0))
        >>> changed = (out != x).flatten(1).any(1)
        >>> bool(torch.equal(changed, aug._params["batch_prob"]))      # exactly the selected samples
        True
        >>> bool(torch.equal(aug(x, params=aug._params), out))          # exact replay
        True
    """

    family: str
    severity: tuple[int, int]
    p: float
    _base_args: dict[str, Any]

    def __init__(
        self,
        family: str | Perturbation,
        severity: int | tuple[int, int] | None = None,
        p: float = 0.5,
        **kwargs: Any,
    ):
        super().__init__()
        if isinstance(family, Perturbation):
            if kwargs:
                raise ValueError(
                    f"BatchAugmentation({family.name}): got a perturbation object and constructor "
                    f"arguments {sorted(kwargs)}; pass one or the other"
                )
            self.family, base = family.name, family.init_args()
            self._perturbations: dict[int, Perturbation] = {family.severity: family}
            severity = family.severity if severity is None else severity
        elif isinstance(family, str):
            family_class(family)  # unknown name: one error listing the valid ones
            self.family, base, self._perturbations = family, dict(kwargs), {}
        else:
            raise TypeError(
                f"BatchAugmentation: family must be a registered name or a Perturbation, "
                f"got {type(family).__name__}"
            )
        self.severity = _check_severity(3 if severity is None else severity, self.family)
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(
                f"BatchAugmentation({self.family}): p must be a probability in [0, 1], got {p!r}"
            )
        self.p = float(p)
        self._base_args = {k: v for k, v in base.items() if k != "severity"}
        self.perturbation(self.severity[0])  # build one now: bad family arguments fail here
        self._params: Params | None = None

    def extra_repr(self) -> str:
        lo, hi = self.severity
        return f"{self.family!r}, severity={lo if lo == hi else (lo, hi)}, p={self.p}"

    def perturbation(self, severity: int) -> Perturbation:
        """The family's perturbation at ``severity`` (built once, with this augmentation's arguments)."""
        if severity not in self._perturbations:
            self._perturbations[severity] = family_class(self.family)(severity=severity, **self._base_args)
        return self._perturbations[severity]

    def generate_parameters(
        self, images: torch.Tensor, mask: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> Params:
        """Draw which samples to perturb, their severities and the family's params for them."""
        images, mask = self._checked(images, mask)
        b, device = images.shape[0], (generator.device if generator is not None else torch.device("cpu"))
        chosen = torch.rand(b, generator=generator, device=device) < self.p
        lo, hi = self.severity
        severity = torch.randint(lo, hi + 1, (b,), generator=generator, device=device) * chosen
        params: Params = {"batch_prob": chosen, "severity": severity}
        # a placed family's severity groups share one computation of the batch's placement maps (on an
        # accelerator one read back per call, not one or two per group); the maps of rows are the rows' own
        shared = SharedMaps(images, mask) if isinstance(self.perturbation(lo), PlacedSampling) else None
        with shared if shared is not None else contextlib.nullcontext():
            for s, idx in self._groups(params):
                x, m = shared.take(idx) if shared is not None else (_take(images, idx), _take(mask, idx))
                sub = self.perturbation(s).sample_params(x, m, generator)
                params.update({f"s{s}.{k}": v for k, v in sub.items()})
        return params

    # Kornia's name for the apply step; it shadows nn.Module.apply(fn) on purpose (public API, not renamed)
    def apply(  # type: ignore[override]
        self, images: torch.Tensor, params: Params, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Apply ``params`` (from :meth:`generate_parameters`); unselected samples are returned unchanged
        (when none is selected, ``images`` itself is returned: no copy)."""
        images, mask = self._checked(images, mask)
        groups = self._groups(params, images.shape[0])
        if not groups:
            return images
        if len(groups) == 1 and len(groups[0][1]) == images.shape[0]:  # all perturbed at one severity
            s = groups[0][0]
            return self.perturbation(s).apply_batch(images, mask, params=self._family_params(params, s))[0]
        out = images.clone()
        # a placed family's renders read the field of view of their rows: from one computation per call
        shared = (
            SharedMaps(images, mask) if isinstance(self.perturbation(groups[0][0]), PlacedSampling) else None
        )
        with shared if shared is not None else contextlib.nullcontext():
            for s, idx in groups:
                i = idx.to(images.device, non_blocking=True)
                x, m = shared.take(idx) if shared is not None else (images[i], _take(mask, i))
                done, _ = self.perturbation(s).apply_batch(x, m, params=self._family_params(params, s))
                out[i] = done.to(out.dtype)
        return out

    def forward(
        self,
        images: torch.Tensor,
        mask: torch.Tensor | None = None,
        params: Params | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Perturb a (B,C,H,W) batch; with ``params`` replay them exactly. The params used go to ``_params``."""
        if params is None:
            params = self.generate_parameters(images, mask, generator)
        out = self.apply(images, params, mask)
        self._params = params
        return out

    def _checked(
        self, images: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The whole batch checked for this family's channels (RGB or grey) before it is split by severity,
        so an error names the shape the caller passed, whichever samples the draw picked."""
        name, op = f"BatchAugmentation({self.family})", self.perturbation(self.severity[0])
        images = check_batch(images, name, rgb=op.rgb, check_range=False)
        if op.grey_only and images.shape[1] != 1:
            raise grey_error(name, f"a (B,1,H,W) batch, got shape {tuple(images.shape)}")
        return images, check_masks(mask, images, self.family)

    def _groups(self, params: Params, b: int | None = None) -> list[tuple[int, torch.Tensor]]:
        """(severity, CPU indices of the perturbed samples at that severity), in severity order."""
        for key in ("batch_prob", "severity"):
            v = params.get(key) if isinstance(params, dict) else None
            if not isinstance(v, torch.Tensor) or v.ndim != 1 or (b is not None and v.shape[0] != b):
                raise ValueError(
                    f"BatchAugmentation({self.family}): params[{key!r}] must be a tensor of shape "
                    f"(B,){'' if b is None else f' with B={b}'} as made by generate_parameters, got "
                    f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
                )
        chosen, severity = params["batch_prob"].cpu().bool(), params["severity"].cpu()
        return [
            (int(s), torch.nonzero(chosen & (severity == s)).flatten())
            for s in torch.unique(severity[chosen]).tolist()
        ]

    def _family_params(self, params: Params, s: int) -> Params:
        prefix = f"s{s}."
        sub = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
        if not sub:
            raise ValueError(
                f"BatchAugmentation({self.family}): params have no '{prefix}*' entries for the samples "
                f"of severity {s}; pass the params this augmentation produced"
            )
        return sub


@overload
def _take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor: ...
@overload
def _take(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None: ...
def _take(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    if t is None or len(idx) == t.shape[0]:  # the whole batch (indices are sorted and unique): no copy
        return t
    return t[idx.to(t.device)]
