"""One self-contained ``report.html`` per run: every image inlined as base64, no scripts, no network.

Each section reads its own file and, when that file is missing, says so ("not available: efr.csv
missing") instead of failing — a report of a half-finished run is still useful. A run directory is
untrusted data (it may come from someone else): every file is read through
:mod:`robusttrain.rundir.paths` (no symlinks, nothing outside it; a corrupt file is an error naming it),
nothing is written into it, and all HTML comes from Jinja2 templates with autoescape on, so a value
from a run's files is text in the page, never markup. At most :data:`MAX_CASE_PLOTS` per-case plots
are drawn (the first flagged cases); the others are listed in the table.

>>> import tempfile
>>> path = write_report(tempfile.mkdtemp())
>>> "not available: history.csv missing" in path.read_text()
True
"""

from __future__ import annotations

import base64
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment
from markupsafe import Markup

from robusttrain.errors import InputError
from robusttrain.io import atomic_write_text
from robusttrain.reporting import load, notes, plots, tables, training
from robusttrain.reporting.checks import checks_section, clean_line
from robusttrain.reporting.plots import MAX_CASE_PLOTS
from robusttrain.rundir import check as check_file
from robusttrain.rundir import layout
from robusttrain.rundir.history import dice_columns

log = logging.getLogger(__name__)
WORST_FAILURES = 12
# autoescape on for every template: a value is escaped unless it is Markup built here
_ENV = Environment(autoescape=True, keep_trailing_newline=True)


def _render(template: str, **values: Any) -> Markup:
    return Markup(_ENV.from_string(template).render(**values))


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
.basis,.off{color:#555;font-size:.9rem}
.strip{display:flex;gap:.5rem;align-items:flex-start;margin:.6rem 0;padding:.5rem;border:1px solid #eee}
.strip img{max-height:180px;width:auto}
.meta{font-size:.85rem;min-width:14rem} pre{background:#f6f8fa;padding:.6rem;overflow:auto;font-size:.8rem}
nav a{margin-right:1rem}
"""

SECTIONS = [
    ("summary", "Run summary"),
    ("clean-dice", "Clean Dice"),
    ("efr-table", "EFR table"),
    ("checks", "Robustness checks"),
    ("efr-curves", "EFR curves"),
    ("corner-cases", "Corner cases"),
    ("tradeoff", "Checkpoint trade-off"),
    ("training", "Training side"),
    ("failures", "Worst failures"),
    ("gallery", "Perturbation gallery"),
]


def _na(what: str) -> Markup:
    return _render('<p class="na">not available: {{ what }}</p>', what=what)


def _png(data: bytes, alt: str) -> Markup:
    return _render(
        '<img alt="{{ alt }}" src="data:image/png;base64,{{ data }}">',
        alt=alt,
        data=base64.b64encode(data).decode("ascii"),
    )


def _img(run_dir: Path, rel: str | Path, alt: str) -> Markup:
    """A PNG of the run directory, inlined (read through the run-directory reader)."""
    return _png(load.read_bytes(run_dir, rel) or b"", alt)


def _plot(ctx, key: str, alt: str) -> Markup:
    return _png(ctx["plots"][key][1], alt)


def _table(frame: pd.DataFrame, float_format: str = "{:.1f}", index: bool = True) -> Markup:
    # pandas escapes every cell and header (escape=True): its HTML is safe to insert as it is
    return Markup(
        frame.to_html(
            float_format=lambda v: float_format.format(v), na_rep="–", border=0, escape=True, index=index
        )
    )


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
    # what the run directory holds, by the one list of its names (robusttrain.rundir.layout)
    files = [p.name + ("/" if p.is_dir() else "") for p in layout.own_paths(run_dir)]
    facts["files"] = ", ".join(files) or "none"
    return _render(
        "<table>{% for k, v in facts.items() %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>"
        "{% endfor %}</table>{% if config %}<details><summary>config.yaml</summary><pre>{{ config }}"
        "</pre></details>{% else %}{{ na }}{% endif %}",
        facts=facts,
        config=load.load_config_text(run_dir),
        na=_check_only(run_dir)
        or _na(
            "config.yaml missing (a run not written by `robusttrain fit`: its settings are not known here)"
        ),
    )


def _check_only(run_dir: Path) -> Markup | None:
    """What a check-only run directory is (``robusttrain check`` with its own run_dir): said as such."""
    s = check_file.summary(run_dir)
    if s is None:
        return None
    return _render(
        "<p>A <code>robusttrain check</code> of <code>{{ ckpt }}</code> (no training in this folder: its tables "
        "are under Robustness checks). Check a training run's checkpoint without <code>run_dir=</code> to "
        "see them beside its training curves.</p>",
        ckpt=str(s.get("ckpt", "?")),
    )


def _clean_dice(run_dir, history, efr, ctx) -> str:
    if history is None:
        return _na("history.csv missing")
    dice = load.clean_dice(history)
    corners = ctx["corners"]
    picks = {"last": int(dice.index.max())}
    if corners is not None:
        picks.update({"least-loss": corners.least_loss_epoch, "balanced": corners.balanced_epoch})
    rows = {f"{k} (epoch {e})": dice.loc[e] for k, e in picks.items() if e is not None and e in dice.index}
    out = _render(
        '<p class="basis">Validation Dice: each case scored on its own pixels (all its slices together), '
        "then the mean over the {{ n }} cases of history.csv -- the <code>val/dice</code> that fit prints and "
        "logs when the MR probe is the whole validation set (<code>max_cases: null</code>, the recipes' "
        "default), and the clean Dice of <code>robusttrain check</code> on the same weights and cases (when "
        "every case has a lesion: check keeps frames with an empty mask apart). "
        "<code>val/dice_pooled</code> is one Dice over every pixel of the set: a different aggregation, "
        "which weighs large lesions more.</p>",
        n=history["case_id"].nunique(),
    )
    out += _table(pd.DataFrame(rows).T, "{:.4f}")
    if "clean_dice" in ctx["plots"]:
        out += _plot(ctx, "clean_dice", "clean Dice over epochs")
    return out


def _efr_table(run_dir, history, efr, ctx) -> str:
    given = load.load_efr_table(run_dir)
    if given is not None:  # `robusttrain check` already laid it out; show it as written
        return _check_table(given)
    if efr is None:
        return _na("efr.csv missing (and no efr_table.csv)")
    epoch = int(efr["epoch"].max())
    return _render(
        "<p>EFR (%) at the last checked epoch ({{ epoch }}), severities pooled (errors / cases); beside "
        "it the mean Dice (%) on the perturbed images and, on the pooled rows, the worst family's (the "
        "absolute numbers a rate can hide); <i>held out</i>: test-only families, never trained on.</p>"
        '<p class="basis">These rows rest on {{ basis }}</p>'
        "{% for t, table in tabs %}<h3>t = {{ t }}</h3>{{ table }}{% endfor %}",
        epoch=epoch,
        basis=notes.efr_basis(efr, epoch),
        tabs=[(f"{t:g}", _table(table)) for t, table in tables.efr_tables(efr).items()],
    )


def _check_table(given: pd.DataFrame) -> Markup:
    """``efr_table.csv`` as check wrote it, but its ``clean`` rows (clean Dice / IoU, in the columns that
    hold EFR % in every other row) said apart, once, as what they are (as the check section does)."""
    is_clean = given["perturbation"].astype(str) == "clean" if "perturbation" in given else given.index < 0
    clean = given[is_clean]
    if "threshold" in clean:  # the same clean scores at every threshold
        clean = clean[clean["threshold"] == clean["threshold"].iloc[0]] if len(clean) else clean
    return (
        Markup(
            '<p class="basis">From <code>efr_table.csv</code> (<code>robusttrain check</code>): every (case, '
            "test) pair scored with the checked checkpoint's weights. EFR (%) per family; beside it the mean "
            "Dice (%) on the perturbed images.</p>"
        )
        + clean_line(clean)
        + _table(given[~is_clean], "{}", index=False)
    )


def _efr_curves(run_dir, history, efr, ctx) -> str:
    if "efr" not in ctx["plots"]:
        return _na("efr.csv missing")
    return _plot(ctx, "efr", "EFR over epochs per perturbation")


def _corner_cases(run_dir, history, efr, ctx) -> str:
    corners = ctx["corners"]
    if corners is None:
        return _na("corner_cases.json missing")
    head = _render(
        "<p>Policy <b>{{ c.policy or '?' }}</b>: balanced epoch <b>{{ c.balanced_epoch }}</b>"
        "{% if c.checkpoint %} (<code>{{ c.checkpoint }}</code>){% endif %}, "
        "least-loss epoch <b>{{ c.least_loss_epoch }}</b>.{% if c.reason %} {{ c.reason }}{% endif %}</p>",
        c=corners,
    )
    if not corners.cases:
        return head + Markup("<p>No corner cases flagged.</p>")
    if history is None:
        return (
            head
            + _render("<p>Flagged: {{ cases }}</p>", cases=", ".join(corners.cases))
            + _na("history.csv missing (no curves)")
        )
    out = head + Markup(
        '<h3>Least-loss vs balanced</h3><p class="basis">Per-case clean Dice from history.csv at each '
        "checkpoint's epoch; corner cases are the ECOD outliers of the reference (least-loss) epoch.</p>"
    )
    out += _table(tables.epoch_comparison(history, corners), "{:.4f}", index=False)
    out += Markup("<h3>Flagged cases</h3>")
    out += _table(tables.corner_case_table(history, corners), "{:.3f}", index=False)
    shown = corners.cases[:MAX_CASE_PLOTS]
    if len(corners.cases) > len(shown):
        out += _render(
            "<p>Curves of the first {{ n }} of {{ total }} flagged cases (the report draws at most "
            "{{ n }}; all are in the table above).</p>",
            n=len(shown),
            total=len(corners.cases),
        )
    for cid in shown:
        key = f"corner_{cid}"
        out += (
            _plot(ctx, key, f"corner case {cid}") if key in ctx["plots"] else _na(f"{cid} not in history.csv")
        )
    return out


def _tradeoff(run_dir, history, efr, ctx) -> str:
    if history is None:
        return _na("history.csv missing")
    if "tradeoff" not in ctx["plots"]:
        return _na("fewer than two epochs in history.csv")
    corners = ctx["corners"]
    trade = plots.run_tradeoff(history, corners)
    rows = [
        {
            "policy": name,
            "epoch": "-" if e is None else e,
            "cohort mean Dice": trade.table["cohort"].get(e),
            "worst-k mean Dice": trade.table["cvar"].get(e),
            "weights": _weights(run_dir, corners, name, e, trade.choices.get("last")),
        }
        for name, e in trade.choices.items()
    ]
    return (
        _render(
            "<p>The epoch each checkpoint policy picks on these validation cases; worst-k = mean Dice "
            "of the worst {{ pct }} % of cases. A policy only helps if it also holds on held-out data "
            "(<code>python -m benchmarks.evidence.run</code>).</p>"
            '{% if c %}<p class="basis">This run\'s policy is <b>{{ c.policy }}</b>: '
            "{% if c.checkpoint %}<code>{{ c.checkpoint }}</code> holds its epoch {{ c.balanced_epoch }}"
            "{% else %}it picked epoch {{ c.balanced_epoch }} (no balanced.ckpt was written){% endif %}. "
            "Every policy chooses among "
            "the epochs whose weights the run kept ({{ cands }}); <i>weights</i> says where each pick is "
            "(score one with <code>robusttrain check ckpt=RUN/&lt;file&gt;</code>).</p>{% endif %}",
            pct=f"{100 * trade.worst_fraction:g}",
            c=corners if corners is not None and corners.policy else None,
            cands=", ".join(map(str, corners.candidates))
            if corners is not None and corners.candidates
            else "all",
        )
        + _table(pd.DataFrame(rows), "{:.4f}", index=False)
        + _plot(ctx, "tradeoff", "trade-off")
    )


def _weights(run_dir: Path, corners, policy: str, epoch: int | None, last: int | None) -> str:
    """Where a trade-off row's epoch has its weights in the run directory ("-" when nowhere)."""
    if epoch is None:
        return "-"
    named = corners.policy_checkpoints.get(policy) if corners is not None else None
    if named and load.inside(run_dir, named) is not None:
        return named + (" (this run's policy)" if corners.policy == policy else "")
    # Lightning's ModelCheckpoint: last.ckpt (the last epoch) and the recipes' least-loss epochNNN.ckpt
    found = [f"{layout.CHECKPOINTS}/{layout.LAST_CKPT}"] if epoch == last else []
    found.append(f"{layout.CHECKPOINTS}/epoch{epoch:03d}.ckpt")
    return next((rel for rel in found if load.inside(run_dir, rel) is not None), "not kept")


def _thumb(run_dir: Path, rec: dict[str, Any]) -> Path | None:
    # only files inside the run directory, reached without symlinks, are ever embedded (load.inside)
    thumb = load.inside(run_dir, rec.get("thumb"))
    return thumb.relative_to(Path(run_dir).resolve()) if thumb is not None else None


def _num(v: Any, fmt: str) -> str:
    try:
        return format(float(v), fmt)
    except (TypeError, ValueError):
        return str(v)


STRIP = (
    '<div class="strip"><div class="meta"><b>{{ r.case_id }}</b><br>{{ r.perturbation }} severity '
    "{{ r.severity }}<br>epoch {{ r.epoch }}, split {{ r.split }}<br>Dice {{ src }} → {{ fol }} "
    "(drop {{ drop }} %)</div>{{ pic }}</div>"
)


def _failures(run_dir, history, efr, ctx) -> str:
    records = load.load_failures(run_dir)
    if records is None:
        return _na("failures/failures.jsonl missing")
    if not records:
        return "<p>No failures recorded.</p>"
    worst = sorted(records, key=lambda r: _drop(r), reverse=True)[:WORST_FAILURES]
    out = _render(
        "<p>{{ n }} failures recorded; the {{ k }} largest relative Dice drops:</p>",
        n=len(records),
        k=len(worst),
    )
    for rec in worst:
        thumb = _thumb(run_dir, rec)
        pic = _img(run_dir, thumb, f"failure {rec.get('case_id')}") if thumb else _na("thumbnail missing")
        out += _render(
            STRIP,
            r=rec,
            pic=pic,
            src=_num(rec.get("src_dice", float("nan")), ".3f"),
            fol=_num(rec.get("fol_dice", float("nan")), ".3f"),
            drop=_num(100 * _drop(rec), ".1f"),
        )
    return out + Markup(
        "<p>Strips: source | follow-up | ground truth | prediction on source | prediction on follow-up.</p>"
    )


def _drop(rec: dict[str, Any]) -> float:
    try:
        return float(rec.get("drop", 0.0))
    except (TypeError, ValueError):
        return 0.0


def _source_tiles(run_dir: Path, records: list[dict[str, Any]], n: int) -> tuple[list, list]:
    """Source images and their lesion masks cut from the worst failures' thumbnail strips (the first and
    the third of five equal tiles: source | follow-up | ground truth | two predictions)."""
    import io

    import matplotlib.image
    import numpy as np

    images: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    for rec in sorted(records, key=lambda r: -_drop(r)):
        thumb = _thumb(run_dir, rec)
        if thumb is not None and len(images) < n:
            strip = matplotlib.image.imread(io.BytesIO(load.read_bytes(run_dir, thumb) or b""), format="png")
            w = strip.shape[1] // 5
            if w > 8 and strip.shape[1] % 5 == 0:
                tile = strip[:, :w, :3]
                images.append((tile * 255).round().astype(np.uint8) if tile.dtype != np.uint8 else tile)
                # the ground-truth tile spreads class indices over the grey range: background is black
                masks.append((strip[:, 2 * w : 3 * w, :3].max(-1) > 0).astype(np.uint8))
    return images, masks


def _gallery(run_dir, history, efr, ctx) -> str:
    for cand in ("gallery.png", "plots/gallery.png"):
        if load.read_bytes(run_dir, cand) is not None:
            return _img(run_dir, cand, "perturbation gallery")
    hint = " (write one with `python -m robusttrain gallery recipe=NAME out=RUN_DIR/gallery.png`)"
    try:
        from robusttrain.perturbations.gallery import render_gallery
    except ImportError:
        return _na("gallery.png missing and the perturbation gallery is not installed" + hint)
    images, masks = _source_tiles(run_dir, load.load_failures(run_dir) or [], 2)
    if not images:
        return _na("gallery.png missing and no failure thumbnails to draw one from" + hint)
    from robusttrain.perturbations import available

    known = set(available())
    listed = [p for p in dict.fromkeys(efr["perturbation"]) if p in known] if efr is not None else []
    names = listed or None  # None: the gallery's default families
    sev = sorted(int(s) for s in efr["severity"].unique() if s > 0) if efr is not None else (1, 3, 5)
    with tempfile.TemporaryDirectory() as tmp:  # never written into the run directory
        out = render_gallery(
            images, Path(tmp) / "gallery.png", names=names, severities=sev, masks=masks, tile=128
        )
        data = Path(out).read_bytes()
    return Markup(
        "<p>Drawn from the source images of the worst failures, with this run's perturbations "
        "and severities.</p>"
    ) + _png(data, "perturbation gallery")


def _training(run_dir, history, efr, ctx) -> str:
    """Metamorphic training per family and epoch; the balanced average's window; EMA. A feature the
    recipe switched off is one quiet line with the override that switches it on."""
    off = notes.off_features(load.load_config_text(run_dir))
    off_keys = {key for key, _, _ in off}
    out = (
        _render(
            '<p class="off">Off in this run: {{ names }} -- switch on with {% for o in how %}<code>{{ o }}</code>'
            "{% if not loop.last %}, {% endif %}{% endfor %} on the fit command line.</p>",
            names=", ".join(name for _, name, _ in off),
            how=[how for _, _, how in off],
        )
        if off
        else Markup("")
    )
    # each part: (heading, what its file holds or None when it is missing, the config key that switches the
    # feature on, the line shown when the file is missing, what the part shows of it)
    parts: list[tuple[str, Any, str, str, Callable[[Any], Markup]]] = [
        (
            "Metamorphic training",
            training.read_stats(run_dir),
            "metamorphic_training",
            "metamorphic_training.csv missing (no MetamorphicTraining in this run)",
            _training_stats,
        ),
        (
            "Failure mining",
            training.read_mining(run_dir),
            "mining",
            "failures/mining.csv missing (no FailureMiningCallback in this run)",
            _mining,
        ),
        (
            "Balanced average",
            training.read_average(run_dir),
            "balanced_average",
            "balanced_average.json missing (no BalancedAverage in this run)",
            lambda report: _balanced_average(report, history),
        ),
        (
            "EMA",
            training.has_ema(run_dir) or None,
            "ema",
            "ema.ckpt missing (no EMACheckpoint in this run)",
            _ema,
        ),
    ]
    for title, found, key, missing, show in parts:
        out += _part(title, found is not None, key, off_keys, missing)
        if found is not None:
            out += show(found)
    return out


def _training_stats(stats) -> Markup:
    out = _render(
        "<p>Follow-ups drawn (candidates), kept (trained on) and rejected (occluders over the lesion) "
        "per family, over {{ n }} epoch(s).</p>",
        n=stats["epoch"].nunique(),
    )
    out += _table(training.family_totals(stats), "{:.2f}")
    out += Markup("<p>Per epoch: kept / drawn (rejected).</p>")
    return out + _table(training.per_epoch(stats), "{}")


def _mining(mining) -> Markup:
    out = Markup(
        "<p>Per epoch. Steer mode: failure conditions in the bank, those the check failed, those it no "
        "longer failed (repaired), failures on cases that passed their previous check (new failures: "
        "overfitting) and the share of the random follow-ups steered to the conditions. Replay mode: "
        "failures in the bank and replayed samples.</p>"
    )
    return out + _table(mining, "{:g}")


def _balanced_average(report, history) -> Markup:
    facts = training.average_summary(report)
    out = _render(
        "<table>{% for k, v in facts.items() %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>",
        facts=facts,
    )
    dice = training.window_dice(history, report) if history is not None else None
    if dice is None:
        return out + _na("history.csv missing: no per-epoch Dice for the window")
    out += Markup(
        "<p>Per-case Dice of the epochs the average holds, from history.csv (the averaged weights "
        "themselves are not scored in the run directory: <code>robusttrain check ckpt=RUN/"
        "balanced_average.ckpt</code> scores them).</p>"
    )
    return out + _table(dice, "{:.4f}")


def _ema(_: bool) -> Markup:
    return Markup(
        "<p><code>ema.ckpt</code> holds the EMA weights (score them with <code>robusttrain validate "
        "ckpt=RUN/ema.ckpt</code>).</p>"
    )


def _part(title: str, present: bool, key: str, off_keys: set[str], missing: str) -> Markup:
    """A training-side part's heading; its file missing is news (not available) unless the recipe left
    the feature off (then the part is left out: the section's first line lists it)."""
    if not present and key in off_keys:
        return Markup("")
    head = _render("<h3>{{ title }}</h3>", title=title)
    return head if present else head + _na(missing)


BUILDERS: dict[str, Callable[..., str]] = {
    "summary": _summary,
    "clean-dice": _clean_dice,
    "efr-table": _efr_table,
    "checks": lambda run_dir, history, efr, ctx: checks_section(run_dir, _table),
    "efr-curves": _efr_curves,
    "corner-cases": _corner_cases,
    "tradeoff": _tradeoff,
    "training": _training,
    "failures": _failures,
    "gallery": _gallery,
}


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title><link rel="icon" href="data:,">\
<style>{{ css }}</style></head><body><h1>{{ title }}</h1><nav>{% for a, t in sections %}\
<a href="#{{ a }}">{{ t }}</a>{% endfor %}</nav>{% for a, t, content in body %}<section id="{{ a }}">\
<h2>{{ t }}</h2>{{ content }}</section>{% endfor %}</body></html>
"""


def render_report(run_dir: str | Path) -> str:
    """The report as an HTML string (plots are drawn in memory; nothing is written)."""
    run_dir = Path(run_dir)
    corners = load.load_corners(run_dir)
    ctx = {
        "corners": corners,
        "plots": plots.render_plots(run_dir, corners=corners, max_cases=MAX_CASE_PLOTS),
    }
    history, efr = load.load_history(run_dir), load.load_efr(run_dir)
    body = []
    for anchor, title in SECTIONS:
        try:
            content = BUILDERS[anchor](run_dir, history, efr, ctx)
        except InputError:  # a bad run-directory file is the command's error, named in one line
            raise
        except Exception as err:  # one broken section must not take the whole report down
            log.warning("report section %s failed: %s: %s", anchor, type(err).__name__, err)
            content = _na(f"{title} could not be built ({type(err).__name__}: {err})")
        body.append((anchor, title, content))
    return _ENV.from_string(PAGE).render(
        title=f"robusttrain report — {run_dir.resolve().name}", css=Markup(CSS), sections=SECTIONS, body=body
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``<run_dir>/report.html`` (or ``out``) atomically and return its path."""
    run_dir = Path(run_dir)
    return atomic_write_text(out or run_dir / "report.html", render_report(run_dir))
