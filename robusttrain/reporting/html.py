"""One self-contained ``report.html`` per run: every image inlined as base64, no scripts, no network.

Each section reads its own file and, when that file is missing, says so ("not available: efr.csv
missing") instead of failing — a report of a half-finished run is still useful.

>>> import tempfile
>>> path = write_report(tempfile.mkdtemp())
>>> "not available: history.csv missing" in path.read_text()
True
"""
from __future__ import annotations

import base64
import html
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from robusttrain.io import atomic_write_text
from robusttrain.reporting import load, plots, tables
from robusttrain.rundir.history import dice_columns

log = logging.getLogger(__name__)
WORST_FAILURES = 12

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1200px;padding:1rem 2rem;color:#222;background:#fff}
h1{border-bottom:3px solid #2a6f97;padding-bottom:.3rem}
h2{color:#2a6f97;border-bottom:1px solid #ccc;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}
th{background:#eef4f8} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:.3rem 0}
.na{color:#8a6d3b;background:#fcf8e3;border:1px solid #faebcc;padding:.4rem .8rem;border-radius:4px}
.strip{display:flex;gap:.5rem;align-items:flex-start;margin:.6rem 0;padding:.5rem;border:1px solid #eee}
.strip img{max-height:180px;width:auto}
.meta{font-size:.85rem;min-width:14rem} pre{background:#f6f8fa;padding:.6rem;overflow:auto;font-size:.8rem}
nav a{margin-right:1rem}
"""

SECTIONS = [("summary", "Run summary"), ("clean-dice", "Clean Dice"), ("efr-table", "EFR table"),
            ("efr-curves", "EFR curves"), ("corner-cases", "Corner cases"),
            ("tradeoff", "Checkpoint trade-off"),
            ("failures", "Worst failures"), ("gallery", "Perturbation gallery")]


def _na(what: str) -> str:
    return f'<p class="na">not available: {html.escape(what)}</p>'


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(frame: pd.DataFrame, float_format: str = "{:.1f}", index: bool = True) -> str:
    return frame.to_html(float_format=lambda v: float_format.format(v), na_rep="–", border=0,
                         escape=True, index=index)


def _summary(run_dir: Path, history, efr, ctx) -> str:
    facts = {"run directory": str(run_dir.resolve())}
    if history is not None:
        facts["validation cases"] = history["case_id"].nunique()
        facts["epochs with history"] = history["epoch"].nunique()
        facts["classes"] = ", ".join(c[5:] for c in dice_columns(history))
    if efr is not None:
        facts["perturbations"] = ", ".join(p for p in dict.fromkeys(efr["perturbation"]) if p != "all")
        # severity 0 marks the MR callback's pooled rows, not a severity that was run
        facts["severities"] = ", ".join(str(s) for s in sorted(efr["severity"].unique()) if s > 0)
    files = [n for n in (load.CONFIG, load.HISTORY, load.EFR, load.EFR_TABLE, load.CORNERS,
                         load.FAILURES, "balanced.ckpt") if (run_dir / n).exists()]
    facts["files"] = ", ".join(files) or "none"
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in facts.items())
    config = load.load_config_text(run_dir)
    cfg = (f"<details><summary>config.yaml</summary><pre>{html.escape(config)}</pre></details>"
           if config else _na("config.yaml missing"))
    return f"<table>{rows}</table>{cfg}"


def _clean_dice(run_dir, history, efr, ctx) -> str:
    if history is None:
        return _na("history.csv missing")
    dice = load.clean_dice(history)
    corners = ctx["corners"]
    picks = {"last": int(dice.index.max())}
    if corners is not None:
        picks.update({"least-loss": corners.least_loss_epoch, "balanced": corners.balanced_epoch})
    rows = {f"{k} (epoch {e})": dice.loc[e] for k, e in picks.items() if e is not None and e in dice.index}
    out = _table(pd.DataFrame(rows).T, "{:.4f}")
    if "clean_dice" in ctx["plots"]:
        out += _img(ctx["plots"]["clean_dice"], "clean Dice over epochs")
    return out


def _efr_table(run_dir, history, efr, ctx) -> str:
    given = load.load_efr_table(run_dir)
    if given is not None:  # `robusttrain check` already laid it out; show it as written
        return "<p>From <code>efr_table.csv</code> (robusttrain check).</p>" + \
            given.to_html(index=False, border=0, na_rep="–")
    if efr is None:
        return _na("efr.csv missing (and no efr_table.csv)")
    epoch = int(efr["epoch"].max())
    out = f"<p>EFR (%) at the last checked epoch ({epoch}), severities pooled (errors / cases).</p>"
    for t, table in tables.efr_tables(efr).items():
        out += f"<h3>t = {t:g}</h3>" + _table(table)
    return out


def _efr_curves(run_dir, history, efr, ctx) -> str:
    if "efr" not in ctx["plots"]:
        return _na("efr.csv missing")
    return _img(ctx["plots"]["efr"], "EFR over epochs per perturbation")


def _corner_cases(run_dir, history, efr, ctx) -> str:
    corners = ctx["corners"]
    if corners is None:
        return _na("corner_cases.json missing")
    head = (f"<p>Policy <b>{html.escape(str(corners.policy or '?'))}</b>: balanced epoch "
            f"<b>{corners.balanced_epoch}</b>, least-loss epoch <b>{corners.least_loss_epoch}</b>."
            + (f" {html.escape(str(corners.reason))}" if corners.reason else "") + "</p>")
    if not corners.cases:
        return head + "<p>No corner cases flagged.</p>"
    if history is None:
        return head + "<p>Flagged: " + html.escape(", ".join(corners.cases)) + "</p>" + \
            _na("history.csv missing (no curves)")
    out = head + "<h3>Least-loss vs balanced</h3>"
    out += _table(tables.epoch_comparison(history, corners), "{:.4f}", index=False)
    out += "<h3>Flagged cases</h3>"
    out += _table(tables.corner_case_table(history, corners), "{:.3f}", index=False)
    for cid in corners.cases:
        key = f"corner_{cid}"
        out += _img(ctx["plots"][key], f"corner case {cid}") if key in ctx["plots"] else \
            _na(f"{cid} not in history.csv")
    return out


def _tradeoff(run_dir, history, efr, ctx) -> str:
    if history is None:
        return _na("history.csv missing")
    if "tradeoff" not in ctx["plots"]:
        return _na("fewer than two epochs in history.csv")
    trade = plots.run_tradeoff(history, ctx["corners"])
    rows = [{"policy": name, "epoch": "-" if e is None else e,
             "cohort mean Dice": trade.table["cohort"].get(e), "worst-k mean Dice": trade.table["cvar"].get(e)}
            for name, e in trade.choices.items()]
    pct = f"{100 * trade.worst_fraction:g}"
    return (f"<p>The epoch each checkpoint policy picks on these validation cases; worst-k = mean Dice of "
            f"the worst {pct} % of cases. A policy only helps if it also holds on held-out data "
            f"(<code>benchmarks/evidence.py</code>).</p>"
            + _table(pd.DataFrame(rows), "{:.4f}", index=False) + _img(ctx["plots"]["tradeoff"], "trade-off"))


def _thumb(run_dir: Path, rec: dict[str, Any]) -> Path | None:
    # only files inside the run directory are ever embedded (robusttrain.rundir.paths.inside)
    return load.inside(run_dir, rec.get("thumb"))


def _failures(run_dir, history, efr, ctx) -> str:
    records = load.load_failures(run_dir)
    if records is None:
        return _na("failures/failures.jsonl missing")
    if not records:
        return "<p>No failures recorded.</p>"
    worst = sorted(records, key=lambda r: r.get("drop", 0.0), reverse=True)[:WORST_FAILURES]
    out = f"<p>{len(records)} failures recorded; the {len(worst)} largest relative Dice drops:</p>"
    for rec in worst:
        meta = (f"<b>{html.escape(str(rec.get('case_id')))}</b><br>{html.escape(str(rec.get('perturbation')))}"
                f" severity {rec.get('severity')}<br>epoch {rec.get('epoch')}, split {html.escape(str(rec.get('split')))}"
                f"<br>Dice {rec.get('src_dice', float('nan')):.3f} → {rec.get('fol_dice', float('nan')):.3f}"
                f" (drop {100 * rec.get('drop', 0.0):.1f} %)")
        thumb = _thumb(run_dir, rec)
        pic = _img(thumb, f"failure {rec.get('case_id')}") if thumb else _na("thumbnail missing")
        out += f'<div class="strip"><div class="meta">{meta}</div>{pic}</div>'
    return out + ("<p>Strips: source | follow-up | ground truth | prediction on source | "
                  "prediction on follow-up.</p>")


def _source_tiles(run_dir: Path, records: list[dict[str, Any]], n: int) -> list:
    """Source images cut from the worst failures' thumbnail strips (first of five equal tiles)."""
    import matplotlib.image
    import numpy as np

    out = []
    for rec in sorted(records, key=lambda r: -r.get("drop", 0.0)):
        thumb = _thumb(run_dir, rec)
        if thumb is not None and len(out) < n:
            strip = matplotlib.image.imread(thumb)
            w = strip.shape[1] // 5
            if w > 8 and strip.shape[1] % 5 == 0:
                tile = strip[:, :w, :3]
                out.append((tile * 255).round().astype(np.uint8) if tile.dtype != np.uint8 else tile)
    return out


def _gallery(run_dir, history, efr, ctx) -> str:
    for cand in ("gallery.png", "plots/gallery.png"):
        if (found := load.inside(run_dir, cand)) is not None:
            return _img(found, "perturbation gallery")
    hint = " (write one with `python -m robusttrain gallery recipe=NAME out=RUN_DIR/gallery.png`)"
    try:
        from robusttrain.perturbations.gallery import render_gallery
    except ImportError:
        return _na("gallery.png missing and the perturbation gallery is not installed" + hint)
    images = _source_tiles(run_dir, load.load_failures(run_dir) or [], 2)
    if not images:
        return _na("gallery.png missing and no failure thumbnails to draw one from" + hint)
    from robusttrain.perturbations import available

    known = set(available())
    names = [p for p in dict.fromkeys(efr["perturbation"]) if p in known] if efr is not None else []
    names = names or None  # None: the gallery's default families
    sev = sorted(int(s) for s in efr["severity"].unique() if s > 0) if efr is not None else (1, 3, 5)
    out = render_gallery(images, run_dir / "plots" / "gallery.png", names=names, severities=sev, tile=128)
    return ("<p>Drawn from the source images of the worst failures, with this run's perturbations "
            "and severities.</p>" + _img(out, "perturbation gallery"))


BUILDERS: dict[str, Callable[..., str]] = {
    "summary": _summary, "clean-dice": _clean_dice, "efr-table": _efr_table, "efr-curves": _efr_curves,
    "corner-cases": _corner_cases, "tradeoff": _tradeoff, "failures": _failures, "gallery": _gallery}


def render_report(run_dir: str | Path) -> str:
    """The report as an HTML string (plots are regenerated into ``plots/`` first)."""
    run_dir = Path(run_dir)
    corners = load.load_corners(run_dir)
    ctx = {"corners": corners, "plots": plots.write_plots(run_dir, corners=corners)}
    history, efr = load.load_history(run_dir), load.load_efr(run_dir)
    body = []
    for anchor, title in SECTIONS:
        try:
            content = BUILDERS[anchor](run_dir, history, efr, ctx)
        except Exception as err:  # one broken file must not take the whole report down
            log.exception("report section %s failed", anchor)
            content = _na(f"{title} could not be built ({type(err).__name__}: {err})")
        body.append(f'<section id="{anchor}"><h2>{title}</h2>{content}</section>')
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in SECTIONS)
    title = f"robusttrain report — {html.escape(run_dir.resolve().name)}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<link rel="icon" href="data:,"><style>{CSS}</style></head>'
            f"<body><h1>{title}</h1><nav>{nav}</nav>{''.join(body)}</body></html>\n")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``<run_dir>/report.html`` (or ``out``) atomically and return its path."""
    run_dir = Path(run_dir)
    return atomic_write_text(out or run_dir / "report.html", render_report(run_dir))
