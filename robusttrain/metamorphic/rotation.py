"""The final EFR table from the budget's rotation instead of a whole-suite check at the end.

A budgeted run scores a rotating, stratified subset of the (case, test) pairs after every epoch
(:mod:`.budget`). The last check *completes* the rotation: it scores its budgeted share plus every
pair no check of this run has scored yet (:func:`complete_plan`), so each pair of the suite has at
least one score. The final table then takes every pair's **latest** score, exactly once
(:func:`latest_scores`): complete coverage (``cases == suite_cases``) with its 95 % Wilson intervals,
at the cost of the follow-ups a single whole-suite check would take -- spread over the epochs instead
of repeated at the end. What it rests on is labelled: ``basis="rotation"`` and ``from_epoch``, the
earliest epoch whose weights scored one of its pairs (a whole-suite check: ``basis="suite"``,
``from_epoch == epoch``). ``MetamorphicCallback(final="suite")`` keeps the whole suite at the end.

>>> import pandas as pd
>>> scored = pd.DataFrame({"epoch": [0, 0, 1], "case_id": ["a", "b", "a"], "perturbation": "blur",
...                        "severity": 2, "fol_dice": [0.1, 0.2, 0.3]})
>>> latest_scores(scored)[["epoch", "case_id", "fol_dice"]].values.tolist()   # b from epoch 0, a from 1
[[0, 'b', 0.2], [1, 'a', 0.3]]
>>> plan = complete_plan({0: {"a"}, 1: set()}, ["a", "b"], [("blur", 2), ("blur", 4)], scored)
>>> {k: sorted(v) for k, v in plan.items()}   # blur 2 on b was scored in epoch 0; nothing of blur 4 yet
{0: ['a'], 1: ['a', 'b']}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

PAIR = ["case_id", "perturbation", "severity"]


def scored_pairs(cases: pd.DataFrame, tests: Sequence[tuple[str, int]]) -> dict[int, set[str]]:
    """Per test index, the case ids ``cases`` (mr_cases rows) holds a score for."""
    out: dict[int, set[str]] = {k: set() for k in range(len(tests))}
    if not len(cases):
        return out
    index = {(str(p), int(s)): k for k, (p, s) in enumerate(tests)}
    for cid, p, s in cases[PAIR].itertuples(index=False):
        k = index.get((str(p), int(s)))
        if k is not None:
            out[k].add(str(cid))
    return out


def complete_plan(
    plan: Mapping[int, set[str]] | None,
    case_ids: Sequence[str],
    tests: Sequence[tuple[str, int]],
    scored: pd.DataFrame,
) -> dict[int, set[str]] | None:
    """``plan`` (test index -> case ids; None = the whole suite) plus every pair of ``case_ids`` x
    ``tests`` that ``scored`` (this run's mr_cases rows of the split) has no score for."""
    if plan is None:
        return None
    have = scored_pairs(scored, tests)
    cases = list(dict.fromkeys(case_ids))
    return {k: set(plan.get(k, set())) | {c for c in cases if c not in have[k]} for k in range(len(tests))}


def latest_scores(cases: pd.DataFrame) -> pd.DataFrame:
    """Every (case, perturbation, severity) pair once: its row from the latest epoch (rows keep their
    order in ``cases``)."""
    if not len(cases):
        return cases
    ordered = cases.sort_values("epoch", kind="stable")
    return ordered.drop_duplicates(PAIR, keep="last").sort_index().reset_index(drop=True)
