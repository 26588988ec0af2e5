"""The footnotes a report's tables need: what each rests on, and what the run left off.

A number without its basis reads as a contradiction: the final EFR table of a run rests on every
(case, test) pair's *latest* score over the run's checks (``basis=rotation``), made with the weights of
several epochs, while `robusttrain check` scores every pair with the final weights -- both are right,
and the page has to say which is which. Features the recipe switched off are one quiet line with the
override that switches them on, not a warning box. Everything here reads values the run-directory
readers returned (untrusted text is escaped by the templates).

>>> import pandas as pd
>>> efr = pd.DataFrame({"epoch": [3, 3], "final": [True, True], "basis": "rotation", "from_epoch": [0, 1],
...                     "cases": [6, 6], "suite_cases": [6, 6]})
>>> print(efr_basis(efr, 3))
basis=rotation, from_epoch=0: each (case, test) pair's latest score over the run's checks, made with the weights of epochs 0-3 (not the final weights alone). robusttrain check on the final checkpoint scores every pair with epoch 3's weights, so its numbers can differ from these.
>>> off_features("callbacks:\\n  ema: {enabled: false}\\n  mining: {enabled: false}\\n  metamorphic_training: {enabled: true}\\n")
[('ema', 'EMA', 'callbacks.ema.enabled=true'), ('mining', 'failure mining', 'callbacks.mining.enabled=true')]
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import yaml

# callbacks a recipe switches on and off (key under callbacks:, the name a user reads, the override)
FEATURES: tuple[tuple[str, str], ...] = (
    ("metamorphic_training", "metamorphic training"),
    ("balanced_average", "balanced average"),
    ("ema", "EMA"),
    ("mining", "failure mining"),
)


def _config(text: str | None) -> dict[str, Any] | None:
    """config.yaml as a mapping, or None when absent or not one (a report never fails on it)."""
    if not text:
        return None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return obj if isinstance(obj, dict) else None


def off_features(config_text: str | None) -> list[tuple[str, str, str]]:
    """``(key, name, override)`` of each feature config.yaml says is off (``enabled: false``); [] when
    config.yaml is missing or says nothing (then a missing file is news, shown as not available)."""
    callbacks = (_config(config_text) or {}).get("callbacks")
    if not isinstance(callbacks, dict):
        return []
    out = []
    for key, name in FEATURES:
        group = callbacks.get(key)
        if isinstance(group, dict) and group.get("enabled") is False:
            out.append((key, name, f"callbacks.{key}.enabled=true"))
    return out


def _one(frame: pd.DataFrame, column: str) -> Any:
    values = frame[column].dropna().unique() if column in frame else []
    return values[0] if len(values) == 1 else None


def efr_basis(efr: pd.DataFrame, epoch: int) -> str:
    """What the EFR rows of ``epoch`` rest on, from their ``basis`` / ``from_epoch`` / ``suite_cases``
    columns (an efr.csv from before them: the epoch's own check is all that can be said)."""
    rows = efr[efr["epoch"] == epoch]
    basis = _one(rows, "basis")
    if basis == "rotation":
        start = int(rows["from_epoch"].min()) if "from_epoch" in rows else epoch
        return (
            f"basis=rotation, from_epoch={start}: each (case, test) pair's latest score over the run's checks, "
            f"made with the weights of epochs {start}-{epoch} (not the final weights alone). robusttrain check "
            f"on the final checkpoint scores every pair with epoch {epoch}'s weights, so its numbers can "
            "differ from these."
        )
    if basis == "suite":
        return (
            f"basis=suite: the whole suite scored with epoch {epoch}'s weights (what robusttrain check on "
            "that checkpoint scores too)."
        )
    if basis == "subset":
        pooled = rows[rows["perturbation"] == "all"] if "perturbation" in rows else rows.iloc[:0]
        scored, total = (pooled["cases"].max() if len(pooled) else None), _one(pooled, "suite_cases")
        part = f" ({int(scored)} of {int(total)} test cases)" if scored is not None and total else ""
        return (
            f"basis=subset: the budgeted share of the suite{part} scored with epoch {epoch}'s weights; "
            "robusttrain check scores the whole suite, so its numbers can differ."
        )
    return f"the check of epoch {epoch} (this efr.csv does not record its basis)."
