"""Held-out (test-only) families: tested by the MR check, never drawn by training.

A check that only tests the families a model trained on measures in-family robustness; the question a
user has is robustness to an artifact nobody simulated. ``heldout`` names such families (a suite name
like ``"endoscopy_heldout"`` or family names): the check adds them to its suite when missing and labels
their rows ``heldout=True`` in ``efr.csv`` and every table; MetamorphicTraining reads the set from the
shared context (``RobustnessContext.heldout_families``) and never draws them.

>>> from robusttrain.metamorphic.suite import MRSuite
>>> heldout_families(["gamma", "blur"])
('gamma', 'blur')
>>> with_families(MRSuite(["blur", "contrast"], (2,), seed=3), ("gamma", "blur")).names
['blur', 'contrast', 'gamma']
>>> heldout_families("nope")
Traceback (most recent call last):
...
ValueError: heldout: unknown perturbation suite 'nope'; ...

A family the run trained on is never reported as held out (:func:`label_heldout`): what a run trained on
comes from its settings (:func:`trained_by_config`: MetamorphicTraining's families, the failure replay's)
and from its records (:func:`trained_by_records`: ``metamorphic_training.csv``, which also covers a resume
that added ``heldout=`` after epochs that drew the family). Such a family is still tested, labelled trained,
and one line says why (:func:`trained_note`):

>>> import pandas as pd
>>> records = pd.DataFrame({"epoch": [0, 0], "family": ["blur", "gamma"], "chosen": [3, 0]})
>>> held, trained = label_heldout(("blur", "jpeg"), trained_by_records(records))
>>> held, trained_note(trained)
(('jpeg',), "heldout: 'blur' is reported as a trained family, not held out: this run trained on it (metamorphic_training.csv: 3 follow-up(s) kept, epoch 0)")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from robusttrain.perturbations.registry import trainable
from robusttrain.perturbations.suites import resolve

from .suite import MRSuite


def heldout_families(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """The family names of ``spec`` (a suite name, family and/or suite names; None or empty: none).

    Raises ValueError (one line, starting ``heldout:``) for an unknown name, listing the valid ones.
    """
    if spec is None or (not isinstance(spec, str) and len(spec) == 0):
        return ()
    try:
        return tuple(resolve(spec if isinstance(spec, str) else list(spec)))
    except (ValueError, TypeError) as e:
        raise ValueError(f"heldout: {str(e).strip().splitlines()[0]}") from None


def with_families(suite: MRSuite, families: Sequence[str]) -> MRSuite:
    """``suite`` when it already tests every family of ``families``; else a new suite with the same
    severities, seed, kwargs and slice axis and the missing families appended (the suite's own tests
    keep their order and params: a test's params hang on (seed, case, family, severity), not its index).
    """
    missing = [f for f in families if f not in suite.names]
    if not missing:
        return suite
    return MRSuite(
        list(suite.names) + missing,
        severities=list(suite.severities),
        seed=suite.seed,
        perturbation_kwargs=dict(suite.perturbation_kwargs),
        slice_axis=suite.slice_axis,
    )


def label_heldout(
    requested: Sequence[str], trained: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the families of ``requested`` labelled held out, ``{family: why}`` of those the run trained on).

    The one rule for every table that says "held out" (``check``, MetamorphicCallback): a family in
    ``trained`` (:func:`trained_by_config`, :func:`trained_by_records`) is tested but never labelled held out.
    """
    held = tuple(f for f in requested if f not in trained)
    return held, {f: trained[f] for f in requested if f in trained}


def trained_note(trained: Mapping[str, str]) -> str:
    """One line saying which requested held-out families count as trained, and why ("" when none)."""
    if not trained:
        return ""
    names = ", ".join(f"'{f}'" for f in trained)
    why = (
        "; ".join(f"{f}: {w}" for f, w in trained.items())
        if len(trained) > 1
        else next(iter(trained.values()))
    )
    return (
        f"heldout: {names} {'is' if len(trained) == 1 else 'are'} reported as a trained "
        f"famil{'y' if len(trained) == 1 else 'ies'}, not held out: this run trained on "
        f"{'it' if len(trained) == 1 else 'them'} ({why})"
    )


def trained_by_records(records: pd.DataFrame | None) -> dict[str, str]:
    """``{family: why}`` for every family whose follow-ups metamorphic training kept (``chosen`` > 0 in
    ``metamorphic_training.csv`` or MetamorphicTraining's in-memory records)."""
    if records is None or not len(records) or not {"family", "chosen"} <= set(records.columns):
        return {}
    chosen = pd.to_numeric(records["chosen"], errors="coerce").fillna(0)
    epochs = pd.to_numeric(records.get("epoch", pd.Series(dtype=float)), errors="coerce")
    out = {}
    for fam in dict.fromkeys(str(f) for f in records["family"]):
        rows = (records["family"].astype(str) == fam) & (chosen > 0)
        if rows.any():
            ep = epochs[rows].dropna().astype(int)
            span = (
                ""
                if ep.empty
                else f", epoch {ep.min()}"
                if ep.min() == ep.max()
                else f", epochs {ep.min()}-{ep.max()}"
            )
            out[fam] = f"metamorphic_training.csv: {int(chosen[rows].sum())} follow-up(s) kept{span}"
    return out


def trained_by_config(config: Mapping[str, Any] | None) -> dict[str, str]:
    """``{family: why}`` for the families a run's settings (its ``config.yaml``, plain values) train on:
    MetamorphicTraining's (its ``perturbations``, else the MR suite's; trainable families, minus the run's
    held-out ones) and, with failure replay on, the MR suite's (replay trains on the failures it mines).

    Raises ValueError naming the key for a family list that does not resolve.
    """
    cbs = _node(config, "callbacks")
    suite_spec = _node(cbs, "metamorphic", "suite", "perturbations")
    held = set(_resolved(_node(cbs, "metamorphic", "heldout"), "callbacks.metamorphic.heldout") or ())
    suite = _resolved(suite_spec, "callbacks.metamorphic.suite.perturbations") or resolve("endoscopy")
    out: dict[str, str] = {}
    mt = _node(cbs, "metamorphic_training")
    if isinstance(mt, Mapping) and mt.get("enabled", True) is not False:
        key = "callbacks.metamorphic_training.perturbations"
        names = _resolved(mt.get("perturbations"), key) or suite
        where = (
            key
            if mt.get("perturbations")
            else "callbacks.metamorphic.suite (metamorphic training's families)"
        )
        out.update({f: f"config.yaml {where}" for f in names if f in trainable() and f not in held})
    mining = _node(cbs, "mining")
    if isinstance(mining, Mapping) and mining.get("enabled") is True:
        out.update(
            {
                f: "config.yaml callbacks.mining replays the suite's failures"
                for f in suite
                if f not in held and f not in out
            }
        )
    return out


def _node(config: Any, *keys: str) -> Any:
    for k in keys:
        config = config.get(k) if isinstance(config, Mapping) else None
    return config


def _resolved(spec: Any, key: str) -> list[str] | None:
    if spec is None or (isinstance(spec, (list, tuple)) and not spec):
        return None
    try:
        return resolve(spec if isinstance(spec, str) else list(spec))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{key}: {str(e).strip().splitlines()[0]}") from None
