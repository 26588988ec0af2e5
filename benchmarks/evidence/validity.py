"""Does the MR check's in-domain score predict a new centre? (Evidence v5's secondary analysis.)

Two views, both as partial correlations -- what a check number adds about the new centre *beyond*
in-domain clean Dice, which a user has anyway:

- **across runs**: one point per run (and checkpoint): x = a check number on the in-domain Kvasir test
  cases (held-out-family follow-up Dice, in-family follow-up Dice, EFR), y = ClinicDB (or other-OOD)
  clean Dice, controlling for z = Kvasir test clean Dice; 95 % interval by resampling runs;
- **across epochs**: within each run, the ``curve`` epochs (``run.py --curve-every``): x = the check on
  validation cases at that epoch, y = ClinicDB clean Dice at that epoch, z = validation clean Dice; the
  per-run partial correlations averaged on Fisher's z with a t-interval over runs;
- **per family** (across runs): which test family's follow-up Dice tracks ClinicDB beyond clean Dice;
- **within conditions** (exploratory, added after v5's protocol): across runs as above with the condition
  as a further control (one indicator per condition), so what is left is the seed-to-seed spread inside one
  recipe -- whether the check tells a user which of *their* runs will hold up, not only that one recipe
  beats another (a pretrained or augmented model raises both the check and the new centre); the interval
  resamples runs within each condition.

>>> rng = np.random.default_rng(0); z = rng.normal(size=200); x = z + rng.normal(size=200)
>>> round(partial_corr(x, z + x, z), 2) > 0.6, abs(partial_corr(x, z + rng.normal(size=200), z)) < 0.2
(True, True)
"""

from __future__ import annotations

import numpy as np
from scipy import stats

CHECK_NUMBERS = {
    "heldout": "held-out-family follow-up Dice",
    "infamily": "in-family follow-up Dice",
    "efr": "EFR",
}
TARGETS = {"cvc_clinicdb": "ClinicDB", "other_ood": "other-OOD"}


def partial_corr(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Pearson correlation of ``x`` and ``y`` after regressing each on ``z`` (one control, or one per
    column; with an intercept)."""
    design = np.column_stack([np.ones(len(x)), z])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _boot(x, y, z, n_boot: int, seed: int = 0, strata: np.ndarray | None = None) -> dict:
    """The partial correlation and a percentile interval from resampling the points (within each of
    ``strata``'s groups when given, so every resample keeps every group at its size)."""
    r = partial_corr(x, y, z)
    rng = np.random.default_rng(seed)
    groups = (
        [np.arange(len(x))] if strata is None else [np.flatnonzero(strata == g) for g in np.unique(strata)]
    )
    idx = np.concatenate([g[rng.integers(0, len(g), size=(n_boot, len(g)))] for g in groups], axis=1)
    reps = np.array([partial_corr(x[i], y[i], z[i]) for i in idx])
    reps = reps[np.isfinite(reps)]
    lo, hi = np.quantile(reps, [0.025, 0.975]) if reps.size else (np.nan, np.nan)
    return {"r": round(r, 3), "lo": round(float(lo), 3), "hi": round(float(hi), 3), "n": int(len(x))}


def _mean_dice(r: dict, policy: str, group: str) -> float:
    d = r["picks"][policy]["dice"]
    splits = [
        s for s in d if (s == group if group != "other_ood" else s not in ("kvasir_test", "cvc_clinicdb"))
    ]
    return float(np.mean([v for s in splits for v in d[s].values()]))


def _check(r: dict, policy: str, number: str, family: str | None = None) -> float:
    """The check's ``number`` over the run's Kvasir test cases at ``policy``."""
    cases = r["mr_by_policy"][policy]["kvasir_test"].values()
    if family is not None:
        return float(np.mean([c["fol_dice_by_perturbation"][family] for c in cases]))
    if number == "efr":
        return float(np.mean([c["errors_dice@0.25"] / c["tests"] for c in cases]))
    fams = r["heldout_families" if number == "heldout" else "infamily_families"]
    return float(np.mean([np.mean([c["fol_dice_by_perturbation"][f] for f in fams]) for c in cases]))


def across_runs(results: list[dict], policy: str, n_boot: int, within_conditions: bool = False) -> dict:
    """One point per run scored at ``policy``; ``within_conditions``: the run's condition is controlled
    for too (see the module's docstring); {} with too few runs to leave a residual spread."""
    rs = [
        r
        for r in results
        if policy in r.get("mr_by_policy", {}) and "kvasir_test" in r["mr_by_policy"][policy]
    ]
    if len(rs) < 4:
        return {}
    clean = np.array([_mean_dice(r, policy, "kvasir_test") for r in rs])
    z, strata = clean, None
    if within_conditions:
        strata = np.array([r["condition"] for r in rs])
        conds = sorted(set(strata))
        if min(int(np.sum(strata == c)) for c in conds) < 3:  # 2 seeds a condition leave too few df
            return {}
        z = np.column_stack([clean, *[(strata == c).astype(float) for c in conds[1:]]])
    out: dict = {}
    for t in TARGETS:
        y = np.array([_mean_dice(r, policy, t) for r in rs])
        for number in CHECK_NUMBERS:
            x = np.array([_check(r, policy, number) for r in rs])
            out.setdefault(t, {})[number] = _boot(x, y, z, n_boot, strata=strata)
        # within conditions, "clean Dice r" too has the condition taken out
        clean_r = partial_corr(clean, y, z[:, 1:]) if strata is not None else np.corrcoef(clean, y)[0, 1]
        out[t]["clean_r"] = round(float(clean_r), 3)
        fams = rs[0]["test_families"]
        out[t]["families"] = {
            f: _boot(np.array([_check(r, policy, "", f) for r in rs]), y, z, n_boot, strata=strata)
            for f in fams
        }
    return out


def across_epochs(results: list[dict]) -> dict:
    """Per run, the partial correlation over its curve epochs; averaged on Fisher's z, t-interval over runs."""
    per: dict = {t: {n: [] for n in CHECK_NUMBERS} for t in ("cvc_clinicdb",)}
    for r in results:
        curve = r.get("curve") or {}
        if len(curve) < 4:
            continue
        pts = [curve[e] for e in sorted(curve, key=int)]
        z = np.array([p["val_clean_dice"] for p in pts])
        y = np.array([p["clean"]["cvc_clinicdb"] for p in pts])
        for number, key in (
            ("heldout", "val_heldout_dice"),
            ("infamily", "val_infamily_dice"),
            ("efr", "val_efr"),
        ):
            rho = partial_corr(np.array([p[key] for p in pts]), y, z)
            if np.isfinite(rho):
                per["cvc_clinicdb"][number].append(float(np.arctanh(np.clip(rho, -0.999, 0.999))))
    out: dict = {}
    for t, by in per.items():
        for number, zs in by.items():
            if len(zs) < 2:
                continue
            m, se = float(np.mean(zs)), float(np.std(zs, ddof=1) / np.sqrt(len(zs)))
            q = stats.t.ppf(0.975, len(zs) - 1)
            out.setdefault(t, {})[number] = {
                "r": round(float(np.tanh(m)), 3),
                "lo": round(float(np.tanh(m - q * se)), 3),
                "hi": round(float(np.tanh(m + q * se)), 3),
                "runs": len(zs),
            }
    return out


def validity(results: list[dict], n_boot: int = 2000) -> dict:
    """``{"across_runs": {policy: ...}, "within_conditions": {"ema": ...}, "across_epochs": ...}`` of the
    finished runs."""
    return {
        "across_runs": {p: across_runs(results, p, n_boot) for p in ("ema", "least_loss")},
        "within_conditions": {"ema": across_runs(results, "ema", n_boot, within_conditions=True)},
        "across_epochs": across_epochs(results),
    }


def _r(d: dict) -> str:
    return f"{d['r']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def _runs_table(heading: str, by: dict) -> list[str]:
    L = [
        heading,
        "",
        "| target | clean Dice r | " + " | ".join(CHECK_NUMBERS.values()) + " |",
        "|---|---|---|---|---|",
    ]
    for t, d in by.items():
        L.append(
            f"| {TARGETS[t]} | {d['clean_r']:+.2f} | " + " | ".join(_r(d[n]) for n in CHECK_NUMBERS) + " |"
        )
    fams = by.get("cvc_clinicdb", {}).get("families", {})
    if fams:
        ranked = sorted(fams.items(), key=lambda kv: -kv[1]["r"])
        L += ["", "Per family (ClinicDB): " + "; ".join(f"{f} {_r(d)}" for f, d in ranked) + "."]
    return [*L, ""]


def validity_lines(v: dict) -> list[str]:
    """Markdown: the partial correlations, per check number and target, and the per-family ones (across
    runs, within conditions, across epochs)."""
    L = [
        "Partial correlation of the check's in-domain number with the new centre's clean Dice, controlling "
        "for in-domain clean Dice (what the check adds beyond it); [95 % interval].",
        "",
    ]
    for policy, by in v["across_runs"].items():
        if by:
            L += _runs_table(f"**Across runs, at `{policy}`** (Kvasir test check)", by)
    for policy, by in v["within_conditions"].items():
        if by:
            L += _runs_table(
                f"**Within conditions, at `{policy}`** (exploratory, not in the protocol: the condition "
                "controlled for too, so only the seed-to-seed spread inside one recipe is left; the interval "
                "resamples runs within each condition)",
                by,
            )
    ep = v["across_epochs"].get("cvc_clinicdb")
    if ep:
        L += ["**Across epochs, within runs** (validation check vs ClinicDB; Fisher-z mean, t over runs)", ""]
        L += ["| " + " | ".join(CHECK_NUMBERS.values()) + " |", "|---|---|---|"]
        L.append(
            "| "
            + " | ".join(_r(ep[n]) + f" ({ep[n]['runs']} runs)" if n in ep else "–" for n in CHECK_NUMBERS)
            + " |"
        )
    return L


def family_table(results: list[dict], policy: str, n_boot: int, source: dict) -> dict:
    """The package's ``family_validity.json`` (``robusttrain.metamorphic.validity``) from finished runs:
    per test family, its across-runs partial correlation with ClinicDB clean Dice (``families``) and,
    where every condition has at least 3 runs, the same within conditions (``within_recipes``: the
    seed-to-seed part, the condition controlled for; ``source.recipes`` counts the conditions)."""
    v = across_runs(results, policy, n_boot)
    if not v:
        raise SystemExit(f"evidence_validity: fewer than 4 runs scored at {policy!r}; nothing to correlate")
    fams = v["cvc_clinicdb"]["families"]
    table = {
        "source": {
            **source,
            "runs": len(results),
            "recipes": len({r["condition"] for r in results}),
            "checkpoint": policy,
            "target": "cvc_clinicdb",
            "n_boot": n_boot,
        },
        "families": {f: fams[f] for f in sorted(fams)},
    }
    within = across_runs(results, policy, n_boot, within_conditions=True)
    if within:
        table["within_recipes"] = {f: d for f, d in sorted(within["cvc_clinicdb"]["families"].items())}
    return table


def main(argv=None) -> None:
    """``python -m benchmarks.evidence.validity ARCHIVE --out F``: write the per-family validity table."""
    import argparse
    import json
    import os
    from pathlib import Path

    from benchmarks.evidence.archive import load
    from robusttrain.io import atomic_write_text

    ap = argparse.ArgumentParser(description="The check's per-family validity from an evidence archive")
    ap.add_argument("archive", type=Path)
    ap.add_argument(
        "--out", type=Path, required=True, help="e.g. robusttrain/metamorphic/family_validity.json"
    )
    ap.add_argument("--policy", default="least_loss", help="the checkpoint the runs were MR-scored at")
    ap.add_argument("--exclude", default="mined_dose", help="conditions left out (comma list)")
    ap.add_argument("--evidence", default="Evidence v4")
    ap.add_argument("--model", default="a from-scratch 0.5 M BasicUNet at 128 px")
    ap.add_argument("--n-boot", type=int, default=2000)
    a = ap.parse_args(argv)
    if not a.archive.is_dir():
        raise SystemExit(f"evidence_validity: {a.archive}: not a folder (expected an evidence archive)")
    skip = set(a.exclude.split(",")) - {""}
    runs = [r for r, _ in load(a.archive) if r.get("condition") not in skip]
    source = {
        "evidence": a.evidence,
        # relative to the repository (no machine path in a committed file)
        "archive": Path(os.path.relpath(a.archive.resolve(), Path(__file__).resolve().parents[2])).as_posix(),
        "excluded_conditions": sorted(skip),
        "model": a.model,
        "train": "Kvasir-SEG",
        "target_name": "CVC-ClinicDB",
    }
    atomic_write_text(a.out, json.dumps(family_table(runs, a.policy, a.n_boot, source), indent=1) + "\n")
    print(f"evidence_validity: {len(runs)} runs -> {a.out}")


if __name__ == "__main__":
    main()
