"""Online worst-of-k perturbation: for a fraction ``q`` of a batch, draw ``k`` candidate (family,
severity, params) per image, score them with the current model and keep the worst.

Training on the worst of k random transformations beats training on one at the same dose (Engstrom
et al. ICML 2019; MaxUp, CVPR 2021): it spends the augmentation budget where the model is weak now,
not where it was weak when a failure was mined. Pure torch, any device; Lightning glue is
:class:`robusttrain.callbacks.MetamorphicTraining`.

What is drawn, per selected image and candidate:

* the family from ``(1 - epsilon) * w + epsilon * uniform``, ``w`` the per-family violation rates
  the metamorphic check measured (uniform before the first check): the check steers the dose, the
  epsilon floor keeps every family in play so one family cannot take over;
* the severity uniformly in ``1..cap`` (the family's learnability cap, below);
* the family's params from its own sampler (any family of the registry, its own constructor
  defaults), on a CPU generator seeded by ``(seed, step, rank)``: the same images on every device,
  under any load, after a resume.

``k == 1`` draws one candidate and never scores it: exactly random augmentation with the same
families, severities and dose (the ablation knob). With ``temperature > 0`` the kept candidate is
sampled with probability ``softmax(loss / temperature)`` (Gumbel-max on the generator) instead of
the arg-max, so near-ties do not always go to one family.

**Learnability** (never train on what cannot be learned): an occluding family (``instrument``,
``feces``, ``blood``, ``text``, ``xray_markers``, ``collimation``) whose candidate changes more than
``max_cover`` (default 10 %) of the lesion's pixels is rejected (it can never be chosen; if every
candidate of an image is rejected the image stays clean), and severities are capped per family
(``severity_caps``; default: the highest severity the run's metamorphic check tests, so training
never goes beyond what is measured and severity 5 stays an extrapolation test).

>>> import torch
>>> wok = WorstOfK(["contrast", "blur"], k=3, q=0.5, seed=0)
>>> x = torch.rand(4, 3, 32, 32); m = torch.zeros(4, 32, 32, dtype=torch.long); m[:, 8:16, 8:16] = 1
>>> score = lambda imgs, masks: (imgs - 0.5).abs().mean((1, 2, 3))   # any per-sample loss
>>> f = wok(x, m, score, step=0)
>>> f.index.tolist(), f.images.shape, f.scores.shape
([0, 2], torch.Size([2, 3, 32, 32]), torch.Size([2, 3]))
>>> bool(torch.equal(f.replay(x, m), f.images))                       # every follow-up re-created
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from robusttrain.metamorphic.suite import slices_to_volume, stable_seed, volume_to_slices
from robusttrain.perturbations import get
from robusttrain.perturbations.base import FamilyParams
from robusttrain.perturbations.placement import SharedMaps

OCCLUDERS = frozenset({"instrument", "feces", "blood", "text", "xray_markers", "collimation"})
# a pixel counts as covered when any channel moved by more than this (8-bit quantisation is 1/255)
_COVER_DELTA = 2.0 / 255.0

Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Followups:
    """The follow-ups of one batch: which positions, their images, and how to re-create them.

    ``index`` (n,) batch positions; ``images`` (n, C, ...) the kept follow-ups (a rejected image is its
    clean self); ``families`` / ``severities`` (n, k) every candidate drawn; ``params`` n x k dicts of
    CPU tensors (leading dim 1), replayable with ``get(family, severity).apply_batch(x, m, params=p)``;
    ``chosen`` (n,) the kept candidate (on the images' device; -1 = none, the clean image);
    ``scores`` (n, k) the candidates' losses (None for k == 1; -inf = rejected).
    """

    index: torch.Tensor
    images: torch.Tensor
    families: list[list[str]]
    severities: list[list[int]]
    params: list[list[dict[str, torch.Tensor]]]
    chosen: torch.Tensor
    scores: torch.Tensor | None = None
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.numel())

    def kept(self) -> list[tuple[str, int, dict[str, torch.Tensor]] | None]:
        """Per follow-up: (family, severity, params) of the kept candidate, None if it stayed clean.
        Reads ``chosen`` on the host: call it when recording, not inside the step."""
        out: list[tuple[str, int, dict[str, torch.Tensor]] | None] = []
        for i, j in enumerate(self.chosen.tolist()):
            out.append(None if j < 0 else (self.families[i][j], self.severities[i][j], self.params[i][j]))
        return out

    def replay(self, images: torch.Tensor, masks: torch.Tensor | None, slice_axis: int = -1) -> torch.Tensor:
        """Re-create :attr:`images` from the clean batch and the recorded params (exact)."""
        out = images[self.index].clone()
        by_family: dict[str, list[tuple[int, int, dict[str, torch.Tensor]]]] = {}
        for i, rec in enumerate(self.kept()):
            if rec is not None:
                by_family.setdefault(rec[0], []).append((i, rec[1], rec[2]))
        for fam, items in by_family.items():  # one call per family, as drawn
            at = [i for i, _, _ in items]
            pos = self.index[torch.tensor(at, device=self.index.device)]
            sev = torch.tensor([s for _, s, _ in items])
            groups = _stacked([(r, s, p) for r, (_, s, p) in enumerate(items)])
            m = None if masks is None else masks[pos]
            y, _ = _apply_family(get(fam), images[pos], m, sev, groups, slice_axis)
            out[torch.tensor(at, device=out.device)] = y
        return out


class WorstOfK:
    """Draw, score and keep the worst of ``k`` perturbations for a fraction ``q`` of a batch (module doc).

    Args:
        families: registered perturbation families to draw from.
        k: candidates per image (1: random augmentation, nothing scored).
        q: fraction of each batch that gets a follow-up (rounded; at least one image when q > 0).
        epsilon: floor of the uniform share in the family choice, in [0, 1].
        temperature: 0 keeps the worst candidate; > 0 samples by ``softmax(loss / temperature)``.
        severity_caps: highest severity per family (default 5 for every family); an int caps all.
        max_cover: largest fraction of lesion pixels an occluding family may change.
        seed: with the step and rank, seeds every draw.
        slice_axis: volumes (B,C,H,W,D) are perturbed slice-wise along it, one draw per volume.
    """

    def __init__(
        self,
        families: Sequence[str],
        k: int = 4,
        q: float = 0.5,
        epsilon: float = 0.3,
        temperature: float = 0.0,
        severity_caps: int | Mapping[str, int] | None = None,
        max_cover: float = 0.1,
        seed: int = 0,
        slice_axis: int = -1,
    ):
        self.families = list(dict.fromkeys(families))
        if not self.families:
            raise ValueError("WorstOfK: families is empty; give at least one perturbation family")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"WorstOfK: k must be an integer >= 1 (1 = random augmentation), got {k!r}")
        if not 0.0 <= float(q) <= 1.0:
            raise ValueError(f"WorstOfK: q must be a fraction of the batch in [0, 1], got {q!r}")
        if not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"WorstOfK: epsilon must be in [0, 1], got {epsilon!r}")
        if float(temperature) < 0:
            raise ValueError(f"WorstOfK: temperature must be >= 0 (0 = keep the worst), got {temperature!r}")
        if not 0.0 <= float(max_cover) <= 1.0:
            raise ValueError(f"WorstOfK: max_cover must be a fraction in [0, 1], got {max_cover!r}")
        self.k, self.q, self.epsilon = int(k), float(q), float(epsilon)
        self.temperature, self.max_cover = float(temperature), float(max_cover)
        self.seed, self.slice_axis = int(seed), int(slice_axis)
        self.caps = _caps(self.families, severity_caps)
        self._ops: dict[tuple[str, int], Any] = {}

    def family_probs(self, rates: Mapping[str, float] | None = None) -> np.ndarray:
        """``(1 - epsilon) * w + epsilon * uniform`` over :attr:`families` (``w``: ``rates`` normalised;
        uniform when there are none or all are 0).

        >>> WorstOfK(["blur", "contrast"], epsilon=0.5).family_probs({"blur": 0.3, "contrast": 0.1}).tolist()
        [0.625, 0.375]
        """
        n = len(self.families)
        uniform = np.full(n, 1.0 / n)
        w = np.array([max(0.0, float((rates or {}).get(f, 0.0))) for f in self.families])
        if not np.isfinite(w).all() or w.sum() <= 0:
            return uniform
        return (1 - self.epsilon) * w / w.sum() + self.epsilon * uniform

    def n_selected(self, batch: int) -> int:
        return 0 if self.q <= 0 else min(batch, max(1, int(round(self.q * batch))))

    def generator(self, step: int, rank: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(stable_seed(self.seed, "worst_of_k", int(step), int(rank)))

    def __call__(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        score: Score | None,
        *,
        step: int,
        rank: int = 0,
        rates: Mapping[str, float] | None = None,
    ) -> Followups:
        """Follow-ups for ``images`` (B,C,H,W[,D]) in [0,1] with ``masks`` (B,H,W[,D]) class indices.

        ``score(candidates, masks) -> (n,)`` per-sample losses (higher = worse for the model), called
        once on all n x k candidates (never for k == 1); the caller sets eval mode / no_grad.
        """
        g = self.generator(step, rank)
        b = images.shape[0]
        n = self.n_selected(b)
        index = torch.randperm(b, generator=g)[:n].sort().values
        probs = torch.as_tensor(self.family_probs(rates), dtype=torch.float64)
        fam_idx = (
            torch.multinomial(probs, n * self.k, replacement=True, generator=g).view(n, self.k)
            if n
            else torch.zeros(0, self.k, dtype=torch.long)
        )
        caps = torch.tensor([self.caps[f] for f in self.families])
        sev = (torch.rand(n, self.k, generator=g) * caps[fam_idx]).long() + 1
        families = [[self.families[int(j)] for j in row] for row in fam_idx]
        severities = sev.tolist()
        dev_index = index.to(images.device)
        src = images[dev_index]
        src_m = None if masks is None else masks[dev_index]
        cand, params = self._draw_candidates(src, src_m, families, sev, g)
        rejected = self._rejected(src, src_m, cand, families)
        scores = None
        if self.k == 1:
            chosen = torch.zeros(n, dtype=torch.long, device=images.device)
        else:
            flat = cand.reshape(n * self.k, *cand.shape[2:])
            fm = None if src_m is None else src_m.repeat_interleave(self.k, 0)
            scores = score(flat, fm).reshape(n, self.k).float() if n else torch.zeros(0, self.k)
            scores = scores.to(images.device)
            key = scores
            if self.temperature > 0:  # Gumbel-max: a sample of softmax(loss / T), drawn on the CPU stream
                u = torch.rand(n, self.k, generator=g).clamp_(1e-12, 1 - 1e-12).to(images.device)
                key = scores / self.temperature - torch.log(-torch.log(u))
            chosen = key.masked_fill(rejected, float("-inf")).argmax(1)
            scores = scores.masked_fill(rejected, float("-inf"))
        ok = ~rejected.gather(1, chosen.view(-1, 1)).view(-1)
        kept = cand[torch.arange(n, device=images.device), chosen]
        shape = (-1,) + (1,) * (src.ndim - 1)
        kept = torch.where(ok.view(shape), kept, src)
        chosen = torch.where(ok, chosen, torch.full_like(chosen, -1))
        return Followups(
            index=dev_index,
            images=kept,
            families=families,
            severities=severities,
            params=params,
            chosen=chosen,
            scores=scores,
            step=int(step),
            extra={"rejected": rejected},
        )

    # -- internals ---------------------------------------------------------------------
    def _op(self, family: str, severity: int) -> Any:
        key = (family, severity)
        if key not in self._ops:
            self._ops[key] = get(family, severity)
        return self._ops[key]

    def _draw_candidates(
        self,
        src: torch.Tensor,
        src_m: torch.Tensor | None,
        families: list[list[str]],
        sev: torch.Tensor,
        g: torch.Generator,
    ) -> tuple[torch.Tensor, list[list[dict[str, torch.Tensor]]]]:
        """The (n, k, C, ...) candidates and their n x k params: ONE batched call per family drawn, with the
        candidates' severities (``sev``, (n, k) on the CPU) as a per-row tensor, families in order of first
        appearance (row-major over (image, candidate)); per-row params come back to the host once per family."""
        n = src.shape[0]
        cand = src.unsqueeze(1).repeat(1, self.k, *([1] * (src.ndim - 1)))  # (n, k, C, ...)
        params: list[list[dict[str, torch.Tensor]]] = [[{} for _ in range(self.k)] for _ in range(n)]
        members: dict[str, list[int]] = {}
        for i in range(n):
            for j in range(self.k):
                members.setdefault(families[i][j], []).append(i * self.k + j)
        flat_sev = sev.reshape(-1)
        shared = SharedMaps(src, src_m) if src.ndim == 4 else None  # one field-of-view step per call
        with shared if shared is not None else contextlib.nullcontext():
            for fam, flat in members.items():
                rows = torch.tensor([f // self.k for f in flat])
                if shared is not None:
                    x, m = shared.take(rows)
                else:
                    x, m = src[rows.to(src.device)], None if src_m is None else src_m[rows.to(src.device)]
                op = self._op(fam, self.caps[fam])
                out, groups = _apply_family(op, x, m, flat_sev[flat], None, self.slice_axis, g)
                self._record(cand, params, flat, out, groups)
        return cand, params

    def _record(
        self,
        cand: torch.Tensor,
        params: list[list[dict[str, torch.Tensor]]],
        flat: list[int],
        out: torch.Tensor,
        groups: FamilyParams,
    ) -> None:
        """Scatter one family's candidates into ``cand`` and their params into ``params`` (host views)."""
        n = cand.shape[0]
        idx = torch.tensor(flat, device=cand.device)
        cand.view(n * self.k, *cand.shape[2:])[idx] = out  # one scatter per family
        for grows, p in groups:  # one device->host copy and one split per key and group, not per candidate
            rows = [
                dict(zip(p, per))
                for per in zip(*((v.detach() if v.requires_grad else v).cpu().split(1) for v in p.values()))
            ]
            for at, row in zip(grows.tolist(), rows):
                f = flat[at]
                params[f // self.k][f % self.k] = row

    def _rejected(
        self, src: torch.Tensor, masks: torch.Tensor | None, cand: torch.Tensor, families: list[list[str]]
    ) -> torch.Tensor:
        """(n, k) bool: occluding candidates that change more than ``max_cover`` of the lesion."""
        n = src.shape[0]
        out = torch.zeros(n, self.k, dtype=torch.bool, device=src.device)
        occl = torch.tensor([[f in OCCLUDERS for f in row] for row in families], dtype=torch.bool)
        if masks is None or not bool(occl.any()):
            return out
        lesion = (masks > 0).unsqueeze(1)  # (n, 1, ...)
        moved = (cand - src.unsqueeze(1)).abs().amax(2) > _COVER_DELTA  # (n, k, ...)
        covered = (moved & lesion).flatten(2).sum(2).float()
        area = lesion.flatten(2).sum(2).float().clamp_min(1)
        return (covered / area > self.max_cover) & occl.to(src.device)


def _apply(
    op: Any, x: torch.Tensor, m: torch.Tensor | None, params: dict[str, torch.Tensor], slice_axis: int = -1
) -> torch.Tensor:
    """``op`` with recorded ``params`` on images or (slice-wise, the volume's params on every slice) volumes."""
    if x.ndim == 5:
        n_sl = x.shape[2 + slice_axis % 3]
        flat = volume_to_slices(x, slice_axis)
        fm = None if m is None else volume_to_slices(m, slice_axis, channels=False)
        rep = {k: v.to(x.device).repeat_interleave(n_sl, 0) for k, v in params.items()}
        out, _ = op.apply_batch(flat, fm, params=rep)
        return slices_to_volume(out.to(x.dtype), x.shape[0], slice_axis)
    out, _ = op.apply_batch(x, m, params={k: v.to(x.device) for k, v in params.items()})
    return out.to(x.dtype)


def _apply_family(
    op: Any,
    x: torch.Tensor,
    m: torch.Tensor | None,
    sev: torch.Tensor,
    groups: FamilyParams | None,
    slice_axis: int = -1,
    g: torch.Generator | None = None,
) -> tuple[torch.Tensor, FamilyParams]:
    """``op``'s family on rows with their own severities ``sev`` (CPU), sampling (``groups`` None, from ``g``)
    or replaying ``groups``; volumes (B,C,H,W,D): params drawn on each volume's middle slice, every slice
    perturbed with its volume's params."""
    if x.ndim != 5:
        out, groups = op.apply_family(x, m, sev, generator=g, params=groups)
        return out.to(x.dtype), groups
    n_sl = x.shape[2 + slice_axis % 3]
    flat = volume_to_slices(x, slice_axis)
    fm = None if m is None else volume_to_slices(m, slice_axis, channels=False)
    if groups is None:
        j = n_sl // 2
        groups = op.sample_family(flat[j::n_sl], None if fm is None else fm[j::n_sl], sev, g)
    steps = torch.arange(n_sl)
    per_slice = [
        ((rows[:, None] * n_sl + steps).reshape(-1), {k: v.repeat_interleave(n_sl, 0) for k, v in p.items()})
        for rows, p in groups
    ]
    out, _ = op.apply_family(flat, fm, sev.repeat_interleave(n_sl), params=per_slice)
    return slices_to_volume(out.to(x.dtype), x.shape[0], slice_axis), groups


def _stacked(items: list[tuple[int, int, dict[str, torch.Tensor]]]) -> FamilyParams:
    """Per-row params (leading dim 1) as one group per severity, rows in order of first appearance
    (``apply_family`` merges them into one call for a family that batches severities)."""
    by_sev: dict[int, list[tuple[int, dict[str, torch.Tensor]]]] = {}
    for r, s, p in items:
        by_sev.setdefault(s, []).append((r, p))
    return [
        (torch.tensor([r for r, _ in rows]), {k: torch.cat([p[k] for _, p in rows]) for k in rows[0][1]})
        for rows in by_sev.values()
    ]


def _caps(families: list[str], caps: int | Mapping[str, int] | None) -> dict[str, int]:
    def ok(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 1 <= int(v) <= 5

    if caps is None:
        return {f: 5 for f in families}
    if ok(caps):
        return {f: int(caps) for f in families}  # type: ignore[arg-type]
    if not isinstance(caps, Mapping):
        raise ValueError(
            f"WorstOfK: severity_caps must be an int 1..5 or a mapping family -> 1..5, got {caps!r}"
        )
    bad = {f: v for f, v in caps.items() if not ok(v)}
    if bad:
        raise ValueError(f"WorstOfK: severity_caps values must be integers 1..5, got {bad}")
    return {f: int(caps.get(f, 5)) for f in families}


def scaled_for_scoring(
    images: torch.Tensor, masks: torch.Tensor | None, scale: float, multiple: int = 16
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Candidates at ``scale`` of their size for the scoring forward (area-averaged images, nearest
    masks) when the scaled size stays a multiple of ``multiple`` and at least twice it (a U-Net
    downsamples 4x by 2 and instance norm needs more than one pixel at the bottom); else as is.

    >>> x, m = torch.rand(2, 3, 64, 64), torch.zeros(2, 64, 64, dtype=torch.long)
    >>> [t.shape[-1] for t in scaled_for_scoring(x, m, 0.5)], scaled_for_scoring(x, m, 0.5, 48)[0].shape[-1]
    ([32, 32], 64)
    >>> scaled_for_scoring(torch.rand(1, 3, 32, 32), None, 0.5)[0].shape[-1]   # 16 px would be too small
    32
    """
    if scale >= 1.0 or images.ndim != 4:
        return images, masks
    h, w = images.shape[-2:]
    sh, sw = h * scale, w * scale
    if (
        sh != int(sh)
        or sw != int(sw)
        or int(sh) % multiple
        or int(sw) % multiple
        or min(sh, sw) < 2 * multiple
    ):
        return images, masks
    size = (int(sh), int(sw))
    x = F.interpolate(images, size=size, mode="area")
    m = (
        None
        if masks is None
        else F.interpolate(masks[:, None].float(), size=size, mode="nearest")[:, 0].long()
    )
    return x, m
