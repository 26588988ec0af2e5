"""The tables of a run's metamorphic checks in one Lightning-free object, and the one EFR-table assembly.

:class:`CheckLedger` holds what every check of a run scored -- ``history`` (the clean per-case scores of
the validation probe: ``history.csv``), ``cases`` (every scored test case: ``mr_cases.csv``) and ``efr``
(every check's EFR rows: ``efr.csv``) -- in the style of a torchmetrics ``Metric``: :meth:`~CheckLedger.update`
with one check's scored cases, :meth:`~CheckLedger.tables`, :meth:`~CheckLedger.state_dict` /
:meth:`~CheckLedger.load_state_dict` (resume). The MetamorphicCallback drives it (hooks, ranks, files,
logs); :func:`efr_rows` is the one place an EFR table gets its labels, for the callback's checks and for
``audit()`` alike.

How ranks combine (:data:`RANK_MERGE`): nothing is merged here. Each rank scores its shard and
:func:`~robusttrain.metamorphic.check.run_check` gathers and merges the shards before the ledger sees
them, so every rank updates its ledger with the same rows and holds the same tables; rank 0 writes them.

>>> import pandas as pd
>>> hist = pd.DataFrame({"case_id": ["a", "b"], "epoch": 0, "dice_fg": [0.9, 0.8]})
>>> scored = pd.DataFrame({"epoch": 0, "split": "val", "case_id": ["a", "b"], "perturbation": "blur",
...                        "severity": 2, "src_dice": [0.9, 0.8], "fol_dice": [0.3, 0.8],
...                        "src_iou": [0.8, 0.7], "fol_iou": [0.2, 0.7]})
>>> ledger = CheckLedger(thresholds=(0.25,))
>>> entry = ledger.update(hist, scored, epoch=0, split="val")
>>> t = ledger.tables()
>>> len(t.history), len(t.cases), t.efr.query("perturbation == 'all' and metric == 'dice'").efr.tolist()
(2, 2, [0.5])
>>> again = CheckLedger(thresholds=(0.25,))
>>> again.load_state_dict(ledger.state_dict())
>>> again.tables().efr.equals(t.efr)
True
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from .efr import EFR_COLUMNS, THRESHOLDS, efr_table, format_efr_console
from .rotation import PAIR, latest_scores

# how the ranks' rows of each table combine (torchmetrics declares a reduction beside each state):
# "replicated" -- run_check gathers every rank's shard before update, so each rank holds the same rows
RANK_MERGE = {"history": "replicated", "efr": "replicated", "cases": "replicated"}


class CheckLabel(NamedTuple):
    """What a training-time check's EFR rows say about themselves (``efr.csv``'s last columns)."""

    epoch: int
    final: bool
    basis: str  # subset | suite | rotation
    from_epoch: int


def efr_rows(
    cases: pd.DataFrame,
    thresholds: Sequence[float],
    split: str,
    suite_cases: int | None = None,
    heldout: Collection[str] = (),
    check: CheckLabel | None = None,
) -> pd.DataFrame:
    """The EFR table of one split's scored ``cases``: ``split`` and
    :func:`~robusttrain.metamorphic.efr.efr_table`'s columns; with ``check`` (a training-time check)
    ``epoch`` first and ``final, basis, from_epoch`` last -- ``efr.csv``'s :data:`EFR_COLUMNS`.

    >>> cases = pd.DataFrame({"perturbation": "blur", "severity": [2], "src_dice": [0.8], "fol_dice": [0.2],
    ...                       "src_iou": [0.6], "fol_iou": [0.1]})
    >>> list(efr_rows(cases, (0.25,), "val", check=CheckLabel(3, True, "suite", 3)).columns) == EFR_COLUMNS
    True
    >>> efr_rows(cases, (0.25,), "kvasir").columns[:3].tolist()   # an audit's table
    ['split', 'perturbation', 'severity']
    """
    table = efr_table(cases, thresholds, suite_cases=suite_cases, heldout=heldout)
    table.insert(0, "split", split)
    if check is not None:
        table.insert(0, "epoch", check.epoch)
        table["final"] = bool(check.final)
        table["basis"] = check.basis
        table["from_epoch"] = check.from_epoch
    return table


class CheckTables(NamedTuple):
    """A ledger's tables: ``history.csv``, ``efr.csv`` and ``mr_cases.csv`` of the run so far."""

    history: pd.DataFrame
    efr: pd.DataFrame
    cases: pd.DataFrame


@dataclass
class CheckEntry:
    """What one :meth:`CheckLedger.update` added: the check's EFR rows (``table``), its clean per-case rows
    (``history``), its scored test cases (``scored``) and the label of the rows."""

    table: pd.DataFrame
    history: pd.DataFrame
    scored: pd.DataFrame
    label: CheckLabel
    split: str

    def without(self, families: Collection[str]) -> pd.DataFrame:
        """The scored test cases of every family but ``families`` (the held-out ones never reach the
        failure sinks: training must never see a test-only family)."""
        s = self.scored
        return s[~s["perturbation"].isin(list(families))] if len(s) else s

    def clean_dice(self) -> float | None:
        """The mean clean Dice of the check's cases (None without Dice columns or cases)."""
        cols = [c for c in self.history.columns if str(c).startswith("dice_")]
        if not cols or not len(self.history):
            return None
        return float(self.history[cols].mean(axis=1).mean())

    def console(self) -> str:
        """The check's EFR table as text, titled with what it rests on (the console line of each check)."""
        t, (epoch, final, basis, from_epoch) = self.table, self.label
        n_all = t[(t.perturbation == "all")]
        scored = (
            f"{int(n_all.cases.iloc[0])}/{int(n_all.suite_cases.iloc[0])} test cases"
            if len(n_all)
            else "no test cases"
        )
        kind = (
            {
                "rotation": f"final: every test case once, its latest score, weights of epochs {from_epoch}-{epoch}",
                "suite": "final, whole suite",
            }.get(basis, self.split)
            if final
            else self.split
        )
        title = f"MR check, epoch {epoch} ({kind}): EFR % over {len(self.history)} cases, {scored}"
        return format_efr_console(t, title)


class CheckLedger:
    """Every check's tables of one run (module doc): updated per check, saved and restored with the run.

    Args:
        thresholds: the EFR thresholds of every table (relative Dice / IoU drop).
    """

    def __init__(self, thresholds: Sequence[float] = THRESHOLDS) -> None:
        self.thresholds = tuple(thresholds)
        self.history = pd.DataFrame(columns=["case_id", "epoch"])
        self.efr = pd.DataFrame(columns=EFR_COLUMNS)
        self.cases = pd.DataFrame()

    def update(
        self,
        history: pd.DataFrame,
        scored: pd.DataFrame,
        epoch: int,
        split: str,
        suite_cases: int | None = None,
        final: bool = False,
        basis: str = "subset",
        heldout: Collection[str] = (),
    ) -> CheckEntry:
        """Add one check of ``split`` at ``epoch``: its clean rows ``history`` (kept for ``"val"``) and
        scored test cases ``scored`` (:func:`~robusttrain.metamorphic.runner.aggregate`'s two frames).

        A re-check of (epoch, split) replaces its rows; with ``basis="rotation"`` (the final check of a
        budgeted run) it tops the epoch's cases up, and the EFR rows take every pair's latest score of the
        run (:mod:`robusttrain.metamorphic.rotation`). ``suite_cases``: the probe's cases (coverage);
        ``heldout``: the families labelled held out."""
        cases = scored
        if basis == "rotation" and len(self.cases):  # a top-up of an epoch already checked adds to it
            old = self.cases[(self.cases["epoch"] == epoch) & (self.cases["split"] == split)]
            if len(old):
                new = set(map(tuple, scored[PAIR].astype(str).values))
                keep = [tuple(r) not in new for r in old[PAIR].astype(str).values]
                cases = pd.concat([old[keep], scored], ignore_index=True)
        self.cases = _replace(self.cases, cases, epoch, split)
        basis_cases, from_epoch = cases, epoch
        if basis == "rotation":  # every pair once, its latest score
            basis_cases = latest_scores(self.cases[self.cases["split"] == split])
            from_epoch = int(basis_cases["epoch"].min()) if len(basis_cases) else epoch
        label = CheckLabel(epoch, bool(final), basis, from_epoch)
        table = efr_rows(basis_cases, self.thresholds, split, suite_cases, heldout, check=label)
        self.efr = _replace(self.efr, table, epoch, split)
        if split == "val":  # history.csv is the clean validation history (corner-case input)
            keep = self.history[self.history["epoch"] != epoch] if len(self.history) else self.history
            self.history = pd.concat([keep, history], ignore_index=True) if len(keep) else history
        return CheckEntry(table, history, scored, label, split)

    def tables(self) -> CheckTables:
        """The run's tables so far (each update replaces the frames: a reader's copy never changes)."""
        return CheckTables(self.history, self.efr, self.cases)

    def state_dict(self) -> dict[str, Any]:
        """The tables as plain python lists (loadable with ``torch.load(weights_only=True)``)."""
        return {
            "history": _to_state(self.history),
            "efr": _to_state(self.efr),
            "cases": _to_state(self.cases),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = _from_state(state["history"])
        self.efr = _from_state(state["efr"])
        self.cases = _from_state(state["cases"])


def _replace(frame: pd.DataFrame, new: pd.DataFrame, epoch: int, split: str) -> pd.DataFrame:
    """``frame`` without rows of (epoch, split), plus ``new`` (a re-check replaces, never duplicates)."""
    if len(frame) and "epoch" in frame:
        frame = frame[~((frame["epoch"] == epoch) & (frame["split"] == split))]
    return pd.concat([frame, new], ignore_index=True) if len(frame) else new.reset_index(drop=True)


def _to_state(frame: pd.DataFrame) -> dict[str, list]:
    return {
        "columns": [str(c) for c in frame.columns],
        "data": [[_py(v) for v in frame[c].tolist()] for c in frame.columns],
    }


def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _from_state(state: dict[str, list]) -> pd.DataFrame:
    return pd.DataFrame(dict(zip(state["columns"], state["data"])), columns=state["columns"])
