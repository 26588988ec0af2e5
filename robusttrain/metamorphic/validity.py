"""Which check families tracked a new hospital in the project's own evidence -- what to watch, not a promise.

A check's follow-up Dice on in-domain cases is only worth watching for a new centre where it tells more
than the clean Dice a user already has. The project measured that across its evidence runs (Kvasir-SEG
trained, CVC-ClinicDB as the new centre): per test family, the partial correlation over runs of the
family's follow-up Dice on the Kvasir test cases with ClinicDB clean Dice, controlling for Kvasir clean
Dice, with a 95 % interval from resampling runs -- over every run, recipes pooled (``families``: does a
model trained differently that checks better hold up better?), and with the recipe controlled for too
(``within_recipes``: among runs of one recipe, seed to seed; a pretrained or augmented recipe raises both
the check and the new centre, which the pooled view counts and this one does not). ``family_validity.json``
(beside this module) holds both; it is *generated* from an evidence archive by
``python -m benchmarks.evidence.validity`` (a test re-computes it), never edited by hand.

``check`` and ``report`` show it beside their tables: families whose interval lies above 0 "tracked the
new centre in this evidence"; the rest did not (their interval includes 0). One dataset pair, the
models the file's ``source`` names: evidence, not a guarantee.

>>> v = family_validity()
>>> v["source"]["target"], sorted(v["families"])[:2]
('cvc_clinicdb', ['blood', 'blur'])
>>> fams = ["jpeg", "text", "exposure"]
>>> sorted(tracking_families(fams)) == sorted(f for f in fams if v["families"][f]["lo"] > 0)
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

FILE = Path(__file__).with_name("family_validity.json")


@cache
def family_validity() -> dict[str, Any]:
    """``{"source": {...}, "families": {family: {"r", "lo", "hi", "n"}}}`` (the package's own file)."""
    return json.loads(FILE.read_text())


def tracking_families(families: Sequence[str], view: str = "families") -> dict[str, dict[str, float]]:
    """The families of ``families`` whose interval lies above 0 in the evidence, best first; ``view``:
    ``"families"`` (across runs, recipes pooled) or ``"within_recipes"`` (seed to seed within one recipe;
    empty when the evidence has no such view)."""
    known = family_validity().get(view, {})
    hits = {f: known[f] for f in families if f in known and known[f]["lo"] > 0}
    return dict(sorted(hits.items(), key=lambda kv: -kv[1]["r"]))


def _view(families: Sequence[str], view: str) -> str:
    hits = tracking_families(families, view)
    rest = [f for f in families if f not in hits]
    said = ", ".join(
        f"{f} (partial r {d['r']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}])" for f, d in hits.items()
    )
    return (
        f"the in-domain follow-up Dice of {said or 'no family'} tracked the new centre's clean Dice (interval "
        f"above 0); {', '.join(rest) or 'none'} did not (interval includes 0)"
    )


def validity_note(families: Sequence[str]) -> str:
    """One paragraph for ``check`` / ``report``: which of ``families`` tracked the new centre, from where.

    >>> print(validity_note(["jpeg", "text"]).split(":")[0])
    Which families tracked a new hospital in the project's evidence (Evidence v5
    """
    v = family_validity()
    src = v["source"]
    known = [f for f in families if f in v["families"]]
    if not known:
        return ""
    head = (
        f"Which families tracked a new hospital in the project's evidence ({src['evidence']}: {src['runs']} runs, "
        f"{src['model']}, {src['train']} -> {src['target_name']}, at {src['checkpoint']}; the partial "
        "correlation over runs with the new centre's clean Dice beyond in-domain clean Dice, 95 % interval): "
    )
    if "within_recipes" not in v:
        body = f"{_view(known, 'families')}. "
    else:
        body = (
            f"comparing models trained differently ({src['recipes']} recipes pooled), "
            f"{_view(known, 'families')}. Among runs of one recipe (seed to seed, the recipe controlled for), "
            f"{_view([f for f in known if f in v['within_recipes']], 'within_recipes')}. "
        )
    tail = (
        f"{len(v['families'])} families were tested without a multiplicity correction, on one dataset pair: "
        "evidence of what to watch, not a guarantee for your data."
    )
    return head + body + tail
