"""Perturbation suites by modality: the families a metamorphic check runs when given a suite name.

``"endoscopy"`` is the nine MedTest families (RGB endoscopy video); ``"mri"`` and ``"xray"`` are the
single-channel suites — each family there applies to grey images, so on a 1-channel dataset every one
of them runs (only ``contrast`` and ``blur`` of the endoscopy suite do). ``"shift"`` holds the
distribution-shift training families (``randconv``, ``fourier_mix``) and ``"endoscopy_heldout"`` the
endoscopy artifacts kept out of training for a held-out-family test (camera, codec and optics).

>>> resolve("mri")[:3]
['bias_field', 'ghosting', 'gibbs']
>>> resolve(["xray", "motion_blur"])[-1]
'motion_blur'
"""

from __future__ import annotations

from collections.abc import Iterable

from .registry import available

SUITES: dict[str, tuple[str, ...]] = {
    "endoscopy": (
        "saturation",
        "contrast",
        "white_balance",
        "specularity",
        "blur",
        "instrument",
        "feces",
        "blood",
        "text",
    ),
    "mri": ("bias_field", "ghosting", "gibbs", "spike", "rician_noise", "gamma", "blur", "contrast"),
    "xray": ("quantum_noise", "exposure", "blur", "xray_markers", "collimation", "contrast"),
    # distribution-shift augmentations for training (GIN / RandConv, FDA / FACT): no clinical artifact
    "shift": ("randconv", "fourier_mix"),
    # endoscopy artifacts outside the "endoscopy" suite: held-out families for a robustness test that no
    # training condition draws (Evidence v4)
    "endoscopy_heldout": (
        "motion_blur",
        "gamma",
        "exposure",
        "sensor_noise",
        "jpeg",
        "defocus",
        "vignetting",
    ),
}


def suite_names() -> list[str]:
    """Valid suite names."""
    return list(SUITES)


def resolve(spec: str | Iterable[str]) -> list[str]:
    """Family names for a suite name (``"mri"``) or a list of family and/or suite names (expanded in
    order, duplicates dropped). Raises ValueError naming the unknown entry and the valid choices."""
    items = [spec] if isinstance(spec, str) else list(spec)
    known = set(available())
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"perturbations: expected a suite name or family names (str), got {item!r}")
        if item in SUITES:
            names = SUITES[item]
        elif item in known:
            names = (item,)
        elif isinstance(spec, str):
            raise ValueError(
                f"unknown perturbation suite {item!r}; valid suites: {', '.join(SUITES)} "
                f"(or a list of family names: {', '.join(sorted(known))})"
            )
        else:
            raise ValueError(
                f"unknown perturbation {item!r}; valid families: {', '.join(sorted(known))}; "
                f"valid suites: {', '.join(SUITES)}"
            )
        out.extend(n for n in names if n not in out)
    if not out:
        raise ValueError(f"perturbations: empty list; give a suite ({', '.join(SUITES)}) or family names")
    return out
