"""Let a torchvision built for another torch import, only when it would otherwise break every import.

torchmetrics (and so Lightning) imports torchvision whenever it is installed; a torchvision whose compiled
ops were built for another torch (the registry's CUDA torchvision 0.28 beside a CPU torch 2.13, as the
optional ``robusttrain[smp]`` extra can leave it) then fails with ``operator torchvision::nms does not
exist``, and with it ``import lightning``. Only in that case, and said once in a warning, :func:`ensure`
declares the ``torchvision::nms`` / ``qnms`` op schemas with ``torch.library`` so torchvision's Python side
imports; those detection ops stay without a kernel (segmentation encoders never call them). Nothing happens
when torchvision is not installed or imports normally. Runs from ``robusttrain/__init__.py``, before any
module imports torchmetrics.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any

_declared: list[Any] = []  # the torch.library handle that keeps the declared schemas alive


def _declare_ops() -> None:
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _declared.append(lib)


def ensure() -> bool:
    """Import torchvision if it is installed; True when the workaround was needed (and applied)."""
    if "torchvision" in sys.modules or _declared or importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401

        return False
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        why = str(e).strip().splitlines()[0]
    for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        del sys.modules[name]  # what the failed import left half-initialised
    _declare_ops()
    import torchvision  # noqa: F401,F811

    warnings.warn(
        f"robusttrain: the installed torchvision does not match this torch ({why}); declared its "
        "torchvision::nms / qnms op schemas so it imports (its detection ops stay unavailable; segmentation "
        "encoders do not use them). Install the torchvision built for your torch to silence this.",
        stacklevel=2,
    )
    return True
