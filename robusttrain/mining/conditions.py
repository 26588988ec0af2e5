"""ConditionBank: the failure *conditions* the training probe's check found, for steering fresh draws.

Mining v2 (issue 44) keeps what failed, not which images failed: per failing test the family, its
severity, the perturbation's drawn params and, for placed families, *where* the artifact went relative
to the lesion (:func:`placement_of`) -- so steered training draws can put the same artifact at the same
spot relative to the lesion of *whatever image the data stream brings* (:mod:`robusttrain.training.steering`).

Per check (:meth:`ConditionBank.update`), keyed by (case, family, severity) -- the probe re-tests the
same keys every check:

* a failure adds its condition (or refreshes it: weight back to 1, latest params and drop);
* a condition whose key the check tested and no longer fails is **repaired**: its weight is multiplied
  by ``decay`` and it leaves the bank below :data:`MIN_WEIGHT` (``decay=0``: at once);
* a failure whose key *passed* its previous test is a **new failure** (overfitting: retraining broke a
  case that was fine, which the object-detection MT paper found in over 20 % of instances); counted.

Draws (:meth:`ConditionBank.family_probs`, :meth:`ConditionBank.draw`): a family with probability
``(1 - balance) * W_f / sum W + balance / F`` (``W_f`` the summed weights of its conditions, ``F`` the
failing families: no family takes over while others fail), then one of its conditions in proportion to
its weight. Everything is plain JSON (``state_dict``) and ordered by key, so every process and a resumed
run draw the same.

>>> from robusttrain.metamorphic.records import FailureRecord
>>> rec = lambda case, fam: FailureRecord(case, "train", fam, 3, {"center_rel": [0.2, 0.3]}, 0, 0, 0.9, 0.2, 0.8, 0.1)
>>> bank = ConditionBank(decay=0.5)
>>> bank.update(0, [(rec("c1", "instrument"), None)], tested=[("c1", "instrument", 3), ("c2", "blur", 3)])["bank_size"]
1
>>> s = bank.update(1, [(rec("c2", "blur"), None)], tested=[("c1", "instrument", 3), ("c2", "blur", 3)])
>>> s["repaired"], s["new_failures"], bank.weights()
(1, 1, {'c1|instrument|3': 0.5, 'c2|blur|3': 1.0})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from robusttrain.metamorphic.records import FailureRecord
from robusttrain.validate import check_fraction, check_int

MIN_WEIGHT = 0.1  # a repaired condition leaves the bank once its weight falls below this
_NO_LESION = 1.0 / 32  # smallest lesion extent (fraction of the image side) placement is measured in


def condition_key(case_id: str, family: str, severity: int) -> str:
    """The key conditions and tests are matched by: what the probe re-tests every check."""
    return f"{case_id}|{family}|{int(severity)}"


def lesion_anchor(mask: Any) -> dict[str, list[float]] | None:
    """Centre ``yx`` and bounding-box size ``hw`` of the foreground of ``mask`` ((H,W) or (..., H, W) class
    indices; extra leading axes are projected), as fractions of the image's height and width; None
    without foreground.

    >>> m = np.zeros((10, 20), np.int64); m[2:4, 10:20] = 1
    >>> lesion_anchor(m)
    {'yx': [0.3, 0.75], 'hw': [0.2, 0.5]}
    >>> lesion_anchor(np.zeros((4, 4))) is None
    True
    """
    m = np.asarray(mask)
    fg = np.asarray(m > 0)
    while fg.ndim > 2:
        fg = np.asarray(fg.any(0))
    if not fg.any():
        return None
    h, w = fg.shape
    ys, xs = np.nonzero(fg)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    return {
        "yx": [round(float((y0 + y1) / 2 / h), 6), round(float((x0 + x1) / 2 / w), 6)],
        "hw": [round(float((y1 - y0) / h), 6), round(float((x1 - x0) / w), 6)],
    }


def placement_of(params: Mapping[str, Any], anchor: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where a placed family's artifact went: ``abs`` the artifact's centre (y, x fractions of the image;
    a spot family: the mean of its drawn spots), ``rel`` that centre relative to the lesion (offset from
    the lesion's centre in lesion extents; absent without a lesion), or ``corner`` (overlay text); None
    for a family that is not placed.

    >>> placement_of({"center_rel": [0.5, 0.5]}, {"yx": [0.25, 0.5], "hw": [0.5, 0.25]})
    {'abs': [0.5, 0.5], 'rel': [0.5, 0.0]}
    >>> placement_of({"corner": [2]}, None), placement_of({"sigma_rel": [0.1]}, None)
    ({'corner': [2]}, None)
    """
    if "center_rel" in params:
        c = np.asarray(params["center_rel"], dtype=np.float64).reshape(-1, 2)
        if "strength" in params:  # spots: only the ones drawn (unused / invalid spots have strength 0)
            s = np.asarray(params["strength"], dtype=np.float64).reshape(-1)
            if s.size == len(c) and (s > 0).any():
                c = c[s > 0]
        centre = c.mean(0)
        out: dict[str, Any] = {"abs": [round(float(v), 6) for v in centre]}
        if anchor is not None:
            hw = np.maximum(np.asarray(anchor["hw"], dtype=np.float64), _NO_LESION)
            out["rel"] = [round(float(v), 6) for v in (centre - np.asarray(anchor["yx"])) / hw]
        return out
    if "corner" in params:
        return {"corner": [int(v) for v in np.asarray(params["corner"]).reshape(-1)]}
    return None


def target_centre(
    placement: Mapping[str, Any], anchor: Mapping[str, Any] | None, jitter: float, rng: np.random.Generator
) -> np.ndarray | None:
    """Where a steered draw puts the artifact on a new image whose lesion is ``anchor``: the failure's
    offset from its lesion, scaled to this lesion (its absolute place when either image has no lesion),
    moved by ``N(0, jitter)`` (fractions of the image side) and kept inside the image; None for a
    placement without a centre (a corner).

    >>> p = {"abs": [0.1, 0.1], "rel": [1.0, 0.0]}
    >>> target_centre(p, {"yx": [0.5, 0.5], "hw": [0.2, 0.2]}, 0.0, np.random.default_rng(0)).tolist()
    [0.7, 0.5]
    >>> target_centre(p, None, 0.0, np.random.default_rng(0)).tolist()
    [0.1, 0.1]
    """
    if "abs" not in placement:
        return None
    if anchor is not None and "rel" in placement:
        hw = np.maximum(np.asarray(anchor["hw"], dtype=np.float64), _NO_LESION)
        c = np.asarray(anchor["yx"], dtype=np.float64) + np.asarray(placement["rel"], dtype=np.float64) * hw
    else:
        c = np.asarray(placement["abs"], dtype=np.float64)
    if jitter > 0:
        c = c + rng.normal(0.0, jitter, 2)
    return np.clip(c, 0.0, 1.0)


class ConditionBank:
    """The failure conditions of the latest checks, with repair decay and new-failure counts (module doc).

    Args:
        decay: weight factor of a condition each check finds repaired, in [0, 1) (0: removed at once).
        balance: uniform share of the family choice over the failing families, in [0, 1].
        max_size: most conditions kept (the lightest, then the oldest leave first), >= 1.

    Raises:
        ValueError: a bad argument, named in one line.
    """

    def __init__(self, decay: float = 0.5, balance: float = 0.5, max_size: int = 2000):
        self.decay = check_fraction("decay", decay, hi_open=True)
        self.balance = check_fraction("balance", balance)
        self.max_size = check_int("max_size", max_size, 1)
        self.conditions: dict[str, dict[str, Any]] = {}
        self.passed: set[str] = set()  # keys whose latest test passed
        self.checks: list[dict[str, Any]] = []  # one row of counts per check

    def __len__(self) -> int:
        return len(self.conditions)

    # ---- one check -----------------------------------------------------------------------------
    def update(
        self,
        epoch: int,
        failures: Iterable[tuple[FailureRecord, Mapping[str, Any] | None]],
        tested: Iterable[tuple[str, str, int]],
    ) -> dict[str, Any]:
        """Fold in one check: its ``failures`` (record, lesion anchor of the failing image) and every key
        it ``tested`` (case, family, severity); returns that check's counts (also kept in :attr:`checks`)."""
        tested_keys = {condition_key(*t) for t in tested}
        failed: dict[str, dict[str, Any]] = {}
        for rec, anchor in failures:
            key = condition_key(rec.case_id, rec.perturbation, rec.severity)
            cond = {
                "case_id": rec.case_id,
                "family": rec.perturbation,
                "severity": int(rec.severity),
                "params": {k: np.asarray(v).tolist() for k, v in rec.params.items()},
                "placement": placement_of(rec.params, anchor),
                "drop": round(float(rec.drop), 6),
                "epoch": int(epoch),
            }
            if key not in failed or cond["drop"] > failed[key]["drop"]:
                failed[key] = cond
        tested_keys |= set(failed)
        new = sorted(k for k in failed if k in self.passed)
        for key, cond in failed.items():
            first = self.conditions.get(key, {}).get("first_epoch", int(epoch))
            self.conditions[key] = {**cond, "weight": 1.0, "first_epoch": first}
        repaired = sorted(k for k in self.conditions if k in tested_keys and k not in failed)
        removed = 0
        for key in repaired:
            w = self.conditions[key]["weight"] * self.decay
            if w < MIN_WEIGHT:
                del self.conditions[key]
                removed += 1
            else:
                self.conditions[key]["weight"] = round(w, 12)
        removed += self._evict()
        self.passed = (self.passed | tested_keys) - set(failed)
        row = {
            "epoch": int(epoch),
            "bank_size": len(self.conditions),
            "failures": len(failed),
            "new_failures": len(new),
            "repaired": len(repaired),
            "removed": removed,
            "tested": len(tested_keys),
            "new_failure_keys": new,
        }
        self.checks = [c for c in self.checks if c["epoch"] != int(epoch)] + [row]
        return row

    def _evict(self) -> int:
        if len(self.conditions) <= self.max_size:
            return 0
        order = sorted(
            self.conditions,
            key=lambda k: (
                -self.conditions[k]["weight"],
                -self.conditions[k]["epoch"],
                -self.conditions[k]["drop"],
                k,
            ),
        )
        n = len(order) - self.max_size
        for key in order[self.max_size :]:
            del self.conditions[key]
        return n

    # ---- draws ---------------------------------------------------------------------------------
    def weights(self) -> dict[str, float]:
        return {k: self.conditions[k]["weight"] for k in sorted(self.conditions)}

    def usable(self, families: Iterable[str] | None = None) -> list[str]:
        """Keys of the conditions of ``families`` (None: all), sorted."""
        fams = None if families is None else set(families)
        return [k for k in sorted(self.conditions) if fams is None or self.conditions[k]["family"] in fams]

    def family_probs(self, families: Iterable[str] | None = None) -> dict[str, float]:
        """Draw probability of each failing family among ``families`` (module doc); {} when none fails.

        >>> b = ConditionBank(balance=0.5)
        >>> b.conditions = {"a|blur|2": {"family": "blur", "weight": 1.0}, "b|blur|2": {"family": "blur", "weight": 1.0},
        ...                 "a|text|2": {"family": "text", "weight": 1.0}, "c|blur|3": {"family": "blur", "weight": 1.0}}
        >>> b.family_probs()
        {'blur': 0.625, 'text': 0.375}
        """
        mass: dict[str, float] = {}
        for k in self.usable(families):
            c = self.conditions[k]
            mass[c["family"]] = mass.get(c["family"], 0.0) + float(c["weight"])
        tot = sum(mass.values())
        if tot <= 0:
            return {}
        n = len(mass)
        return {
            f: round((1 - self.balance) * m / tot + self.balance / n, 12) for f, m in sorted(mass.items())
        }

    def draw(self, rng: np.random.Generator, families: Iterable[str] | None = None) -> dict[str, Any] | None:
        """One condition (a copy), drawn as the module doc says; None when no condition of ``families``."""
        probs = self.family_probs(families)
        if not probs:
            return None
        fams = list(probs)
        p = np.asarray([probs[f] for f in fams], dtype=np.float64)
        fam = fams[int(rng.choice(len(fams), p=p / p.sum()))]
        keys = [k for k in self.usable([fam])]
        w = np.asarray([self.conditions[k]["weight"] for k in keys], dtype=np.float64)
        key = keys[int(rng.choice(len(keys), p=w / w.sum()))]
        return {"key": key, **self.conditions[key]}

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "conditions": {k: dict(self.conditions[k]) for k in sorted(self.conditions)},
            "passed": sorted(self.passed),
            "checks": [dict(c) for c in self.checks],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.conditions = {str(k): dict(v) for k, v in dict(state.get("conditions", {})).items()}
        self.passed = set(state.get("passed", []))
        self.checks = [dict(c) for c in state.get("checks", [])]
