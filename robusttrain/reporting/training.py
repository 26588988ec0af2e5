"""The training side of a run for the report: what metamorphic training drew and kept per family and
epoch (``metamorphic_training.csv``), what failure mining did per epoch (``failures/mining.csv``:
:func:`mining_epochs`), and which epochs the balanced average holds
(``balanced_average.json``) with their clean and worst-case Dice against the last epoch's
(``history.csv``).

Everything comes from run-directory files, so it is untrusted: read through :mod:`robusttrain.rundir`
(no symlinks, torn rows refused), coerced to plain numbers and strings here (a value of the wrong type
reads as missing, never as code), and rendered by the caller with autoescape.

>>> import pandas as pd
>>> stats = pd.DataFrame({"epoch": [0, 0, 1], "family": ["blur", "jpeg", "blur"],
...                       "candidates": [8, 4, 8], "chosen": [4, 2, 3], "rejected": [0, 1, 2]})
>>> family_totals(stats).to_dict("index")["blur"]
{'epochs': 2, 'drawn': 16, 'kept': 7, 'rejected': 2, 'kept %': 43.75}
>>> per_epoch(stats).loc[1, "blur"]
'3 / 8 (2 rejected)'
"""

from __future__ import annotations

import math
import os
from typing import Any

import pandas as pd

from robusttrain.cornercases.balanced import worst_fraction_mean
from robusttrain.rundir import balanced_average as average_file
from robusttrain.rundir import layout
from robusttrain.rundir import metamorphic_training as mt_file
from robusttrain.rundir import mining as mining_file
from robusttrain.rundir.history import dice_columns
from robusttrain.rundir.paths import locate

WORST = 0.1  # the worst-case Dice: mean of the worst 10 % of cases (CVaR), as BalancedCheckpoint's


def _count(frame: pd.DataFrame, column: str) -> pd.Series:
    return (
        pd.to_numeric(frame[column], errors="coerce").fillna(0)
        if column in frame
        else pd.Series(0, frame.index)
    )


def family_totals(stats: pd.DataFrame) -> pd.DataFrame:
    """Per family over all epochs: epochs, drawn (candidates), kept (chosen), rejected, kept %."""
    f = pd.DataFrame(
        {
            "family": stats["family"].astype(str),
            "epoch": stats["epoch"],
            "drawn": _count(stats, "candidates"),
            "kept": _count(stats, "chosen"),
            "rejected": _count(stats, "rejected"),
        }
    )
    out = f.groupby("family", sort=False).agg(
        epochs=("epoch", "nunique"),
        drawn=("drawn", "sum"),
        kept=("kept", "sum"),
        rejected=("rejected", "sum"),
    )
    out[["drawn", "kept", "rejected"]] = out[["drawn", "kept", "rejected"]].astype(int)
    out["kept %"] = (100 * out["kept"] / out["drawn"].where(out["drawn"] > 0)).round(2)
    return out


def per_epoch(stats: pd.DataFrame) -> pd.DataFrame:
    """Rows epoch, columns family: ``kept / drawn (rejected)``."""
    cell = (
        _count(stats, "chosen").astype(int).astype(str)
        + " / "
        + _count(stats, "candidates").astype(int).astype(str)
        + " ("
        + _count(stats, "rejected").astype(int).astype(str)
        + " rejected)"
    )
    f = pd.DataFrame({"epoch": stats["epoch"], "family": stats["family"].astype(str), "cell": cell})
    return f.pivot_table(index="epoch", columns="family", values="cell", aggfunc="first", sort=False)


# failures/mining.csv columns the report shows (steer mode's, then replay's), with their headings
MINING_COLUMNS = {
    "conditions": "conditions in the bank",
    "failures": "failing conditions",
    "repaired": "repaired",
    "new_failures": "new failures (passed before)",
    "steered_share": "steered share",
    "bank_size": "failures in the bank",
    "replayed": "replayed samples",
}


def mining_epochs(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per epoch, the mining counts of ``failures/mining.csv`` the report shows (numbers only; a
    cell that is not one reads as missing); None without the file or an epoch column.

    >>> f = pd.DataFrame({"epoch": [0, 1], "bank_size": [3, 4], "conditions": [3, 2], "repaired": [0, 1],
    ...                   "new_failures": [0, 1], "steered_share": [0.0, "x"]})
    >>> mining_epochs(f).to_dict("index")[1]
    {'conditions in the bank': 2, 'repaired': 1, 'new failures (passed before)': 1, 'steered share': nan, 'failures in the bank': 4}
    """
    if frame is None or "epoch" not in frame:
        return None
    epochs = pd.to_numeric(frame["epoch"], errors="coerce")
    keep = epochs.notna()
    out = pd.DataFrame(
        {
            label: pd.to_numeric(frame[c], errors="coerce")[keep]
            for c, label in MINING_COLUMNS.items()
            if c in frame
        }
    )
    out.index = epochs[keep].astype(int).rename("epoch")
    return out


def read_mining(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    """:func:`mining_epochs` of the run's ``failures/mining.csv`` (None when absent)."""
    return mining_epochs(mining_file.read(run_dir))


def read_average(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``balanced_average.json`` through its run-directory reader (values no run writes refused)."""
    return average_file.read_checked(run_dir)


def _epochs(value: Any) -> list[int]:
    """A list of epoch numbers from an untrusted value ([] for anything else)."""
    if not isinstance(value, list):
        return []
    return [
        int(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]


def average_summary(report: dict[str, Any]) -> dict[str, str]:
    """The plain facts of ``balanced_average.json`` as strings (untrusted values coerced)."""
    window = report.get("window")
    bn: dict[str, Any] = report["bn"] if isinstance(report.get("bn"), dict) else {}
    flags: dict[str, Any] = report["outlier_epochs"] if isinstance(report.get("outlier_epochs"), dict) else {}
    return {
        "status": str(report.get("status", "?")),
        "window": _window(window, report.get("rule")),
        "window epochs": ", ".join(map(str, _epochs(report.get("window_epochs")))) or "none",
        "averaged epochs": ", ".join(map(str, _epochs(report.get("averaged_epochs")))) or "none",
        "excluded (ECOD-flagged)": ", ".join(map(str, _epochs(report.get("excluded_epochs")))) or "none",
        "missing (weights not on disk)": ", ".join(map(str, _epochs(report.get("missing_epochs")))) or "none",
        "corner cases with outlier epochs": str(len(flags)),
        "BatchNorm re-estimated": f"{bool(bn.get('reestimated'))} ({bn.get('batches', 0)} batches)",
        "checkpoint": str(report.get("checkpoint") or "none"),
        "reason": str(report.get("reason", "")),
    }


def _window(window: Any, rule: Any) -> str:
    """The window setting in words; ``lr_tail`` falls back to the last half when the run had no tail."""
    if window == "lr_tail":
        if rule == "fraction":
            return "lr_tail: the run had no constant-LR tail, so the last 50 % of the validated epochs"
        return "lr_tail: the epochs of the constant-LR tail"
    if isinstance(window, (int, float)) and not isinstance(window, bool):
        return f"last {100 * window:g} % of the validated epochs"
    return "not recorded"


def window_dice(history: pd.DataFrame, report: dict[str, Any]) -> pd.DataFrame | None:
    """Clean mean Dice and worst-10 % Dice (per-case Dice averaged over classes) of the averaged
    epochs (their mean), the whole window's, and the last epoch's; ``cases`` = how many each rests on."""
    cols = dice_columns(history)
    if not cols:
        return None
    per_case = history.assign(_dice=history[cols].mean(axis=1))
    last = int(per_case["epoch"].max())
    groups = {
        "averaged epochs (mean)": _epochs(report.get("averaged_epochs")),
        "window epochs (mean)": _epochs(report.get("window_epochs")),
        f"last epoch ({last})": [last],
    }
    rows = {}
    for name, epochs in groups.items():
        sub = per_case[per_case["epoch"].isin(epochs)]
        if sub.empty:
            continue
        by_epoch = sub.groupby("epoch")["_dice"]
        rows[name] = {
            "epochs": len(by_epoch),
            "cases": int(sub["case_id"].nunique()),
            "clean Dice": float(by_epoch.mean().mean()),
            f"worst {100 * WORST:g} % Dice": float(
                by_epoch.apply(lambda s: worst_fraction_mean(s, WORST)).mean()
            ),
        }
    # one row per group, each column its own dtype: the counts stay integers (a transpose made them floats)
    return pd.DataFrame.from_dict(rows, orient="index") if rows else None


def has_ema(run_dir: str | os.PathLike) -> bool:
    """``ema.ckpt`` is a regular file of the run directory (a symlink is refused, as by every reader)."""
    return locate(run_dir, layout.EMA_CKPT) is not None


def read_stats(run_dir: str | os.PathLike) -> pd.DataFrame | None:
    stats = mt_file.read_stats(run_dir)
    if stats is None or not {"epoch", "family"} <= set(stats.columns):
        return None
    return stats
