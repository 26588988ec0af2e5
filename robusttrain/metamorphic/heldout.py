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
"""

from __future__ import annotations

from collections.abc import Sequence

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
