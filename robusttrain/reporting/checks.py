"""The report's "Robustness checks" section: every ``robusttrain check`` written into the run.

A check of a training run's checkpoint lives in ``RUN/checks/<name>/`` (a check-only run directory holds
the same files at its top level; :mod:`robusttrain.rundir.check`). Per check: which weights and data, the
case counts (cases with an empty mask are scored apart), which families are held out and which requested
ones count as trained, its EFR table at each threshold, and the empty-mask table. Values from the files are
text in the page (Jinja2 autoescape; pandas escapes its tables).

>>> import tempfile
>>> from markupsafe import Markup
>>> "no check" in checks_section(tempfile.mkdtemp(), lambda f, fmt, index: Markup(""))
True
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment
from markupsafe import Markup

from robusttrain.metamorphic.validity import validity_note
from robusttrain.rundir import check as check_file
from robusttrain.rundir import efr as efr_file

_ENV = Environment(autoescape=True)

ONE = """<h3>{{ name }}</h3><table>{% for k, v in facts %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}
</table>{% for t, table in tables %}<h4>EFR (%) at t = {{ t }}, cases with a lesion</h4>{{ table }}{% endfor %}
{% if validity %}<p class="quiet">{{ validity }}</p>{% endif %}
{% if empty %}<h4>Cases whose mask is empty (no lesion): scored apart</h4><p>Specificity: the share of them where
the model predicts no lesion pixel; mean predicted px: the false-positive area per case.</p>{{ empty }}{% endif %}"""


def check_folders(run_dir: str | Path) -> list[Path]:
    """The run's check folders; a check-only run directory is its own one."""
    run_dir = Path(run_dir)
    top = [run_dir] if check_file.summary(run_dir) is not None else []
    return top + check_file.checks_of(run_dir)


def _facts(run_dir: Path, folder: Path, s: dict[str, Any]) -> list[tuple[str, str]]:
    sets = s.get("datasets")
    sets = sets if isinstance(sets, dict) else {}
    counts = "; ".join(
        f"{k}: {v.get('scored_cases', '?')} with a lesion, {v.get('empty_cases', '?')} with an empty mask"
        for k, v in sets.items()
        if isinstance(v, dict)
    )
    trained = s.get("trained")
    trained = trained if isinstance(trained, dict) else {}
    facts = [
        ("folder", "." if folder == run_dir else str(folder.relative_to(run_dir))),
        ("checkpoint", str(s.get("ckpt", "?"))),
        (
            "data",
            str(s.get("data_root") or "the recipe's validation split") + f" (split={s.get('split', '?')})",
        ),
        ("cases", counts or "?"),
        ("held out", ", ".join(map(str, s.get("heldout") or [])) or "none"),
    ]
    if trained:
        facts.append(("asked held out, but trained on", "; ".join(f"{k} ({v})" for k, v in trained.items())))
    return facts


def clean_line(rows: pd.DataFrame) -> Markup:
    """The clean Dice / IoU (%) of each dataset of a check, from its ``clean`` row."""
    if not len(rows):
        return Markup("")
    row = rows.iloc[0]
    names = [str(c)[: -len("/Dice")] for c in rows.columns if str(c).endswith("/Dice")]
    cells = [(n, row.get(f"{n}/Dice"), row.get(f"{n}/IoU")) for n in names]
    return Markup(
        _ENV.from_string(
            "<p>Clean, no perturbation (mean over cases with a lesion): {% for n, d, i in cells %}{{ n }}: Dice "
            "{{ d }} %, IoU {{ i }} %{% if not loop.last %}; {% endif %}{% endfor %}.</p>"
        ).render(cells=cells)
    )


def checks_section(run_dir: str | Path, table: Callable[..., Markup]) -> Markup:
    """HTML of every check of ``run_dir`` (``table(frame, fmt, index)`` renders a DataFrame)."""
    run_dir = Path(run_dir)
    parts = []
    for folder in check_folders(run_dir):
        s = check_file.summary(folder) or {}
        wide = efr_file.read_table(folder)
        tables = []
        families = []
        if wide is not None and "perturbation" in wide:  # the check's families (pooled rows are not one)
            families = [str(f) for f in dict.fromkeys(wide["perturbation"].astype(str))]
        if wide is not None and "threshold" in wide:
            for t, part in wide.groupby("threshold", sort=True):
                # the clean row holds Dice / IoU, not rates: shown under the table, not in its EFR columns
                clean = (
                    part["perturbation"].astype(str) == "clean" if "perturbation" in part else part.index < 0
                )
                rates = table(part[~clean].drop(columns=["threshold"]), "{}", False)
                tables.append((f"{float(t):g}", rates + clean_line(part[clean])))
        empty = check_file.read(folder, check_file.EMPTY)
        shown = None
        if empty is not None:
            e = empty.assign(
                specificity=(100 * pd.to_numeric(empty["specificity"], errors="coerce")).round(1)
            )
            shown = table(e.rename(columns={"specificity": "specificity (%)"}), "{:.1f}", False)
        parts.append(
            Markup(
                _ENV.from_string(ONE).render(
                    name=folder.name,
                    facts=_facts(run_dir, folder, s),
                    tables=tables,
                    empty=shown,
                    validity=validity_note(families),
                )
            )
        )
    if not parts:
        return Markup(
            "<p>no check of this run yet: <code>python -m robusttrain check recipe=NAME "
            "ckpt=RUN/checkpoints/last.ckpt heldout=endoscopy_heldout</code> writes one into RUN/checks/.</p>"
        )
    return Markup("").join(parts)
