"""PNG curves of a run, written to ``<run_dir>/plots/`` — the W&B charts for people without W&B.

Uses matplotlib's object API with the Agg canvas (never ``pyplot``), so it is safe in a training
process, in threads, and without a display. Every file is written atomically.

>>> import tempfile, pandas as pd
>>> run = tempfile.mkdtemp()
>>> pd.DataFrame({"case_id": ["a", "b"] * 2, "epoch": [0, 0, 1, 1],
...               "dice_lv": [.5, .6, .7, .8]}).to_csv(f"{run}/history.csv", index=False)
>>> sorted(p.name for p in write_plots(run).values())
['clean_dice.png', 'tradeoff.png']
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from robusttrain.io import atomic_write_bytes
from robusttrain.metamorphic.efr import THRESHOLDS, wilson_interval
from robusttrain.reporting import load
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir.corner_cases import Corners
from robusttrain.rundir.history import dice_columns

LEAST_LOSS_STYLE = dict(color="tab:red", linestyle="--", linewidth=1.5)
BALANCED_STYLE = dict(color="tab:green", linestyle="-", linewidth=2.0, alpha=0.7)


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """``fig`` rendered to PNG bytes."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # layout is fixed by each plot function (subplots_adjust): bbox_inches="tight" would draw twice
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Render ``fig`` to PNG bytes, then write them atomically (a reader never sees half a PNG)."""
    return atomic_write_bytes(path, png_bytes(fig, dpi))


def plain_text(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Case ids and file names go into titles and labels as they are: ``$...$`` in one must not be
    parsed as mathtext (a parse error would fail the plot; a valid one would print something else).
    ``parse_math`` is read when a Text is created, so the whole figure is built with it off."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context({"text.parse_math": False}):
            return fn(*args, **kwargs)

    return wrapper


def safe_name(text: str) -> str:
    """File-name-safe version of a case id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))


def efr_series(efr: pd.DataFrame, metric: str = "dice", split: str | None = None) -> pd.DataFrame:
    """EFR (%) per (epoch, perturbation, threshold), severities pooled as errors / cases, and the mean
    Dice on the perturbed images (``perturbed_dice``, %; NaN where an old file did not record it).

    Pooling sums, not averaging rates, matches the paper's EFR = errors / generated test cases.
    ``split`` defaults to ``val`` when present, else the first split in the file.
    """
    frame = efr_file.pool_severities(efr[efr["metric"] == metric])
    if "split" in frame and len(frame):
        splits = list(dict.fromkeys(frame["split"]))
        frame = frame[frame["split"] == (split or ("val" if "val" in splits else splits[0]))]
    # a budgeted check scores a few cases per test: its EFR is an estimate, drawn with its interval
    ci = [
        wilson_interval(int(e), int(n)) if n > 0 else (np.nan, np.nan)
        for e, n in zip(frame["errors"], frame["cases"])
    ]
    return frame.assign(
        efr=100.0 * frame["efr"],
        efr_low=[100.0 * lo for lo, _ in ci],
        efr_high=[100.0 * hi for _, hi in ci],
        perturbed_dice=100.0 * frame["mean_fol_dice"].astype(float),
    )


def _mark_epochs(ax, least_loss: int | None, balanced: int | None) -> None:
    if least_loss is not None:
        ax.axvline(least_loss, label=f"least-loss epoch {least_loss}", **LEAST_LOSS_STYLE)
    if balanced is not None:
        ax.axvline(balanced, label=f"balanced epoch {balanced}", **BALANCED_STYLE)


def _label(name: str, held: set[str]) -> str:
    return f"{name} (held out)" if name in held else str(name)


@plain_text
def plot_efr(
    efr: pd.DataFrame, metric: str = "dice", thresholds=THRESHOLDS, corners: Corners | None = None
) -> Figure:
    """One panel per threshold: EFR (%) over epochs, one line per perturbation; a last panel: the mean
    Dice on the perturbed images (%) the rates rest on (a rate can hide it: a model that segments less
    has less to lose), with the worst family's. Held-out (test-only) families are dashed and labelled."""
    series = efr_series(efr, metric)
    held = set(series.loc[series["heldout"].astype(bool), "perturbation"]) if len(series) else set()
    fig = Figure(figsize=(5.6 * (len(thresholds) + 1), 4.6))
    axes = fig.subplots(1, len(thresholds) + 1, squeeze=False)[0]
    for ax, t in zip(axes, thresholds):
        sub = series[(series["threshold"] - t).abs() < 1e-9]
        for name, g in sub.groupby("perturbation", sort=True):
            # "all" is the pooled row; draw it as the reference line
            if name == "all":
                ax.plot(g["epoch"], g["efr"], label=str(name), color="black", linewidth=2.5)
                ax.fill_between(g["epoch"], g["efr_low"], g["efr_high"], color="black", alpha=0.1)
                continue
            yerr = [(g["efr"] - g["efr_low"]).clip(lower=0), (g["efr_high"] - g["efr"]).clip(lower=0)]
            bars = ax.errorbar(
                g["epoch"],
                g["efr"],
                yerr=yerr,
                label=_label(str(name), held),
                marker="o",
                ms=3,
                capsize=2,
                elinewidth=0.8,
                alpha=0.85,
            )
            if name in held:
                bars.lines[0].set_linestyle("--")
        if corners is not None:
            _mark_epochs(ax, corners.least_loss_epoch, corners.balanced_epoch)
        ax.set_title(f"EFR ({metric.capitalize()}, t = {t:g}) per perturbation, 95 % Wilson CI", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("EFR (%)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if not ax.get_legend_handles_labels()[0]:
            ax.text(0.5, 0.5, f"no EFR rows at t = {t:g}", ha="center", transform=ax.transAxes)
    _plot_perturbed_dice(axes[-1], series, held, corners)
    # one shared legend below the panels: nine perturbations would cover the curves otherwise
    handles, labels = max((ax.get_legend_handles_labels() for ax in axes), key=lambda hl: len(hl[0]))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    rows = -(-len(labels) // 6) if handles else 0
    fig.subplots_adjust(left=0.05, right=0.98, top=0.92, bottom=0.14 + 0.05 * rows, wspace=0.2)
    return fig


def _plot_perturbed_dice(ax, series: pd.DataFrame, held: set[str], corners: Corners | None) -> None:
    """The mean perturbed Dice per perturbation over epochs (one threshold's rows: the Dice is the same
    in each), ``all`` as the thick reference and the worst family's Dice dotted."""
    if len(series):
        series = series[(series["threshold"] - series["threshold"].iloc[0]).abs() < 1e-9]
    if not len(series) or series["perturbed_dice"].isna().all():
        ax.text(
            0.5,
            0.5,
            "perturbed Dice not recorded\n(efr.csv predates it)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
        return
    for name, g in series.groupby("perturbation", sort=True):
        if name == "all":
            ax.plot(g["epoch"], g["perturbed_dice"], label=str(name), color="black", linewidth=2.5)
            worst = g["worst_family_dice"].astype(float) * 100
            if worst.notna().any():
                ax.plot(g["epoch"], worst, label="worst family", color="tab:red", linestyle=":", linewidth=2)
            continue
        style = "--" if name in held else "-"
        ax.plot(
            g["epoch"],
            g["perturbed_dice"],
            label=_label(str(name), held),
            linestyle=style,
            marker="o",
            ms=3,
            alpha=0.85,
        )
    if corners is not None:
        _mark_epochs(ax, corners.least_loss_epoch, corners.balanced_epoch)
    ax.set_title("Mean Dice on the perturbed images, per perturbation", fontsize=9)
    ax.set_xlabel("epoch")
    ax.set_ylabel("perturbed Dice (%)")
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)


@plain_text
def plot_clean_dice(history: pd.DataFrame, corners: Corners | None = None) -> Figure:
    """Cohort-mean clean validation Dice per class and overall, over epochs."""
    dice = load.clean_dice(history)
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for col in dice.columns:
        style: dict[str, Any] = (
            dict(color="black", linewidth=2.5) if col == "mean" else dict(marker="o", ms=3)
        )
        ax.plot(dice.index, dice[col], label=col if col != "mean" else "mean over classes", **style)
    if corners is not None:
        _mark_epochs(ax, corners.least_loss_epoch, corners.balanced_epoch)
    ax.set_title(f"Clean validation Dice (cohort mean, {history['case_id'].nunique()} cases)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("Dice")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.subplots_adjust(left=0.11, right=0.97, top=0.91, bottom=0.12)
    return fig


@plain_text
def plot_corner_case(history: pd.DataFrame, case_id: str, corners: Corners | None = None) -> Figure:
    """One panel per class: the case's Dice over epochs against the cohort mean (and its IQR)."""
    cols = dice_columns(history)
    case = history[history["case_id"] == str(case_id)].sort_values("epoch")
    # one panel per class, but never narrower than the legend and title need (1-class datasets)
    width = max(4.2 * max(len(cols), 1), 8.0)
    fig = Figure(figsize=(width, 4.4))
    axes = fig.subplots(1, max(len(cols), 1), squeeze=False)[0]
    outliers = set(corners.outlier_epochs.get(str(case_id), [])) if corners else set()
    for ax, col in zip(axes, cols):
        by_epoch = history.groupby("epoch")[col]
        q25, q75 = by_epoch.quantile(0.25), by_epoch.quantile(0.75)
        ax.fill_between(q25.index, q25.values, q75.values, color="tab:blue", alpha=0.15, label="cohort IQR")
        ax.plot(
            by_epoch.mean().index, by_epoch.mean().values, color="tab:blue", linewidth=2, label="cohort mean"
        )
        ax.plot(
            case["epoch"],
            case[col],
            color="tab:orange",
            marker="o",
            ms=3,
            linewidth=2,
            label=f"case {case_id}",
        )
        out = case[case["epoch"].isin(outliers)]
        if len(out):
            ax.scatter(
                out["epoch"], out[col], marker="x", s=60, color="tab:red", zorder=5, label="outlier epoch"
            )
        if corners is not None:
            _mark_epochs(ax, corners.least_loss_epoch, corners.balanced_epoch)
        ax.set_title(f"{case_id}: {col}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("Dice")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    # one legend for all panels, below them, so it never hides a curve
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = min(len(labels), max(3, int(width // 1.6)))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    legend_rows = -(-len(labels) // ncol)
    fig.suptitle(f"Corner case {case_id}: per-class Dice vs cohort", fontweight="bold")
    fig.subplots_adjust(
        left=0.07, right=0.98, top=0.84, bottom=(0.55 + 0.22 * legend_rows) / 4.4, wspace=0.22
    )
    return fig


POLICY_MARKERS = {
    "least_loss": ("s", "tab:red"),
    "last": ("D", "tab:gray"),
    "last_inlier": ("o", "tab:blue"),
    "maximin": ("^", "tab:orange"),
    "pareto": ("v", "tab:purple"),
    "cvar": ("*", "tab:green"),
}


def run_tradeoff(history: pd.DataFrame, corners: Corners | None = None):
    """:func:`robusttrain.cornercases.tradeoff.policy_tradeoff` with the run's own settings
    (reference epoch, candidates, contamination, min_epoch, worst_fraction from ``corner_cases.json``)."""
    from robusttrain.cornercases.tradeoff import policy_tradeoff

    raw = corners.raw if corners is not None else {}
    return policy_tradeoff(
        history,
        reference_epoch=corners.least_loss_epoch if corners is not None else None,
        candidates=raw.get("candidate_epochs") or None,
        contamination=float(raw.get("contamination") or 0.1),
        tail=str(raw.get("tail") or "low"),
        min_epoch=int(raw.get("min_epoch") or 0),
        worst_fraction=float(raw.get("worst_fraction") or 0.1),
    )


@plain_text
def plot_tradeoff(trade) -> Figure:
    """Cohort mean vs mean of the worst k % of cases, one point per epoch (joined in epoch order),
    with the epoch each checkpoint policy picks marked. Up and right is better on both axes."""
    tab = trade.table.dropna(subset=["cohort", "cvar"])
    fig = Figure(figsize=(7.0, 5.8))
    ax = fig.subplots()
    ax.plot(tab["cohort"], tab["cvar"], color="0.75", linewidth=1, zorder=1)
    pts = ax.scatter(tab["cohort"], tab["cvar"], c=tab.index.to_numpy(), cmap="viridis", s=22, zorder=2)
    fig.colorbar(pts, ax=ax, label="epoch")
    for e, r in tab.iterrows():
        ax.annotate(str(e), (r["cohort"], r["cvar"]), xytext=(3, 3), textcoords="offset points", fontsize=7)
    # several policies often pick the same epoch: shrinking hollow markers keep each one visible
    for k, (name, epoch) in enumerate(trade.choices.items()):
        if epoch is None or epoch not in tab.index:
            continue
        marker, colour = POLICY_MARKERS.get(name, ("P", "black"))
        ax.scatter(
            [tab.loc[epoch, "cohort"]],
            [tab.loc[epoch, "cvar"]],
            s=320 - 40 * k,
            marker=marker,
            facecolors="none",
            edgecolors=colour,
            linewidths=1.8,
            zorder=3,
            label=f"{name}: epoch {epoch}",
        )
    pct = f"{100 * trade.worst_fraction:g}"
    ax.set_title(f"Checkpoint trade-off: cohort mean vs worst {pct} % of cases")
    ax.set_xlabel("cohort mean Dice")
    ax.set_ylabel(f"mean Dice of the worst {pct} % of cases")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # below the axes: the picks sit at the curve's corners
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, markerscale=0.5)
    fig.subplots_adjust(left=0.11, right=0.97, top=0.93, bottom=0.24)
    return fig


MAX_CASE_PLOTS = 24  # per-case curves drawn for a report: a run may flag hundreds of cases


def render_plots(
    run_dir: str | Path,
    corners: Corners | None = None,
    corner_cases: list[str] | None = None,
    max_cases: int | None = None,
) -> dict[str, tuple[str, bytes]]:
    """Every plot the run directory's files allow, as ``{name: (file name, PNG bytes)}``; nothing is
    written (a report of a shared or read-only run directory leaves it untouched). ``max_cases`` bounds
    the per-case plots (the first ``max_cases`` flagged cases, in the file's order)."""
    run_dir = Path(run_dir)
    corners = corners if corners is not None else load.load_corners(run_dir)
    cases = list(corner_cases if corner_cases is not None else (corners.cases if corners else []))
    history, efr = load.load_history(run_dir), load.load_efr(run_dir)
    out: dict[str, tuple[str, bytes]] = {}
    if efr is not None:
        out["efr"] = ("efr.png", png_bytes(plot_efr(efr, corners=corners)))
    if history is not None and load.dice_columns(history):
        out["clean_dice"] = ("clean_dice.png", png_bytes(plot_clean_dice(history, corners)))
        if history["epoch"].nunique() >= 2:
            out["tradeoff"] = ("tradeoff.png", png_bytes(plot_tradeoff(run_tradeoff(history, corners))))
        known = set(history["case_id"])
        for cid in [c for c in cases if str(c) in known][:max_cases]:
            out[f"corner_{cid}"] = (
                f"corner_{safe_name(cid)}.png",
                png_bytes(plot_corner_case(history, cid, corners)),
            )
    return out


def write_plots(
    run_dir: str | Path, corners: Corners | None = None, corner_cases: list[str] | None = None
) -> dict[str, Path]:
    """(Re)generate every plot the run directory's files allow into ``<run_dir>/plots/``; returns
    {name: path}. ``corners``/``corner_cases`` override ``corner_cases.json`` (the live callback passes
    the currently flagged cases before the file exists at fit end).
    """
    out_dir = Path(run_dir) / "plots"
    return {
        name: atomic_write_bytes(out_dir / fname, data)
        for name, (fname, data) in render_plots(run_dir, corners, corner_cases).items()
    }
