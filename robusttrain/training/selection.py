"""Which of ``k`` scored candidates becomes an image's follow-up: the hardness control of worst-of-k.

Three rules (``SELECTIONS``), all on an (n, k) table of per-candidate losses (higher = worse for the
model), ``rejected`` candidates (occluders over the lesion) never chosen:

* ``"worst"`` — the highest loss (Engstrom et al. 2019, MaxUp 2021); with ``temperature > 0`` a sample of
  ``softmax(loss / T)`` (Gumbel-max), so near-ties do not always go to one family.
* ``"quantile"`` — the candidate at the ``quantile`` of the valid candidates' losses (0.5 = the median,
  1.0 = the worst): hard, but not always the single most destructive draw.
* ``"augmax"`` — AugMax's idea (Wang et al., NeurIPS 2021): a convex mix ``w * worst + (1 - w) * other``
  of the worst candidate and a random other valid one, ``w ~ U(0, 1)`` per image, so the follow-up is
  diverse *and* hard. (AugMax learns the mixing weights by gradient ascent; a random weight keeps the
  draw replayable from params at no extra forward.)

Every random number comes from the caller's CPU generator, drawn for all ``n`` images whatever they
turn out to need, so the stream — and the next draw — never depends on the scores.

>>> import torch
>>> s = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.2, 0.4]]); rej = torch.zeros(2, 3, dtype=torch.bool)
>>> g = torch.Generator().manual_seed(0)
>>> select(s, rej, "worst", generator=g).chosen.tolist()
[1, 2]
>>> select(s, rej, "quantile", quantile=0.5, generator=g).chosen.tolist()   # the median loss
[2, 0]
>>> a = select(s, rej, "augmax", generator=g)
>>> a.chosen.tolist(), bool((a.partner != a.chosen).all()), bool(((a.weight >= 0) & (a.weight <= 1)).all())
([1, 2], True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SELECTIONS = ("worst", "quantile", "augmax")
DEFAULT_QUANTILE = 0.75  # the quantile a sampler keeps unless told otherwise


def unused_selection_argument(k: int, selection: str, quantile: float, temperature: float) -> str | None:
    """Why one of ``selection``, ``quantile`` and ``temperature`` has no effect with the others (None: each
    one acts). An argument that is read nowhere under the others is a setting the user believes in and the
    run ignores, so the samplers refuse it; a value equal to its default is not a setting.

    >>> unused_selection_argument(1, "augmax", 0.75, 0.0)
    "selection='augmax' picks among k > 1 scored candidates; k=1 draws one candidate and scores nothing (give k > 1 or leave selection='worst')"
    >>> unused_selection_argument(4, "quantile", 0.5, 0.0) is None
    True
    """
    if k == 1 and selection != "worst":
        return (
            f"selection={selection!r} picks among k > 1 scored candidates; k=1 draws one candidate and "
            "scores nothing (give k > 1 or leave selection='worst')"
        )
    if k == 1 and temperature > 0:
        return (
            f"temperature={temperature!r} samples among k > 1 scored candidates; k=1 draws one candidate "
            "and scores nothing (give k > 1 or temperature=0)"
        )
    if selection == "quantile" and temperature > 0:
        return (
            f"temperature={temperature!r} has no effect with selection='quantile' (it keeps a loss quantile, "
            "samples nothing); use selection='worst' or 'augmax', or temperature=0"
        )
    if selection != "quantile" and quantile != DEFAULT_QUANTILE:
        return (
            f"quantile={quantile!r} is read only with selection='quantile' (here selection={selection!r}); "
            f"set selection='quantile' or leave quantile at {DEFAULT_QUANTILE}"
        )
    return None


def mix_pair(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """AugMax's follow-up: ``weight * a + (1 - weight) * b`` per image (``weight`` (n,))."""
    w = weight.to(a.dtype).view((-1,) + (1,) * (a.ndim - 1))
    return w * a + (1 - w) * b


@dataclass
class Selection:
    """``chosen`` (n,) kept candidate (-1: every candidate rejected, the image stays clean); for
    ``"augmax"``, ``partner`` (n,) the candidate mixed in and ``weight`` (n,) the worst one's share."""

    chosen: torch.Tensor
    partner: torch.Tensor | None = None
    weight: torch.Tensor | None = None


def select(
    scores: torch.Tensor,
    rejected: torch.Tensor,
    how: str = "worst",
    *,
    quantile: float = 0.75,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Selection:
    """Pick each row's follow-up among ``scores`` (n, k) by rule ``how`` (module doc)."""
    if how not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {how!r}")
    n, k = scores.shape
    dev = scores.device
    valid = ~rejected
    none_valid = ~valid.any(1)
    key = scores.float()
    if temperature > 0 and how != "quantile":  # Gumbel-max, drawn on the CPU stream
        u = torch.rand(n, k, generator=generator).clamp_(1e-12, 1 - 1e-12).to(dev)
        key = key / temperature - torch.log(-torch.log(u))
    if how == "quantile":
        ranked = key.masked_fill(rejected, float("inf")).argsort(dim=1, stable=True)  # valid first, ascending
        m = valid.sum(1)
        pos = (quantile * (m - 1).clamp_min(0).float()).round().long()
        chosen = ranked.gather(1, pos.view(-1, 1)).view(-1)
    else:
        chosen = key.masked_fill(rejected, float("-inf")).argmax(1)
    chosen = torch.where(none_valid, torch.full_like(chosen, -1), chosen)
    if how != "augmax":
        return Selection(chosen)
    # a random valid candidate other than the worst (the worst itself when it is the only valid one)
    u = torch.rand(n, k, generator=generator).to(dev)
    others = valid.clone()
    others[torch.arange(n, device=dev), chosen.clamp_min(0)] = False
    partner = u.masked_fill(~others, -1.0).argmax(1)
    partner = torch.where(others.any(1), partner, chosen)
    weight = torch.rand(n, generator=generator).to(dev)
    return Selection(chosen, partner, weight)
