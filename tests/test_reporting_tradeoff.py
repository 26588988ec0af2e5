"""The checkpoint trade-off: every policy's pick on one history, its plot and its report section."""

from __future__ import annotations

import json
import re

import matplotlib.image
import numpy as np
import pandas as pd
from test_reporting_helpers import make_run_dir

from robusttrain.cornercases import POLICIES
from robusttrain.cornercases.tradeoff import policy_tradeoff
from robusttrain.reporting import write_plots, write_report


def history(n_cases=20, n_epochs=8):
    """Cohort rises to 0.85; the two weakest cases peak at epoch 3 (0.6) and sit at 0.3 otherwise."""
    rows = []
    for e in range(n_epochs):
        for i in range(n_cases):
            v = min(0.5 + 0.05 * e, 0.85) + 0.001 * i
            if i < 2:
                v = 0.6 if e == 3 else 0.3
            rows.append({"case_id": f"c{i:02d}", "epoch": e, "dice_polyp": v})
    return pd.DataFrame(rows)


def test_policy_tradeoff_lists_every_policy_and_its_epoch():
    t = policy_tradeoff(history(), reference_epoch=7, worst_fraction=0.1)
    assert set(t.choices) == {"least_loss", "last", *POLICIES}
    assert t.choices["cvar"] == 3 and t.choices["last"] == 7 and t.choices["least_loss"] == 7
    assert t.table.loc[3, "cvar"] == 0.6 and t.table.loc[7, "cvar"] == 0.3
    assert t.table["cohort"].idxmax() == 7  # the cvar pick costs cohort Dice: a real trade-off
    assert list(t.table.index) == list(range(8))


def test_tradeoff_plot_and_report_section(tmp_path):
    run = make_run_dir(tmp_path / "run")
    history().to_csv(run / "history.csv", index=False)
    cc = json.loads((run / "corner_cases.json").read_text())
    cc.update({"worst_fraction": 0.1, "least_loss_epoch": 7, "corner_cases": [], "outlier_epochs": {}})
    (run / "corner_cases.json").write_text(json.dumps(cc))
    png = write_plots(run)["tradeoff"]
    img = matplotlib.image.imread(png)
    assert img.shape[1] > img.shape[0] > 300 and img.std() > 0.05
    text = write_report(run).read_text()
    section = text[text.index('<section id="tradeoff">') :]
    section = section[: section.index("</section>")]
    assert "worst 10 % of cases" in section and "data:image/png;base64," in section
    cells = re.search(r"<td>cvar</td>\s*<td>(\d+)</td>\s*<td>([\d.]+)</td>\s*<td>([\d.]+)</td>", section)
    assert cells and cells.group(1) == "3" and np.isclose(float(cells.group(3)), 0.6)


def test_tradeoff_section_says_what_is_missing(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=1)
    text = write_report(run).read_text()
    section = text[text.index('<section id="tradeoff">') :]
    assert "not available: fewer than two epochs" in section[: section.index("</section>")]
