"""Failure-steered draws: a share ``steer`` of the random augmentation's follow-ups takes its perturbation
from the failure conditions the check found (:class:`~robusttrain.mining.conditions.ConditionBank`),
applied to the image the data stream brought -- no image is replayed, the perturbed share is unchanged.

Per batch, after the random augmentation drew its follow-ups (:class:`~robusttrain.training.WorstOfK`,
``k=1``), each follow-up is *steered* with probability ``steer`` (on a generator of its own seeded by
``(seed, "steer", step, rank)``: the random draws of the other rows are exactly the unsteered run's).
A steered row draws a condition (family in proportion to what fails, with a per-family balance; then a
condition of it in proportion to its weight), takes the condition's severity (capped at the family's
training cap), draws fresh params for this image from the family's own sampler and, for a placed family,
moves the artifact to the condition's place relative to the lesion (:func:`~robusttrain.mining.conditions.target_centre`,
jittered by ``jitter``): its centre (pasted objects, specular spots as a cluster) or its corner (overlay
text). An occluder that then changes more than ``max_cover`` of the lesion keeps the row clean, as for any
draw. With no condition of a trained family the follow-ups are returned untouched and nothing is drawn,
so an empty bank trains exactly as the random augmentation.

The returned :class:`~robusttrain.training.worst_of_k.Followups` carries the steered rows' recipes (family,
severity, the moved params), so :func:`~robusttrain.training.recreate_followup` re-creates each one exactly,
and ``extra["steered"]`` marks them.

>>> import torch
>>> from robusttrain.mining.conditions import ConditionBank
>>> from robusttrain.training import WorstOfK
>>> bank = ConditionBank()
>>> bank.conditions = {"c|instrument|3": {"family": "instrument", "severity": 3, "weight": 1.0,
...                    "placement": {"abs": [0.2, 0.8], "rel": [0.0, 1.5]}, "params": {}}}
>>> wok = WorstOfK(["blur", "instrument"], k=1, q=1.0, seed=0)
>>> x = torch.full((4, 3, 64, 64), 0.5); m = torch.zeros(4, 64, 64, dtype=torch.long); m[:, 24:40, 8:24] = 1
>>> fol = wok(x, m, None, step=0)
>>> out = SteeredDraws(steer=1.0, jitter=0.0, seed=0)(fol, x, m, bank, wok, step=0)
>>> out.extra["steered"], [f[0] for f in out.families]
([True, True, True, True], ['instrument', 'instrument', 'instrument', 'instrument'])
>>> [round(float(p[0]["center_rel"][0, 1]), 2) for p in out.params][:2]   # 1.5 lesion widths right of it
[0.62, 0.62]
>>> bool(torch.equal(out.replay(x, m), out.images))                   # every steered follow-up re-created
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from robusttrain.metamorphic.suite import stable_seed
from robusttrain.mining.conditions import ConditionBank, lesion_anchor, target_centre
from robusttrain.perturbations.base import on_device
from robusttrain.validate import check_fraction, check_int

from .worst_of_k import Followups, WorstOfK, _apply_family

_CPU = torch.device("cpu")


@dataclass
class Steering:
    """What FailureMiningCallback(mode="steer") shares with MetamorphicTraining through the context: the
    condition ``bank`` (kept current on every rank), the ``steer`` share and placement ``jitter``, and the
    ``counts`` MetamorphicTraining adds per epoch: ``[steered rows, follow-up rows]``."""

    bank: ConditionBank
    steer: float
    jitter: float
    counts: dict[int, list[int]] = field(default_factory=dict)

    def count(self, epoch: int, fol: Followups) -> None:
        c = self.counts.setdefault(int(epoch), [0, 0])
        c[0] += sum(bool(s) for s in fol.extra.get("steered", ()))
        c[1] += len(fol)


class SteeredDraws:
    """Steer a share ``steer`` of the random follow-ups to the failure conditions (module doc).

    Args:
        steer: share of the follow-ups (the perturbed samples) drawn from the conditions, in [0, 1].
        jitter: std of the placement's move, as a fraction of the image side, in [0, 1].
        seed: with the step and rank, seeds every steered draw.

    Raises:
        ValueError: a bad argument, named in one line.
    """

    def __init__(self, steer: float = 0.5, jitter: float = 0.05, seed: int = 0):
        self.steer = check_fraction("steer", steer)
        self.jitter = check_fraction("jitter", jitter)
        self.seed = check_int("seed", seed, None)

    def __call__(
        self,
        fol: Followups,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        bank: ConditionBank | None,
        wok: WorstOfK,
        *,
        step: int,
        rank: int = 0,
    ) -> Followups:
        """``fol`` (``wok``'s k=1 follow-ups of ``images``) with a share ``steer`` of its rows redrawn from
        ``bank``'s conditions of ``wok``'s families; ``fol`` itself when there is nothing to steer."""
        n = len(fol)
        if bank is None or self.steer <= 0 or n == 0 or not bank.usable(wok.families):
            return fol
        if any(len(row) != 1 for row in fol.families) or fol.chains is not None:
            raise ValueError("SteeredDraws: steering replaces random draws (k=1, no chains)")
        rng = np.random.default_rng(stable_seed(self.seed, "steer", int(step), int(rank)))
        steered = (rng.random(n) < self.steer).tolist()
        if not any(steered):
            return _marked(fol, steered)
        kept = fol.images.clone()
        families = [list(r) for r in fol.families]
        severities = [list(r) for r in fol.severities]
        params: list[list[dict[str, torch.Tensor]]] = [list(r) for r in fol.params]
        applied = [list(r) for r in (fol.applied or [[s] for s in (row[0] for row in fol.severities)])]
        chosen = fol.chosen.clone()
        positions = fol.index.tolist()
        for i, pos in enumerate(positions):
            if not steered[i]:
                continue
            cond = bank.draw(rng, wok.families)
            assert cond is not None  # usable() was non-empty
            fam = cond["family"]
            sev = min(int(cond["severity"]), wok.caps[fam])
            x = images[pos : pos + 1]
            m = None if masks is None else masks[pos : pos + 1]
            g = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
            op = wok._op(fam, sev)
            at = np.asarray([sev], dtype=np.int64)
            _, groups = _apply_family(op, x, m, at, None, wok.slice_axis, g)
            p = {k: on_device(v.detach(), _CPU).clone() for k, v in groups[0][1].items()}
            # a volume's artifact goes where the failure's went in the image plane (no lesion anchor)
            anchor = None if m is None or x.ndim != 4 else lesion_anchor(on_device(m, _CPU).numpy())
            _place(p, cond.get("placement"), anchor, self.jitter, rng)
            out, _ = _apply_family(
                op,
                x,
                m,
                at,
                [(torch.tensor([0]), {k: on_device(v, x.device) for k, v in p.items()})],
                wok.slice_axis,
            )
            rejected = bool(wok._rejected(x, m, out.unsqueeze(1), [[fam]])[0, 0])
            kept[i] = x[0] if rejected else out[0].to(kept.dtype)
            chosen[i] = -1 if rejected else 0
            families[i], severities[i], params[i], applied[i] = [fam], [sev], [p], [sev]
        return replace(
            fol,
            images=kept,
            families=families,
            severities=severities,
            params=params,
            chosen=chosen,
            extra={**fol.extra, "steered": steered},
            applied=applied,
        )


def _marked(fol: Followups, steered: list[bool]) -> Followups:
    fol.extra = {**fol.extra, "steered": steered}
    return fol


def _place(
    p: dict[str, torch.Tensor],
    placement: dict[str, Any] | None,
    anchor: dict[str, Any] | None,
    jitter: float,
    rng: np.random.Generator,
) -> None:
    """Move the fresh params ``p`` (one row) to ``placement`` on an image whose lesion is ``anchor``."""
    if not placement:
        return
    if "corner" in placement and "corner" in p:
        c = torch.as_tensor(placement["corner"], dtype=p["corner"].dtype)
        if c.numel() == p["corner"].numel():
            p["corner"] = c.reshape(p["corner"].shape)
        return
    target = target_centre(placement, anchor, jitter, rng)
    if target is None or "center_rel" not in p:
        return
    c = p["center_rel"]
    t = torch.as_tensor(target, dtype=c.dtype)
    if c.ndim == 2:  # one object per row: its centre
        p["center_rel"] = t.reshape(1, 2).clone()
        if "visible" in p:  # the render cuts it off the lesion itself; it was placed on purpose
            p["visible"] = torch.ones_like(p["visible"])
        return
    # a cluster of spots (1, S, 2): moved as a whole so the drawn spots' centre lands on the target
    used = p["strength"].reshape(-1) > 0 if "strength" in p else torch.ones(c.shape[1], dtype=torch.bool)
    if not bool(used.any()):
        return
    shift = t - c[0, used].mean(0)
    p["center_rel"] = (c + shift).clamp(0.0, 1.0)
