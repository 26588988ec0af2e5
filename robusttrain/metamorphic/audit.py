"""Standalone robustness audit of a trained model (what ``python -m robusttrain check`` runs).

Runs the suite on each named dataset and builds the paper-000 layout: rows = perturbation
(pooled severities, plus ``all``), columns = dataset x {Dice, IoU}, EFR in %, one table per
threshold; a last row ``clean`` holds the clean mean Dice / IoU (in %) of each dataset.

Beside each rate, the absolute number it can hide (a model that segments less has less to lose):
``<dataset>/perturbed Dice`` (mean Dice on the perturbed images, %; the clean row: the clean Dice) and,
on the pooled rows, ``<dataset>/worst family`` with its ``worst family Dice``. ``heldout`` families
(test-only: never trained on) are added to the suite when missing, marked ``yes`` in the ``held out``
column, and pooled in the rows ``held-out families`` / ``trained families``.

>>> import torch
>>> from robusttrain.metamorphic.audit import audit, format_efr_tables
>>> from robusttrain.metamorphic.suite import MRSuite
>>> ds = [(torch.rand(3, 32, 32), (torch.rand(32, 32) > 0.5).long()) for _ in range(2)]
>>> model = torch.nn.Conv2d(3, 2, 1)
>>> out = audit(model, {"val": ds}, MRSuite(["contrast"], (2,)))
>>> sorted(out["tables"]), list(out["tables"][0.25].columns)  # doctest: +NORMALIZE_WHITESPACE
([0.25, 0.5], ['held out', 'val/Dice', 'val/IoU', 'val/perturbed Dice', 'val/worst family',
 'val/worst family Dice'])
>>> print(format_efr_tables(out["tables"]).splitlines()[0])
### EFR (%) at t = 0.25, with the mean Dice (%) on the perturbed images
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from pandas.api.types import is_numeric_dtype

from .batch import BatchHooks
from .check import Probe, checking_state, id_prefix, predict_fn, probe_cases, run_check
from .efr import THRESHOLDS, family_rows, pool_families
from .empty_masks import case_scores, empty_summary, format_empty
from .heldout import heldout_families, with_families
from .ledger import efr_rows
from .runner import aggregate
from .suite import MRSuite
from .validity import validity_note


def audit(
    model: torch.nn.Module,
    datasets: dict[str, Any],
    suite: MRSuite | None = None,
    device: str | torch.device | None = None,
    batch_size: int = 8,
    path: str = "auto",
    max_cases: int | None = None,
    thresholds: Sequence[float] = THRESHOLDS,
    class_names: Sequence[str] | None = None,
    hooks: BatchHooks | None = None,
    to_probabilities: str | Callable | None = None,
    always: Sequence[str] = (),
    heldout: str | Sequence[str] | None = None,
    progress: Callable[[str, int], Any] | None = None,
) -> dict[str, Any]:
    """Run ``suite`` (default: nine families x severities 2, 4) on every dataset.

    The same call as the training-time check (:func:`robusttrain.metamorphic.check.run_check`: the
    same case subset -- ``always`` are the planted hard cases kept first --, seeded state, follow-up
    params and scoring), so a dataset named ``"val"`` audited with a run's suite and ``max_cases``
    reproduces the numbers its MetamorphicCallback wrote for the same weights. ``heldout``: test-only
    families (:mod:`robusttrain.metamorphic.heldout`; added to the suite when missing, labelled).

    ``progress(name, total)`` returns a progress bar (tqdm's ``update`` / ``close``) per dataset; the
    datasets are streamed batch by batch, never held whole.

    Cases whose mask is empty are kept out of every Dice mean and EFR and scored apart
    (:mod:`robusttrain.metamorphic.empty_masks`: specificity, false-positive area).

    Returns ``{"tables": {t: DataFrame}, "efr": long EFR DataFrame (split = dataset name),
    "cases": per-test-case rows (cases with a lesion), "per_case" / "followups" / "empty": the
    :mod:`robusttrain.rundir.check` tables, "clean": {name: {"dice", "iou"}} (over cases with a lesion),
    "n_cases": {name: cases with a lesion}, "n_empty": {name: cases with an empty mask}, "markdown": str}``;
    nothing is written (``robusttrain check`` writes them: :func:`robusttrain.cli.check_output.write_audit`).
    """
    held = heldout_families(heldout)
    suite = with_families(suite or MRSuite(), held)
    hooks = hooks or BatchHooks()
    dev = (
        torch.device(device)
        if device is not None
        else next((p.device for p in model.parameters()), torch.device("cpu"))
    )
    suite = with_model(suite, model, dev)
    path = path if path != "auto" else ("torch" if dev.type == "cuda" else "numpy")
    model = model.to(dev)
    predict = predict_fn(model, to_probabilities)
    efrs, cases_all, per_cases, followups, empties, clean, n_cases, n_empty = [], [], [], [], [], {}, {}, {}
    with checking_state(model, suite.seed):
        for name, ds in datasets.items():
            idx, ids = probe_cases(ds, name, max_cases, suite.seed, always if name == "val" else ())
            res = run_check(
                predict,
                {name: Probe(ds, idx, ids, id_prefix=id_prefix(name))},
                suite,
                path=path,
                device=dev,
                batch_size=batch_size,
                hooks=hooks,
                progress=progress,
            )[name]
            hist, cases = aggregate(res, class_names or [], 0, suite)
            per_case, fol = case_scores(res, hist, cases, suite, held)
            lesion = ~fol["empty_mask"].astype(bool)  # empty-mask cases: scored apart, never in a Dice mean
            efrs.append(efr_rows(cases[lesion.to_numpy()], thresholds, name, heldout=held))
            cases_all.append(cases[lesion.to_numpy()])
            per_cases.append(per_case)
            followups.append(fol)
            empties.append(empty_summary(per_case, fol))
            n_empty[name] = int(per_case["empty_mask"].sum())
            n_cases[name] = int(len(per_case)) - n_empty[name]
            clean[name] = {
                m: float(per_case[m].mean()) for m in ("dice", "iou")
            }  # NaN (skipped) on empty masks
    efr = pd.concat(efrs, ignore_index=True)
    tables = paper_tables(efr, clean, thresholds)
    empty = pd.concat(empties, ignore_index=True)
    # what the project's own evidence says each family's number is worth for a new centre (metamorphic/validity)
    note = validity_note(suite.names)
    md = format_efr_tables(tables, n_cases, n_empty) + format_empty(empty) + (f"\n{note}\n" if note else "")
    return {
        "tables": tables,
        "efr": efr,
        "cases": pd.concat(cases_all, ignore_index=True),
        "per_case": pd.concat(per_cases, ignore_index=True),
        "followups": pd.concat(followups, ignore_index=True),
        "empty": empty,
        "clean": clean,
        "n_cases": n_cases,
        "n_empty": n_empty,
        "markdown": md,
    }


def long_table(tables: dict[float, pd.DataFrame]) -> pd.DataFrame:
    """:func:`paper_tables`' tables as one frame, column ``threshold`` first (``efr_table.csv``)."""
    long = pd.concat([t.reset_index().assign(threshold=th) for th, t in tables.items()], ignore_index=True)
    return long[["threshold"] + [c for c in long.columns if c != "threshold"]]


def with_model(suite: MRSuite, model: torch.nn.Module, device: torch.device) -> MRSuite:
    """``suite``, with the audited model given to the families that attack it (``adversarial``) when the
    suite does not name one: an audit has the model, so those families can run (the attack's delta is
    drawn once per case from the model's gradient and kept in the params, as every family's)."""
    needs = [
        n for n in suite.names if n == "adversarial" and "model" not in suite.perturbation_kwargs.get(n, {})
    ]
    if not needs:
        return suite

    def logits(images: torch.Tensor) -> torch.Tensor:  # params are drawn on host copies of the images
        return model(images.to(device)).to(images.device)

    kwargs = {
        **suite.perturbation_kwargs,
        **{n: {**suite.perturbation_kwargs.get(n, {}), "model": logits} for n in needs},
    }
    return MRSuite(
        list(suite.names),
        list(suite.severities),
        suite.seed,
        perturbation_kwargs=kwargs,
        slice_axis=suite.slice_axis,
    )


GROUPS = {"held-out families": True, "trained families": False}  # pooled rows when some are held out


def paper_tables(
    efr: pd.DataFrame, clean: dict[str, dict[str, float]], thresholds: Sequence[float] = THRESHOLDS
) -> dict[float, pd.DataFrame]:
    """Per threshold: rows perturbation (+ the held-out / trained pools when a family is held out,
    ``all``, ``clean``), columns ``held out`` and per dataset ``<dataset>/Dice``, ``<dataset>/IoU`` (EFR
    %), ``<dataset>/perturbed Dice`` (%), ``<dataset>/worst family``, ``<dataset>/worst family Dice`` (%)."""
    out = {}
    pooled = efr[efr["severity"] == 0]
    fams = family_rows(efr)
    held = {str(p) for p, h in zip(fams["perturbation"], fams["heldout"]) if bool(h)}
    groups = {g: h for g, h in GROUPS.items() if held} if held else {}
    for t in thresholds:
        sub = pooled[pooled["threshold"] == float(t)]
        order = [p for p in dict.fromkeys(sub["perturbation"]) if p != "all"]
        index = order + list(groups) + ["all", "clean"]
        cols: dict[str, pd.Series] = {
            "held out": pd.Series(["yes" if p in held or GROUPS.get(p) else "" for p in index], index=index)
        }
        for name in dict.fromkeys(sub["split"]):
            ds = sub[sub["split"] == name]
            fam = family_rows(ds)
            for m, label in (("dice", "Dice"), ("iou", "IoU")):
                rows = ds[ds["metric"] == m].set_index("perturbation")
                s = rows["efr"] * 100
                for g, is_held in groups.items():
                    part = rows.loc[[p for p in order if (p in held) == is_held and p in rows.index]]
                    n = part["cases"].sum()
                    s[g] = 100 * part["errors"].sum() / n if n else float("nan")
                s["clean"] = 100 * clean[name][m]
                cols[f"{name}/{label}"] = s
            dice = fam.set_index("perturbation")["mean_fol_dice"] * 100
            worst = pd.Series(None, index=index, dtype=object)
            worst_dice = pd.Series(float("nan"), index=index)
            every = {"all": fam, **{g: fam[fam["heldout"].astype(bool) == h] for g, h in groups.items()}}
            for g, part in every.items():
                stats = pool_families(part)
                dice[g] = 100 * float(stats["mean_fol_dice"])  # type: ignore[arg-type]
                worst[g] = stats["worst_family"]
                worst_dice[g] = 100 * float(stats["worst_family_dice"])  # type: ignore[arg-type]
            dice["clean"] = 100 * clean[name]["dice"]
            cols[f"{name}/perturbed Dice"] = dice
            cols[f"{name}/worst family"] = worst
            cols[f"{name}/worst family Dice"] = worst_dice
        table = pd.DataFrame(cols).reindex(index)
        numeric = [c for c in table.columns if is_numeric_dtype(table[c])]
        table[numeric] = table[numeric].round(2)
        table.index.name = "perturbation"
        out[float(t)] = table
    return out


def _cell(v: Any) -> str:
    if isinstance(v, str):
        return v
    return "" if v is None or pd.isna(v) else f"{float(v):.2f}"


def format_efr_tables(
    tables: dict[float, pd.DataFrame],
    n_cases: dict[str, int] | None = None,
    n_empty: dict[str, int] | None = None,
) -> str:
    """Markdown: one table per threshold (EFR %, perturbed and worst-family Dice %; the clean Dice / IoU %
    in a line under it, not in the rate columns), each saying how many cases of each dataset it rests on when ``n_cases`` is given
    (and how many empty-mask cases were kept out, ``n_empty``)."""
    parts = []
    apart = {k: v for k, v in (n_empty or {}).items() if v}
    rests = (
        "Rests on "
        + ", ".join(f"{n} case(s) of {name}" for name, n in n_cases.items())
        + (
            " with a lesion; kept out: "
            + ", ".join(f"{n} of {k} with an empty mask" for k, n in apart.items())
            + " (scored apart below)"
            if apart
            else ""
        )
        + ".\n\n"
        if n_cases
        else ""
    )
    for t, table in tables.items():
        head = "| perturbation | " + " | ".join(table.columns) + " |"
        sep = "|---|" + "".join("---:|" if is_numeric_dtype(table[c]) else "---|" for c in table.columns)
        # the clean row holds Dice / IoU, not rates: said under the table, never in the EFR columns
        rates = table.drop(index="clean", errors="ignore")
        rows = [
            f"| {p} | " + " | ".join(_cell(v) for v in r) + " |" for p, r in zip(rates.index, rates.values)
        ]
        parts.append(
            f"### EFR (%) at t = {t:g}, with the mean Dice (%) on the perturbed images\n\n{rests}"
            + "\n".join([head, sep, *rows, ""])
            + _clean_line(table)
        )
    return "\n".join(parts)


def _clean_line(table: pd.DataFrame) -> str:
    """The clean (unperturbed) Dice / IoU of each dataset, in %, as one line under a table."""
    if "clean" not in table.index:
        return ""
    row = table.loc["clean"]
    names = [c[: -len("/Dice")] for c in table.columns if c.endswith("/Dice")]
    cells = [f"{n}: Dice {_cell(row[f'{n}/Dice'])} %, IoU {_cell(row[f'{n}/IoU'])} %" for n in names]
    return "\nClean, no perturbation: " + "; ".join(cells) + ".\n"
