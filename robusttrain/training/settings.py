"""MetamorphicTraining's settings: every argument validated when the callback is built (one line naming
the argument), and what follows from them alone -- the follow-up samplers for the run's families and
the line describing them. No trainer here; the Lightning glue is
:class:`robusttrain.callbacks.MetamorphicTraining`.

**What is drawn.** Per selected image, ``k`` candidates: a family from ``(1 - epsilon) * w + epsilon *
uniform`` (``w`` the latest check's per-family violation rates, the training probe's when failure mining
checks one; uniform without a MetamorphicCallback), a severity in ``1..cap``, the family's params — or,
with ``chain_depth > 1`` / ``mix="augmix"``, an AugMix-style chain mix (:mod:`robusttrain.training.chains`).
With ``k > 1`` the model scores the candidates (no grad, eval mode, at ``score_scale`` of the size;
full size by default) and ``selection`` keeps the worst, a loss quantile, or AugMax's mix of the worst
and a random one; ``warmup`` draws at random (nothing scored) for the first fraction of the steps.
Every draw comes from a generator seeded by ``(seed, global step, global rank)``: identical under any
load, after a resume, and each DDP rank draws for its own shard. ``k=1`` is random augmentation with
the same families and dose.

>>> s = MTSettings(k=1, q=0.25)
>>> s.objective, s.pair, s.describe_draw()
('replace', False, 'one random perturbation (k=1)')
>>> MTSettings(consistency=1.0).objective   # a consistency weight picks the consistency objective
'consistency'
>>> MTSettings(score_scale=0)
Traceback (most recent call last):
...
ValueError: score_scale must be in (0, 1] (1 = score at full size), got 0
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from robusttrain.errors import RobustnessConfigError
from robusttrain.perturbations import available, occluding, trainable
from robusttrain.perturbations.suites import SUITES, resolve
from robusttrain.validate import check_choice, check_fraction, check_int

from .chains import MIXES, unused_chain_argument
from .consistency import DIVERGENCES
from .objective import OBJECTIVES
from .selection import SELECTIONS, unused_selection_argument
from .worst_of_k import WorstOfK

DEFAULT_CAP = 4  # without a MetamorphicCallback: the recipes' highest tested severity


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class MTSettings:
    """The validated settings of metamorphic training (module doc), the arguments of
    :class:`~robusttrain.callbacks.MetamorphicTraining` but its ``hooks``, ``dirpath`` and ``context``:
    written once, here. Frozen: checked once when built (``__post_init__``, which also normalises them:
    ``perturbations`` a list of families, ``objective`` chosen, numbers as floats); the callback, the CLI's
    recipe keys (:func:`setting_names`) and the docs read this class.

    Args:
        perturbations: families or a suite name (default: the MetamorphicCallback's suite, else the
            endoscopy suite); families that cannot run on the data's channel count, are not trainable
            (adversarial, melt) or are held out by the MetamorphicCallback are dropped. A mapping
            family -> weight > 0 (``{"blur": 0.9, "jpeg": 0.1}``) draws the families in proportion to
            their weights where a list draws them uniformly: the weights take the uniform share's place in
            the family choice (all of it with ``epsilon=1`` or without a check).
        k: candidates per image (1 = random augmentation).
        q: fraction of each batch that gets a follow-up (with ``"consistency"``: of the whole batch,
            drawn among the rows ``replace_q`` left clean).
        epsilon: uniform share of the family choice, in [0, 1] (the rest follows the check's rates).
        temperature: 0 keeps the selected candidate; > 0 samples the worst by ``softmax(loss / T)``.
        severity_caps: highest severity drawn, an int 1..5 or a mapping family -> 1..5 (families a
            mapping leaves out, and ``None``: the MR suite's highest severity, 4 without one).
        max_cover: occluding candidates changing more of the lesion than this are never kept.
        objective: ``"replace"``, ``"consistency"`` or ``"paired"`` (module doc); default
            ``"consistency"`` when ``consistency > 0``, else ``"replace"``.
        consistency: ``lambda``, the weight of ``D(p(x), p(x*))`` (> 0 for the two consistency objectives).
        divergence: ``"js"`` (default), ``"kl"`` or ``"mse"``.
        detach_source: stop the consistency gradient at the clean (source) prediction, so only the
            follow-up moves to agree (the MR's direction; AdvChain / FixMatch do the same). ``False``
            (default) is AugMix's symmetric JS.
        ramp: fraction of the training steps over which ``lambda`` grows from 0.
        replace_q: with ``"consistency"``, the fraction of each batch replaced in place by a random
            (k=1) follow-up that the supervised loss sees (the same draws as ``"replace"`` with
            ``k=1, q=replace_q``); 0 keeps the supervised batch clean (AugMix).
        selection: ``"worst"``, ``"quantile"`` or ``"augmax"`` (:mod:`robusttrain.training.selection`).
        quantile: the loss quantile ``selection="quantile"`` keeps (1.0 = the worst).
        warmup: fraction of the training steps before selection starts (random draws until then).
        score_scale: size of the scoring forward relative to the image (1.0, the default, scores at the
            training resolution; a smaller scale is kept when the scaled size is a multiple of 16).
        chain_depth, mix, width, alpha: AugMix-style chains (:mod:`robusttrain.training.chains`).
        seed: seeds every draw with the step and rank.
        record_every, record_per_step: every N-th step, the first M kept follow-ups' recipes are written.

    Raises:
        ValueError: a bad value, named in the message.
    """

    perturbations: str | Sequence[str] | Mapping[str, float] | None = None
    k: int = 4
    q: float = 0.5
    epsilon: float = 0.3
    temperature: float = 0.0
    severity_caps: int | Mapping[str, int] | None = None
    max_cover: float = 0.1
    consistency: float = 0.0
    divergence: str = "js"
    detach_source: bool = False
    ramp: float = 0.2
    score_scale: float = 1.0
    seed: int = 0
    record_every: int = 50
    record_per_step: int = 2
    objective: str | None = None
    replace_q: float = 0.0
    selection: str = "worst"
    quantile: float = 0.75
    warmup: float = 0.0
    chain_depth: int = 1
    mix: str = "none"
    width: int = 3
    alpha: float = 1.0
    # from ``perturbations`` when it is a mapping (None: families drawn uniformly)
    family_weights: dict[str, float] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # frozen: each value is checked (and normalised) once, here, in the order the messages are raised
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        perturbations, temperature, consistency = self.perturbations, self.temperature, self.consistency
        put("family_weights", checked_weights(perturbations))
        families = (
            None
            if perturbations is None
            else resolve(list(perturbations) if isinstance(perturbations, Mapping) else perturbations)
        )
        put("perturbations", families)
        put("k", check_int("k", self.k, 1))
        put("q", check_fraction("q", self.q))
        put("epsilon", check_fraction("epsilon", self.epsilon))
        if not _number(temperature) or temperature < 0:  # NaN compared as "not < 0" and was read as 0
            raise ValueError(f"temperature must be a number >= 0 (0 = keep the worst), got {temperature!r}")
        put("temperature", float(temperature))
        put("severity_caps", checked_caps(self.severity_caps, families))
        put("max_cover", check_fraction("max_cover", self.max_cover))
        if not _number(consistency) or consistency < 0:
            raise ValueError(
                f"consistency must be a weight >= 0 (0 = no consistency term), got {consistency!r}"
            )
        put("consistency", float(consistency))
        objective = self.objective
        if objective is None:
            objective = "consistency" if self.consistency > 0 else "replace"
        put("objective", check_choice("objective", objective, OBJECTIVES))
        if self.objective != "replace" and self.consistency <= 0:
            raise ValueError(
                f"objective={self.objective!r} trains through the consistency term: give consistency > 0 "
                f"(lambda, e.g. 1.0), got consistency={consistency!r}"
            )
        if self.objective == "replace" and self.consistency > 0:
            raise ValueError(
                f"objective='replace' has no consistency term, but consistency={consistency!r}; use "
                "objective='consistency' (hard copies only through the consistency term) or consistency=0"
            )
        put("divergence", check_choice("divergence", self.divergence, DIVERGENCES))
        if not isinstance(self.detach_source, bool):
            raise ValueError(f"detach_source must be true or false, got {self.detach_source!r}")
        put("ramp", check_fraction("ramp", self.ramp))
        score_scale = self.score_scale
        if (
            isinstance(score_scale, bool)
            or not isinstance(score_scale, (int, float))
            or not 0 < score_scale <= 1
        ):
            raise ValueError(f"score_scale must be in (0, 1] (1 = score at full size), got {score_scale!r}")
        put("score_scale", float(score_scale))
        replace_q = self.replace_q
        put("replace_q", check_fraction("replace_q", replace_q))
        if self.replace_q > 0 and self.objective != "consistency":
            raise ValueError(
                f"replace_q={replace_q!r} is for objective='consistency' (random in-place draws the supervised "
                f"loss sees); with objective={self.objective!r} use q"
            )
        put("selection", check_choice("selection", self.selection, SELECTIONS))
        put("quantile", check_fraction("quantile", self.quantile))
        warmup = self.warmup
        put("warmup", check_fraction("warmup", warmup))
        if self.warmup >= 1:
            raise ValueError(f"warmup must be a fraction of the training steps in [0, 1), got {warmup!r}")
        chain_depth = self.chain_depth
        put("chain_depth", check_int("chain_depth", chain_depth, 1))
        if self.chain_depth > 5:
            raise ValueError(f"chain_depth must be 1..5 (AugMix uses up to 3), got {chain_depth!r}")
        put("mix", check_choice("mix", self.mix, MIXES))
        put("width", check_int("width", self.width, 1))
        if not _number(self.alpha) or self.alpha <= 0:
            raise ValueError(f"alpha must be a number > 0 (AugMix: 1.0), got {self.alpha!r}")
        put("alpha", float(self.alpha))
        put("seed", check_int("seed", self.seed, None))
        put("record_every", check_int("record_every", self.record_every, 1))
        put("record_per_step", check_int("record_per_step", self.record_per_step, 0))
        unused = self._unused_argument()
        if unused:
            raise ValueError(unused)

    def _unused_argument(self) -> str | None:
        """Why an argument has no effect under the others (None: every one acts), as ``width`` with
        ``mix="none"`` always was: a setting the run would silently ignore is refused. Values equal to
        the defaults are not settings (the recipe spells every default out)."""
        why = unused_selection_argument(self.k, self.selection, self.quantile, self.temperature)
        why = why or unused_chain_argument(self.mix, self.chain_depth, self.width, self.alpha)
        if why:
            return why
        nothing_scored = "k=1 draws one candidate and scores nothing (give k > 1"
        if self.k == 1 and self.warmup > 0:
            return f"warmup={self.warmup:g} delays the selection among k > 1 candidates; {nothing_scored} or warmup=0)"
        if self.k == 1 and self.score_scale != 1.0:
            return f"score_scale={self.score_scale:g} is the size candidates are scored at; {nothing_scored} or score_scale=1.0)"
        if not self.pair:
            no_term = "objective='replace' has no consistency term (use objective='consistency' with consistency > 0"
            for name, value, default in (
                ("divergence", self.divergence, "js"),
                ("detach_source", self.detach_source, False),
                ("ramp", self.ramp, 0.2),
            ):
                if value != default:
                    return f"{name}={value!r} shapes the consistency term; {no_term}, or leave {name}={default!r})"
        if self.record_per_step == 0 and self.record_every != 50:
            return f"record_every={self.record_every} has nothing to record with record_per_step=0 (give record_per_step > 0)"
        if self.max_cover != 0.1 and self.perturbations is not None:
            chains = self.chain_depth > 1 or self.mix != "none"  # chains never draw an occluding family
            covers = (
                set(self.perturbations) & set(occluding()) if (not chains or self.replace_q > 0) else set()
            )
            if not covers:
                return (
                    f"max_cover={self.max_cover:g} caps the lesion cover of occluding families, and none of "
                    f"{self.perturbations} is drawn as one here (occluding: {sorted(occluding())})"
                )
        return None

    @property
    def pair(self) -> bool:
        """Whether follow-ups wait beside the batch (the two consistency objectives) instead of
        replacing its images."""
        return self.objective != "replace"

    @property
    def steerable(self) -> bool:
        """Whether FailureMiningCallback(mode="steer") can steer these settings' random draws: the single
        random draws of ``objective="replace", k=1`` without chains, or the in-place draws of ``replace_q``."""
        single = self.chain_depth == 1 and self.mix == "none"
        return (self.objective == "replace" and self.k == 1 and single) or self.replace_q > 0

    def families_for(
        self, suite_names: Sequence[str] | None, channels: int, heldout: Sequence[str] = ()
    ) -> tuple[list[str], list[str]]:
        """(the families trained on, those asked for but not trained on here): the settings' (else the
        MR suite's, else the endoscopy suite's) that run on ``channels``-channel images and may be trained
        on (not adversarial / melt), minus the check's test-only ``heldout`` families.

        >>> MTSettings(perturbations=["blur", "adversarial"]).families_for(None, 3)
        (['blur'], ['adversarial'])
        """
        names = self.perturbations or (list(suite_names) if suite_names is not None else resolve("endoscopy"))
        usable = set(trainable(int(channels)))
        families = [n for n in names if n in usable and n not in set(heldout)]
        if not families:
            raise RobustnessConfigError(
                f"MetamorphicTraining: none of the perturbations {names} runs on {channels}-channel "
                f"images or is trainable; choose families from {sorted(usable - set(heldout))} "
                "(e.g. perturbations='mri' or 'xray')"
            )
        return families, [n for n in names if n not in families]

    def caps_for(self, families: Sequence[str], default_cap: int) -> int | dict[str, int]:
        """The highest severity of each family drawn (``default_cap`` where the settings name none);
        a family in ``severity_caps`` that the run does not train on is refused."""
        caps = self.severity_caps
        if isinstance(caps, Mapping):
            unknown = sorted(set(caps) - set(families))
            if unknown:
                raise RobustnessConfigError(
                    f"MetamorphicTraining: severity_caps names {unknown}, not families this run trains on "
                    f"({list(families)})"
                )
            return {f: caps.get(f, default_cap) for f in families}  # the documented default for the rest
        return default_cap if caps is None else caps

    def samplers(
        self, families: Sequence[str], caps: int | Mapping[str, int], slice_axis: int = -1
    ) -> tuple[WorstOfK, WorstOfK | None]:
        """The follow-up sampler and, for ``replace_q``, the in-place random one, over ``families``
        (``caps``: :meth:`caps_for`).

        >>> wok, replacer = MTSettings(k=2).samplers(["blur", "contrast"], DEFAULT_CAP)
        >>> wok.k, replacer is None
        (2, True)
        """
        weights = None if self.family_weights is None else {f: self.family_weights[f] for f in families}
        common: dict[str, Any] = dict(
            epsilon=self.epsilon,
            weights=weights,
            severity_caps=caps,
            max_cover=self.max_cover,
            seed=self.seed,
            slice_axis=slice_axis,
        )
        wok = WorstOfK(
            families,
            k=self.k,
            q=self.q,
            temperature=self.temperature,
            selection=self.selection,
            quantile=self.quantile,
            chain_depth=self.chain_depth,
            mix=self.mix,
            width=self.width,
            alpha=self.alpha,
            # the consistency follow-ups draw on a stream of their own, so the in-place part of the
            # batch is exactly what objective="replace", k=1, q=replace_q draws for the same seed
            stream="consistency" if self.objective == "consistency" else "worst_of_k",
            **common,
        )
        replacer = None
        if self.replace_q > 0:
            replacer = WorstOfK(families, k=1, q=self.replace_q, stream="worst_of_k", **common)
        return wok, replacer

    def describe_draw(self) -> str:
        """What is drawn per selected image, in words (k=1 scores nothing: one random draw)."""
        what = "an AugMix chain mix" if self.mix == "augmix" or self.chain_depth > 1 else "perturbation"
        if self.k == 1:
            return f"one random {what} (k=1)"
        return f"{self.selection} of k={self.k} ({what})" + (
            f", random for the first {self.warmup:g} of steps" if self.warmup else ""
        )

    def describe(self, families: Sequence[str], dropped: Sequence[str], replacing: bool) -> str:
        """The line the callback prints when training starts."""
        base = "uniform" if self.family_weights is None else "by your weights"
        weights = (
            f"drawn {'uniformly' if self.family_weights is None else 'by your weights'}"
            if self.epsilon >= 1.0
            else f"weighted by the MR check, {self.epsilon:g} {base}"
        )
        return (
            f"[robusttrain] metamorphic training ({self.objective}): {self.describe_draw()} on q={self.q:g} of "
            f"each batch, families {list(families)} ({weights})"
            + (f", random in place on replace_q={self.replace_q:g}" if replacing else "")
            + (f" (not trained on here: {list(dropped)})" if dropped else "")
            + (f", consistency lambda={self.consistency:g} ({self.divergence})" if self.pair else "")
        )


def check_training_images(images: Any, step: int = 0) -> None:
    """Training images the perturbations can take: float (B,C,H,W[,D]) in [0, 1] (checked every batch:
    a loader can produce an out-of-range batch at any step)."""
    if not torch.is_tensor(images) or not images.is_floating_point() or images.ndim not in (4, 5):
        raise RobustnessConfigError(
            f"MetamorphicTraining needs float (B,C,H,W) or (B,C,H,W,D) training images, got "
            f"{getattr(images, 'dtype', type(images).__name__)} {tuple(getattr(images, 'shape', ()))}"
        )
    lo, hi = (float(v) for v in torch.aminmax(images.detach()))
    if not (lo >= 0.0 and hi <= 1.0):  # also false for NaN
        raise RobustnessConfigError(
            f"MetamorphicTraining perturbs images in [0, 1], but the training images at step {step} span "
            f"[{lo:.3g}, {hi:.3g}] (normalise after the perturbation, e.g. in the model's forward, or pass "
            "hooks=BatchHooks(get_images=...))"
        )


def setting_names() -> tuple[str, ...]:
    """The settings' names in order: the arguments of :class:`MTSettings` (and so the keyword arguments
    of MetamorphicTraining beside ``hooks``, ``dirpath``, ``context``, and the recipe's keys).

    >>> setting_names()[:3], len(setting_names())
    (('perturbations', 'k', 'q'), 24)
    """
    return tuple(f.name for f in fields(MTSettings) if f.init)


def checked_caps(caps: Any, families: Sequence[str] | None) -> int | dict[str, int] | None:
    """``severity_caps`` validated at construction: None, an int 1..5, or family -> 1..5 for families of
    the run (all registered ones when the run's families are not known yet)."""

    def ok(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 1 <= int(v) <= 5

    what = "an int 1..5 or a mapping family -> 1..5 (default: the MR suite's highest severity)"
    if caps is None:
        return None
    if ok(caps):
        return int(caps)
    if not isinstance(caps, Mapping):
        raise ValueError(f"severity_caps must be {what}, got {caps!r}")
    known = list(families) if families is not None else available()
    unknown = [str(f) for f in caps if f not in known]
    if unknown:
        raise ValueError(
            f"severity_caps names {unknown}, not families of this run; expected keys among {sorted(known)}"
        )
    bad = {str(f): v for f, v in caps.items() if not ok(v)}
    if bad:
        raise ValueError(f"severity_caps must be {what}; bad values {bad}")
    return {str(f): int(v) for f, v in caps.items()}


def checked_weights(perturbations: Any) -> dict[str, float] | None:
    """Per-family draw weights of a ``perturbations`` mapping (None for a suite name or a list): family
    names (a suite's families are listed one by one) to finite weights > 0.

    >>> checked_weights({"blur": 0.9, "jpeg": 0.1}), checked_weights(["blur"])
    ({'blur': 0.9, 'jpeg': 0.1}, None)
    >>> checked_weights({"blur": 0})
    Traceback (most recent call last):
    ...
    ValueError: perturbations={'blur': 0}: a mapping gives each family a draw weight > 0; bad weights {'blur': 0} (leave a family out rather than weigh it 0)
    """
    if not isinstance(perturbations, Mapping):
        return None
    suites = [str(f) for f in perturbations if f in SUITES]
    if suites:
        raise ValueError(
            f"perturbations={dict(perturbations)!r}: a mapping weighs families, and {suites} are suite names; "
            "list the families with a weight each"
        )
    bad = {str(f): w for f, w in perturbations.items() if not _number(w) or w <= 0}
    if bad:
        raise ValueError(
            f"perturbations={dict(perturbations)!r}: a mapping gives each family a draw weight > 0; bad weights "
            f"{bad} (leave a family out rather than weigh it 0)"
        )
    return {str(f): float(w) for f, w in perturbations.items()}
