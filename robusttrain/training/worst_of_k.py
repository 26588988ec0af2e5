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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from robusttrain.metamorphic.suite import slices_to_volume, stable_seed, volume_to_slices
from robusttrain.perturbations import available, get, occluding
from robusttrain.perturbations.base import FamilyParams, all_rows, host_params, on_device, with_host
from robusttrain.perturbations.placement import SharedMaps

from .chains import LABEL as CHAIN_LABEL
from .chains import ChainSampler, chain_families, recreate, unused_chain_argument
from .selection import SELECTIONS, Selection, mix_pair, unused_selection_argument
from .selection import select as select_candidates

OCCLUDERS = frozenset(occluding())  # families whose class sets the ``occludes`` trait
# a pixel counts as covered when any channel moved by more than this (8-bit quantisation is 1/255)
_COVER_DELTA = 2.0 / 255.0

Score = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class LazyParams(Sequence[list[dict[str, torch.Tensor]]]):
    """The n x k per-candidate params of a draw, split from each family call's batched params on first
    access. Splitting is one op per key and family (and a device->host copy): done in the draw, it cost
    ~50 launches a step for params that are read only on the steps that record follow-ups."""

    def __init__(self, n: int, k: int, parts: list[tuple[list[int], FamilyParams]]):
        self._n, self._k, self._parts = n, k, parts
        self._rows: list[list[dict[str, torch.Tensor]]] | None = None

    def _materialised(self) -> list[list[dict[str, torch.Tensor]]]:
        if self._rows is None:
            rows: list[list[dict[str, torch.Tensor]]] = [[{} for _ in range(self._k)] for _ in range(self._n)]
            for flat, groups in self._parts:
                _split_params(rows, flat, groups, self._k)
            self._rows, self._parts = rows, []
        return self._rows

    def __getitem__(self, i):  # type: ignore[override]
        return self._materialised()[i]

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(self._materialised())


def _split_params(
    params: list[list[dict[str, torch.Tensor]]], flat: list[int], groups: FamilyParams, k: int
) -> None:
    """One family's batched params into per-candidate host views (``flat``: its candidates, row-major over
    (image, candidate)): one device->host copy and one split per key and group, not per candidate."""
    cpu = torch.device("cpu")
    for grows, p in groups:
        per_key = (on_device(v.detach() if v.requires_grad else v, cpu).split(1) for v in p.values())
        for at, per in zip(grows.tolist(), zip(*per_key)):
            f = flat[at]
            params[f // k][f % k] = dict(zip(p, per))


@dataclass
class Followups:
    """The follow-ups of one batch: which positions, their images, and how to re-create them.

    ``index`` (n,) batch positions; ``images`` (n, C, ...) the kept follow-ups (a rejected image is its
    clean self); ``families`` / ``severities`` (n, k) every candidate drawn (a chain candidate is counted
    as family ``"augmix"``, severity 0); ``params`` n x k dicts of CPU tensors (leading dim 1),
    replayable with ``get(family, severity).apply_batch(x, m, params=p)`` (split per candidate on first
    access, when a follow-up is recorded, not in the step); ``chosen`` (n,) the kept
    candidate (on the images' device; -1 = none, the clean image); ``scores`` (n, k) the candidates'
    losses (None when nothing was scored; -inf = rejected); ``partner`` / ``weight`` (n,) with
    ``selection="augmax"``: the candidate mixed in and the kept one's share; ``chains`` n x k recipes of
    chain candidates (None without chains). :meth:`recipe` says how to re-create one follow-up.
    """

    index: torch.Tensor
    images: torch.Tensor
    families: list[list[str]]
    severities: list[list[int]]
    params: Sequence[Sequence[dict[str, torch.Tensor]]]
    chosen: torch.Tensor
    scores: torch.Tensor | None = None
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    partner: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    chains: list[list[dict[str, Any]]] | None = None
    applied: list[list[int]] | None = None

    def __len__(self) -> int:
        return int(self.index.numel())

    def kept(self) -> list[tuple[str, int, dict[str, torch.Tensor]] | None]:
        """Per follow-up: (family, severity, params) of the kept candidate, None if it stayed clean.
        Reads ``chosen`` on the host: call it when recording, not inside the step."""
        out: list[tuple[str, int, dict[str, torch.Tensor]] | None] = []
        for i, j in enumerate(self.chosen.tolist()):
            out.append(None if j < 0 else (self.families[i][j], self.severities[i][j], self.params[i][j]))
        return out

    def _candidate(self, i: int, j: int) -> dict[str, Any]:
        if self.chains is not None:
            return self.chains[i][j]
        rec = {"family": self.families[i][j], "severity": self.severities[i][j], "params": self.params[i][j]}
        if self.applied is not None and self.applied[i][j] != rec["severity"]:
            rec["applied_at"] = self.applied[i][j]  # the family call's largest severity (its buffers)
        return rec

    def recipe(self, i: int) -> dict[str, Any] | None:
        """How follow-up ``i`` was made (family, severity, params; a chain's every operation and mix
        weights; AugMax's partner candidate and weight), None if it stayed clean. Params are CPU
        tensors; :func:`jsonable` turns a recipe into plain lists, :func:`recreate_followup` replays it."""
        j = int(self.chosen[i])
        if j < 0:
            return None
        rec = dict(self._candidate(i, j))
        if self.partner is not None and self.weight is not None:
            rec["partner"] = self._candidate(i, int(self.partner[i]))
            rec["weight"] = float(self.weight[i])
        return rec

    def replay(self, images: torch.Tensor, masks: torch.Tensor | None, slice_axis: int = -1) -> torch.Tensor:
        """Re-create :attr:`images` from the clean batch and the recorded recipes (exact)."""
        out = images[self.index].clone()
        for i in range(len(self)):
            rec = self.recipe(i)
            if rec is None:
                continue
            pos = int(self.index[i])
            m = None if masks is None else masks[pos : pos + 1]
            out[i] = recreate_followup(rec, images[pos : pos + 1], m, slice_axis)[0]
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
        selection: ``"worst"``, ``"quantile"`` or ``"augmax"`` (:mod:`robusttrain.training.selection`).
        quantile: the loss quantile ``"quantile"`` keeps (1.0 = the worst).
        chain_depth: > 1 makes each candidate a chain of 1..chain_depth families
            (:mod:`robusttrain.training.chains`).
        mix: ``"augmix"`` mixes ``width`` chains with the clean image (AugMix); ``"none"`` applies one.
        width, alpha: AugMix's number of chains and Dirichlet / Beta concentration.
        stream: name of the random stream (two samplers with one seed and different streams draw
            independently; with the same stream they draw the same positions and families).
        weights: family -> weight > 0 for every family: the family choice's ``epsilon`` share follows
            them instead of the uniform distribution (None: uniform).

    An argument with no effect under the others (``selection`` or ``temperature`` with ``k=1``,
    ``temperature`` with ``selection="quantile"``, ``quantile`` without it, ``width`` / ``alpha`` without
    ``mix="augmix"``) is refused, naming why.
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
        selection: str = "worst",
        quantile: float = 0.75,
        chain_depth: int = 1,
        mix: str = "none",
        width: int = 3,
        alpha: float = 1.0,
        stream: str = "worst_of_k",
        weights: Mapping[str, float] | None = None,
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
        if not math.isfinite(float(temperature)) or float(temperature) < 0:  # NaN read as 0 before
            raise ValueError(f"WorstOfK: temperature must be >= 0 (0 = keep the worst), got {temperature!r}")
        if not 0.0 <= float(max_cover) <= 1.0:
            raise ValueError(f"WorstOfK: max_cover must be a fraction in [0, 1], got {max_cover!r}")
        if selection not in SELECTIONS:
            raise ValueError(f"WorstOfK: selection must be one of {SELECTIONS}, got {selection!r}")
        if not 0.0 <= float(quantile) <= 1.0:
            raise ValueError(f"WorstOfK: quantile must be in [0, 1] (1 = the worst), got {quantile!r}")
        if not math.isfinite(float(alpha)) or float(alpha) <= 0:
            raise ValueError(f"WorstOfK: alpha must be a number > 0 (AugMix: 1.0), got {alpha!r}")
        unused = unused_selection_argument(int(k), selection, float(quantile), float(temperature))
        unused = unused or unused_chain_argument(mix, int(chain_depth), int(width), float(alpha))
        if unused:
            raise ValueError(f"WorstOfK: {unused}")
        self.k, self.q, self.epsilon = int(k), float(q), float(epsilon)
        self.temperature, self.max_cover = float(temperature), float(max_cover)
        self.seed, self.slice_axis = int(seed), int(slice_axis)
        self.selection, self.quantile, self.stream = selection, float(quantile), str(stream)
        self.caps = _caps(self.families, severity_caps)
        self._caps_np = np.asarray([self.caps[f] for f in self.families], dtype=np.int64)
        self.weights = _weights(self.families, weights)
        self.chains = None
        if chain_depth > 1 or mix != "none":
            # chains mix appearance changes; an occluder inside a chain would (nearly always) be rejected
            # by the lesion-cover rule, so occluding families stay single-candidate only
            chain_fams = [f for f in self.families if f not in OCCLUDERS]
            if not chain_fams:
                raise ValueError(
                    f"WorstOfK: chains need a non-occluding family; {self.families} all occlude the image"
                )
            self.chains = ChainSampler(chain_fams, depth=chain_depth, width=width, alpha=alpha, mix=mix)
        self._ops: dict[tuple[str, int], Any] = {}
        self._channels_ok: set[int] = set()  # channel counts every family has been checked to take

    def family_probs(self, rates: Mapping[str, float] | None = None) -> np.ndarray:
        """``(1 - epsilon) * w + epsilon * base`` over :attr:`families` (``w``: ``rates`` normalised; ``base``
        the normalised ``weights``, else uniform; ``base`` alone when there are no rates or all are 0).

        >>> WorstOfK(["blur", "contrast"], epsilon=0.5).family_probs({"blur": 0.3, "contrast": 0.1}).tolist()
        [0.625, 0.375]
        >>> WorstOfK(["blur", "contrast"], weights={"blur": 9, "contrast": 1}).family_probs().tolist()
        [0.9, 0.1]
        """
        n = len(self.families)
        base = np.full(n, 1.0 / n) if self.weights is None else self.weights
        w = np.array([max(0.0, float((rates or {}).get(f, 0.0))) for f in self.families])
        if not np.isfinite(w).all() or w.sum() <= 0:
            return base
        return (1 - self.epsilon) * w / w.sum() + self.epsilon * base

    def n_selected(self, batch: int) -> int:
        return 0 if self.q <= 0 else min(batch, max(1, int(round(self.q * batch))))

    @property
    def labels(self) -> list[str]:
        """The family names candidates are counted under (the families, plus ``"augmix"`` for chains)."""
        return self.families + ([CHAIN_LABEL] if self.chains is not None else [])

    def generator(self, step: int, rank: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(stable_seed(self.seed, self.stream, int(step), int(rank)))

    def __call__(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        score: Score | None,
        *,
        step: int,
        rank: int = 0,
        rates: Mapping[str, float] | None = None,
        eligible: torch.Tensor | None = None,
        select: bool = True,
    ) -> Followups:
        """Follow-ups for ``images`` (B,C,H,W[,D]) in [0,1] with ``masks`` (B,H,W[,D]) class indices.

        ``score(candidates, masks) -> (n,)`` per-sample losses (higher = worse for the model), called
        once on all n x k candidates (never for k == 1); the caller sets eval mode / no_grad.
        ``eligible``: the batch positions follow-ups may be drawn from (default all).
        ``select=False`` draws one random candidate per image, scoring nothing (the warm-up).
        """
        self._check_channels(images)
        g = self.generator(step, rank)
        b = images.shape[0]
        dev = images.device
        if eligible is None:  # the pool is arange(b): the permutation is its own pick (one op fewer)
            n = self.n_selected(b)
            index = torch.randperm(b, generator=g)[:n].sort().values
        else:
            pool = torch.as_tensor(eligible, dtype=torch.long).cpu()
            n = min(self.n_selected(b), len(pool))
            index = pool[torch.randperm(len(pool), generator=g)[:n]].sort().values
        k = self.k if select else 1
        probs_np = self.family_probs(rates)
        dev_index = on_device(index, dev)
        src = images[dev_index]
        src_m = None if masks is None else masks[dev_index]
        chains, applied = None, None
        params: Sequence[Sequence[dict[str, torch.Tensor]]]
        if self.chains is not None:
            cand, families, severities, params, chains = self._draw_chains(src, src_m, k, probs_np, g)
            occl = [[any(f in OCCLUDERS for f in chain_families(r)) for r in row] for row in chains]
        else:
            cand, families, severities, params, applied = self._draw_single(src, src_m, k, probs_np, g)
            occl = None
        rejected = self._rejected(src, src_m, cand, families, occl)
        scores = None
        if k == 1:
            sel = Selection(-rejected[:, 0].long())  # 0: the one candidate, -1: rejected (the clean image)
        else:
            flat = cand.reshape(n * k, *cand.shape[2:])
            fm = None if src_m is None else src_m.repeat_interleave(k, 0)
            if score is None:
                raise ValueError("WorstOfK: k > 1 scores candidates; give score(candidates, masks)")
            scores = score(flat, fm).reshape(n, k).float() if n else torch.zeros(0, k)
            scores = scores.to(dev)
            sel = select_candidates(
                scores,
                rejected,
                self.selection,
                quantile=self.quantile,
                temperature=self.temperature,
                generator=g,
            )
            scores = scores.masked_fill(rejected, float("-inf"))
        chosen = sel.chosen
        shape = (-1,) + (1,) * (src.ndim - 1)
        if k == 1:
            kept = cand[:, 0]
        else:
            rows = torch.arange(n, device=dev)
            kept = cand[rows, chosen.clamp_min(0)]
        if sel.partner is not None and sel.weight is not None:  # AugMax: worst mixed with a random other
            kept = mix_pair(kept, cand[rows, sel.partner.clamp_min(0)], sel.weight)
        kept = torch.where((chosen >= 0).view(shape), kept, src)
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
            partner=sel.partner,
            weight=sel.weight,
            chains=chains,
            applied=applied,
        )

    def _draw_single(
        self, src: torch.Tensor, src_m: torch.Tensor | None, k: int, probs_np: np.ndarray, g: torch.Generator
    ) -> tuple[
        torch.Tensor,
        list[list[str]],
        list[list[int]],
        Sequence[Sequence[dict[str, torch.Tensor]]],
        list[list[int]],
    ]:
        """k single-family candidates per image: (n, k, C, ...) images, families, severities, params and
        the severity each family call was applied at (a family that batches severities applies a call at
        its largest severity present; replaying one image exactly needs it)."""
        n = src.shape[0]
        probs = torch.from_numpy(np.asarray(probs_np, dtype=np.float64))
        fam_idx = (
            torch.multinomial(probs, n * k, replacement=True, generator=g)
            if n
            else torch.zeros(0, dtype=torch.long)
        )
        # the severities as (n, k) and on the host: family indices and uniforms are read once, as lists, and
        # ``floor(u * cap) + 1`` is taken in float32 on the host (the same product as on a float32 tensor)
        u = torch.rand(n * k, generator=g)
        fam_list = fam_idx.tolist()
        caps = self._caps_np[np.asarray(fam_list, dtype=np.int64)].astype(np.float32)
        sev_list = ((np.asarray(u.tolist(), dtype=np.float32) * caps).astype(np.int64) + 1).tolist()
        families = [[self.families[j] for j in fam_list[i * k : (i + 1) * k]] for i in range(n)]
        severities = [sev_list[i * k : (i + 1) * k] for i in range(n)]
        cand, params, applied = self._draw_candidates(src, src_m, families, severities, g)
        return cand, families, severities, params, applied

    def _draw_candidates(
        self,
        src: torch.Tensor,
        src_m: torch.Tensor | None,
        families: list[list[str]],
        severities: list[list[int]],
        g: torch.Generator,
    ) -> tuple[torch.Tensor, LazyParams, list[list[int]]]:
        """The (n, k, C, ...) candidates, their n x k params and applied-at severities: ONE batched call per
        family drawn, with the candidates' severities (n x k ints) as a per-row tensor, families in order of
        first appearance (row-major over (image, candidate)); per-row params come back to the host once per
        family and key. The index arithmetic is on host lists (an op per row would be a launch per row)."""
        n = len(severities)
        k = len(severities[0]) if n else self.k
        parts: list[tuple[list[int], FamilyParams]] = []
        applied = [[0] * k for _ in range(n)]
        members: dict[str, list[int]] = {}
        for f, fam in enumerate(fam for row in families for fam in row):
            members.setdefault(fam, []).append(f)
        flat_sev = [s for row in severities for s in row]
        if n and src.device.type == "cpu":  # the value range checked once per draw, not once per family
            _check_range(src)
        outs, order = [], []
        shared = SharedMaps(src, src_m) if src.ndim == 4 else None  # one field-of-view step per call
        ops = {fam: self._op(fam, self.caps[fam]) for fam in members}
        # families that share a renderer (the pasted objects) and are drawn together: sampled in turn (the
        # generator's order is unchanged: rendering draws nothing), rendered in one call after the others
        by_group: dict[str, list[str]] = {}
        for fam, op in ops.items():
            if shared is not None and op.render_group is not None and op.batched_severities():
                by_group.setdefault(op.render_group, []).append(fam)
        together = {fam for fams in by_group.values() if len(fams) > 1 for fam in fams}
        deferred: dict[str, list[_Deferred]] = {}
        with shared if shared is not None else contextlib.nullcontext():
            pieces: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
            if shared is not None and len(members) > 1:  # every family's rows in one gather and one split
                fams = list(members)
                rows_all = [f // k for fam in fams for f in members[fam]]
                pieces = dict(zip(fams, shared.take_split(rows_all, [len(members[fam]) for fam in fams])))
            for fam, flat in members.items():
                rows_list = [f // k for f in flat]
                if rows_list == list(range(n)):  # every image, in order (k = 1, one family): no gather
                    x, m = src, src_m
                elif fam in pieces:
                    x, m = pieces[fam]
                else:
                    rows = torch.from_numpy(np.asarray(rows_list, dtype=np.int64))
                    x, m = shared.take(rows) if shared is not None else _take(src, src_m, rows)
                op = ops[fam]
                fam_sev = [flat_sev[f] for f in flat]
                top = max(fam_sev) if op.batched_severities() else None
                for f, s in zip(flat, fam_sev):
                    applied[f // k][f % k] = top if top is not None else int(s)
                if fam in together:
                    # drawn now (the stream's order), sampled now or placed with its group's other deferred
                    # families in one pass before their render
                    item = _Deferred(op.at_severity(top), flat, fam_sev, op.deferred_draw(x, g))
                    if item.drawn is None:
                        item.groups = op.sample_family(x, m, np.asarray(fam_sev, dtype=np.int64), g)
                        parts.append((flat, item.groups))
                    deferred.setdefault(op.render_group, []).append(item)
                    continue
                out, groups = _apply_family(
                    op, x, m, np.asarray(fam_sev, dtype=np.int64), None, self.slice_axis, g, checked=True
                )
                outs.append(out)
                order.extend(flat)
                parts.append((flat, groups))
            for items in deferred.values():
                # the placed-together rows first (stable): sample_together takes them as the leading rows
                items.sort(key=lambda it: it.drawn is None)
                flat_all = [f for it in items for f in it.flat]
                assert shared is not None
                x, m = shared.take(torch.from_numpy(np.asarray([f // k for f in flat_all], dtype=np.int64)))
                late = [it for it in items if it.drawn is not None]
                if late:
                    placed = type(late[0].op).sample_together(
                        x, m, [(it.op, it.sev, it.drawn) for it in late]
                    )
                    for it, p in zip(late, placed):
                        it.groups = [(all_rows(len(it.flat)), p)]
                        parts.append((it.flat, it.groups))
                out = type(items[0].op).render_together(x, m, [it.render_part() for it in items])
                outs.append(out if out.dtype == src.dtype else out.to(src.dtype))
                order.extend(flat_all)
        params = LazyParams(n, k, parts)
        if not outs:
            return src.unsqueeze(1).repeat(1, k, *([1] * (src.ndim - 1))), params, applied
        cand = outs[0] if len(outs) == 1 else torch.cat(outs)  # rows in family order
        if order != list(range(n * k)):  # back to row-major (image, candidate) order: one gather
            inv = np.empty(n * k, dtype=np.int64)
            inv[np.asarray(order, dtype=np.int64)] = np.arange(n * k)
            cand = cand[on_device(torch.from_numpy(inv), cand.device)]
        return cand.view(n, k, *cand.shape[1:]), params, applied

    def _draw_chains(
        self, src: torch.Tensor, src_m: torch.Tensor | None, k: int, probs_np: np.ndarray, g: torch.Generator
    ) -> tuple[
        torch.Tensor,
        list[list[str]],
        list[list[int]],
        list[list[dict[str, torch.Tensor]]],
        list[list[dict[str, Any]]],
    ]:
        """k chain candidates per image (AugMix-style), with each one's recipe."""
        assert self.chains is not None
        n = src.shape[0]

        def apply(
            fam: str, sev: int, x: torch.Tensor, m: torch.Tensor | None
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            out, groups = _apply_family(
                self._op(fam, sev), x, m, torch.full((len(x),), sev), None, self.slice_axis, g
            )
            return out, _row_ordered(groups, len(x))

        probs = probs_np[[self.families.index(f) for f in self.chains.families]]
        outs, recipes = [], []
        for _ in range(k):
            out, rec = self.chains.draw(src, src_m, probs, self.caps, apply, g)
            outs.append(out)
            recipes.append(rec)
        cand = torch.stack(outs, 1) if n else src.unsqueeze(1).repeat(1, k, *([1] * (src.ndim - 1)))
        chains = [[recipes[j][i] for j in range(k)] for i in range(n)]
        families = [[CHAIN_LABEL] * k for _ in range(n)]
        severities = [[0] * k for _ in range(n)]
        params: list[list[dict[str, torch.Tensor]]] = [[{} for _ in range(k)] for _ in range(n)]
        return cand, families, severities, params, chains

    # -- internals ---------------------------------------------------------------------
    def _check_channels(self, images: torch.Tensor) -> None:
        """Refuse a batch some family cannot take (a colour family on grey images, an MRI family on RGB)
        at the first call, whatever the draw picks: checked only on the rows a family is drawn for, a
        misfit family would fail at whichever later step first draws it."""
        if images.ndim < 4:  # not a (B,C,H,W[,D]) batch: the families' own check says what was expected
            return
        c = int(images.shape[1])
        if c in self._channels_ok:
            return
        fits = set(available(channels=c)) if c in (1, 3) else set()
        bad = [f for f in self.families if f not in fits]
        if bad:
            raise ValueError(
                f"WorstOfK: families {bad} cannot take {c}-channel images (batch shape {tuple(images.shape)}); "
                f"the families that can: {[f for f in self.families if f in fits]} -- drop the others from "
                "the perturbations or give images with the channels they need"
            )
        self._channels_ok.add(c)

    def _op(self, family: str, severity: int) -> Any:
        key = (family, severity)
        if key not in self._ops:
            self._ops[key] = get(family, severity)
        return self._ops[key]

    def _rejected(
        self,
        src: torch.Tensor,
        masks: torch.Tensor | None,
        cand: torch.Tensor,
        families: list[list[str]],
        occluding: list[list[bool]] | None = None,
    ) -> torch.Tensor:
        """(n, k) bool: occluding candidates (``families`` in OCCLUDERS, or ``occluding`` given per
        candidate: a chain occludes when any of its operations does) that change more than
        ``max_cover`` of the lesion."""
        n, k = cand.shape[:2]
        flags = occluding if occluding is not None else [[f in OCCLUDERS for f in row] for row in families]
        if masks is None or not any(map(any, flags)):  # decided on the host: no op when nothing occludes
            return torch.zeros(n, k, dtype=torch.bool, device=src.device)
        occl = on_device(torch.from_numpy(np.asarray(flags, dtype=bool).reshape(n, k)), src.device)
        dims = tuple(range(2, cand.ndim - 1))  # the pixel dims of (n, k, ...) after the channel max
        lesion = (masks > 0).unsqueeze(1)  # (n, 1, ...)
        moved = (cand - src.unsqueeze(1)).abs().amax(2) > _COVER_DELTA  # (n, k, ...)
        covered = (moved & lesion).sum(dims)
        area = lesion.sum(dims).clamp_min(1)
        return (covered / area > self.max_cover) & occl


@dataclass
class _Deferred:
    """A family drawn together with others of its render group: its op at the call's severity, its flat
    candidate positions and their severities, the random values drawn at its turn (None: sampled at its
    turn instead) and, once sampled or placed, its params groups."""

    op: Any
    flat: list[int]
    sev: list[int]
    drawn: torch.Tensor | None
    groups: FamilyParams | None = None

    def render_part(self) -> tuple[Any, Any, int]:
        """(op, its params in row order, its row count): its part of the group's ``render_together``."""
        assert self.groups is not None, "a deferred family is sampled or placed before its group renders"
        return self.op, _row_ordered(self.groups, len(self.flat)), len(self.flat)


def _take(
    x: torch.Tensor, m: torch.Tensor | None, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows = on_device(rows, x.device)
    return x[rows], None if m is None else m[rows]


def _check_range(x: torch.Tensor) -> None:
    """Raise a ValueError unless ``x`` is finite and in [0, 1] (what every family checks on CPU input)."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -1e-4 or hi > 1 + 1e-4:
        raise ValueError(f"WorstOfK: images must be finite and in [0,1], got values in [{lo:.3g}, {hi:.3g}]")


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


def recreate_followup(
    recipe: Mapping[str, Any], image: torch.Tensor, mask: torch.Tensor | None, slice_axis: int = -1
) -> torch.Tensor:
    """Re-create one follow-up of ``image`` (1, C, ...) from :meth:`Followups.recipe` (or its
    :func:`jsonable` form, as ``metamorphic_training_samples.jsonl`` stores it): exact."""

    def op(fam: str, sev: int, x: torch.Tensor, m: torch.Tensor | None, p: Mapping[str, Any]) -> torch.Tensor:
        return _apply(get(fam, sev), x, m, {k: torch.as_tensor(v) for k, v in p.items()}, slice_axis)

    def candidate(rec: Mapping[str, Any]) -> torch.Tensor:
        if rec["family"] == CHAIN_LABEL:
            return recreate(rec, image, mask, op)
        p = {k: torch.as_tensor(v) for k, v in rec["params"].items()}
        at = torch.tensor([int(rec.get("applied_at", rec["severity"]))])
        fam = get(rec["family"], int(rec["severity"]))
        return _apply_family(fam, image, mask, at, [(torch.tensor([0]), p)], slice_axis)[0]

    out = candidate(recipe)
    if "partner" in recipe:
        w = torch.tensor([recipe["weight"]], dtype=torch.float64).to(out.dtype).to(out.device)
        out = mix_pair(out, candidate(recipe["partner"]), w)
    return out


def jsonable(recipe: Any) -> Any:
    """A recipe with every tensor as (nested) lists: what a JSON line stores."""
    if torch.is_tensor(recipe):
        return recipe.tolist()
    if isinstance(recipe, Mapping):
        return {k: jsonable(v) for k, v in recipe.items()}
    if isinstance(recipe, (list, tuple)):
        return [jsonable(v) for v in recipe]
    return recipe


def _apply_family(
    op: Any,
    x: torch.Tensor,
    m: torch.Tensor | None,
    sev: torch.Tensor | np.ndarray,
    groups: FamilyParams | None,
    slice_axis: int = -1,
    g: torch.Generator | None = None,
    checked: bool = False,
) -> tuple[torch.Tensor, FamilyParams]:
    """``op``'s family on rows with their own severities ``sev`` (CPU; a numpy array is read without ops),
    sampling (``groups`` None, from ``g``) or replaying ``groups``; volumes (B,C,H,W,D): params drawn on each
    volume's middle slice, every slice perturbed with its volume's params. ``checked``: the caller checked
    the value range of ``x`` already."""
    if x.ndim != 5:
        out, groups = op.apply_family(x, m, sev, generator=g, params=groups, check_range=not checked)
        return (out if out.dtype == x.dtype else out.to(x.dtype)), groups
    n_sl = x.shape[2 + slice_axis % 3]
    flat = volume_to_slices(x, slice_axis)
    fm = None if m is None else volume_to_slices(m, slice_axis, channels=False)
    sev = torch.as_tensor(sev)
    if groups is None:
        j = n_sl // 2
        groups = op.sample_family(flat[j::n_sl], None if fm is None else fm[j::n_sl], sev, g)
    steps = torch.arange(n_sl)
    per_slice = [
        ((rows[:, None] * n_sl + steps).reshape(-1), {k: v.repeat_interleave(n_sl, 0) for k, v in p.items()})
        for rows, p in groups
    ]
    out, _ = op.apply_family(flat, fm, sev.repeat_interleave(n_sl), params=per_slice, check_range=not checked)
    return slices_to_volume(out.to(x.dtype), x.shape[0], slice_axis), groups


def _row_ordered(groups: FamilyParams, n: int) -> dict[str, torch.Tensor]:
    """The params of ``n`` rows as one dict in row order (from ``apply_family``'s groups)."""
    if (
        len(groups) == 1
        and groups[0][0].numel() == n
        and (groups[0][0] is all_rows(n) or bool((groups[0][0] == torch.arange(n)).all()))
    ):
        return with_host(dict(groups[0][1]), host_params(groups[0][1]))
    order = torch.cat([rows for rows, _ in groups]).argsort()
    out = {k: torch.cat([p[k] for _, p in groups])[order] for k in groups[0][1]}
    found = [host_params(p) for _, p in groups]
    hosts = [h for h in found if h is not None]
    if len(hosts) < len(found):
        return out
    # the host tensors the groups were moved from, in the same order (a recipe reads them, not the device's)
    host_order = on_device(order, torch.device("cpu"))
    return with_host(out, {k: torch.cat([h[k].cpu() for h in hosts])[host_order] for k in out})


def _weights(families: list[str], weights: Mapping[str, float] | None) -> np.ndarray | None:
    """The family weights as probabilities in ``families`` order (None: uniform); every family needs a
    finite weight > 0 and no other name may have one."""
    if weights is None:
        return None
    missing = [f for f in families if f not in weights]
    unknown = [str(f) for f in weights if f not in families]
    if missing or unknown:
        raise ValueError(
            f"WorstOfK: weights must give each family one weight; missing {missing}, not families {unknown}"
        )
    w = np.array([float(weights[f]) for f in families], dtype=np.float64)
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError(f"WorstOfK: weights must be finite numbers > 0, got {dict(weights)}")
    return w / w.sum()


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
