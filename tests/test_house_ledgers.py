"""Issue 47 §1: each callback drives one Lightning-free ledger; callbacks/ keep hooks, collectives, files and
logs -- no DataFrame assembly there --, the EFR table is assembled in one place, and metamorphic/ never
imports rundir/ (the house's layering: rundir reads metamorphic's schemas, not the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

PACKAGE = Path(__file__).resolve().parents[1] / "robusttrain"

# calls that build a DataFrame: pandas' constructors / combiners, and a frame's reshaping methods. A
# callback hands rows to its ledger (or to rundir/ to write) and reads tables back; it never builds one.
PD_BUILDERS = {"DataFrame", "Series", "concat", "merge", "pivot_table", "crosstab", "melt"}
FRAME_BUILDERS = {"groupby", "pivot", "pivot_table", "melt", "merge", "explode", "stack", "unstack"}


def _calls(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every DataFrame-building call in ``path`` (``pd.X(...)`` / ``pandas.X(...)``
    and ``<anything>.groupby(...)``-style methods)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if isinstance(f.value, ast.Name) and f.value.id in ("pd", "pandas") and f.attr in PD_BUILDERS:
            out.append((node.lineno, f"pd.{f.attr}("))
        elif f.attr in FRAME_BUILDERS:
            out.append((node.lineno, f".{f.attr}("))
    return out


def _named_calls(name: str) -> list[str]:
    """``file:line`` of every call of a function called ``name`` in the package."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if called == name:
                    hits.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return hits


def test_the_rule_sees_what_it_forbids(tmp_path):
    # the AST rule itself: it must flag the three shapes _record used to have, and not a plain list join
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import pandas as pd\nx = pd.DataFrame(rows)\ny = pd.concat([a, b])\nz = f.groupby('k').sum()\n"
        "w = ', '.join(names)\n"
    )
    assert [w for _, w in _calls(probe)] == ["pd.DataFrame(", "pd.concat(", ".groupby("]


def test_no_callback_assembles_a_dataframe():
    found = {
        f"{p.name}:{line}": what
        for p in sorted((PACKAGE / "callbacks").glob("*.py"))
        for line, what in _calls(p)
    }
    assert not found, f"DataFrame assembly in callbacks/ (move it to the callback's ledger): {found}"


def test_one_efr_table_assembly_in_the_package():
    # efr_table (metamorphic/efr.py) is called once: by ledger.efr_rows, which labels the rows for the
    # MetamorphicCallback's checks (through CheckLedger.update) and for audit() alike
    hits = _named_calls("efr_table")
    assert len(hits) == 1 and hits[0].startswith("metamorphic/ledger.py:"), hits
    users = sorted({hit.split(":")[0] for hit in _named_calls("efr_rows")})
    assert users == ["metamorphic/audit.py", "metamorphic/ledger.py"], users


def test_metamorphic_never_imports_rundir():
    ups = []
    for path in sorted((PACKAGE / "metamorphic").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            ups += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("robusttrain.rundir")]
    assert not ups, ups


def _scored(epoch: int, fol: dict[str, float], split: str = "val") -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = list(fol)
    hist = pd.DataFrame({"case_id": ids, "epoch": epoch, "dice_fg": 0.9, "iou_fg": 0.8})
    scored = pd.DataFrame(
        {
            "epoch": epoch,
            "split": split,
            "case_id": ids,
            "perturbation": "blur",
            "severity": 2,
            "src_dice": 0.9,
            "fol_dice": [fol[c] for c in ids],
            "src_iou": 0.8,
            "fol_iou": [fol[c] - 0.1 for c in ids],
        }
    )
    return hist, scored


def test_a_recheck_replaces_and_the_rotation_takes_every_pair_s_latest_score():
    from robusttrain.metamorphic.ledger import CheckLedger

    ledger = CheckLedger(thresholds=(0.25,))
    ledger.update(*_scored(0, {"a": 0.1, "b": 0.9}), epoch=0, split="val", suite_cases=3)
    ledger.update(*_scored(1, {"a": 0.9}), epoch=1, split="val", suite_cases=3)
    ledger.update(*_scored(1, {"a": 0.9}), epoch=1, split="val", suite_cases=3)  # a re-check: no duplicate
    assert len(ledger.history) == 3 and len(ledger.cases) == 3
    # the final check tops epoch 1 up with c and takes a's latest score (epoch 1), b's from epoch 0
    entry = ledger.update(
        *_scored(1, {"c": 0.1}), epoch=1, split="val", suite_cases=3, final=True, basis="rotation"
    )
    row = entry.table.query("perturbation == 'all' and metric == 'dice'").iloc[0]
    assert (row.errors, row.cases, row.suite_cases, row.from_epoch, row.basis) == (1, 3, 3, 0, "rotation")
    assert sorted(ledger.cases.query("epoch == 1").case_id) == ["a", "c"]
    assert len(ledger.efr.query("epoch == 1")) == len(entry.table)  # epoch 1's rows replaced, not added


def test_the_ledger_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import torch

    from robusttrain.metamorphic.ledger import CheckLedger

    ledger = CheckLedger(thresholds=(0.25, 0.5))
    ledger.update(*_scored(0, {"a": 0.1, "b": 0.9}), epoch=0, split="val")
    ledger.update(*_scored(0, {"a": 0.2}, split="train"), epoch=0, split="train")
    torch.save(ledger.state_dict(), tmp_path / "s.pt")
    again = CheckLedger(thresholds=(0.25, 0.5))
    again.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    for mine, theirs in zip(ledger.tables(), again.tables()):
        pd.testing.assert_frame_equal(mine.reset_index(drop=True), theirs, check_dtype=False)
