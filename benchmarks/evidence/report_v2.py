"""Summary statistics and markdown tables of ``run.py`` (per-run results → results.json / .md).

Groups of held-out cases: ``in-domain`` (the test part of the training dataset), ``out-of-domain``
(every other held-out set pooled; polyps only) and each set on its own. All percentages.
"""

from __future__ import annotations

import numpy as np

from benchmarks.evidence.conditions import mean_std
from benchmarks.evidence.paired_stats import (
    mean_difference,
    paired_bootstrap,
    relative_change,
    worst_fraction_difference,
)

EFR_COLS = ["efr_dice@0.25", "efr_dice@0.5", "efr_iou@0.25", "efr_iou@0.5"]
PAIRS = [("mined", "plain"), ("random", "plain"), ("mined", "random")]
BALANCED = ["last_inlier", "maximin", "pareto", "cvar"]


def _groups(results, in_domain):
    sets = sorted({s for r in results for s in r["picks"]["least_loss"]["dice"]})
    ind = [s for s in sets if s in in_domain]
    ood = [s for s in sets if s not in in_domain]
    groups = {"in-domain": ind}
    if ood:
        groups["out-of-domain"] = ood
    if len(sets) > 1:
        groups.update({s: [s] for s in sets})
    return groups


def _keys(r, sets):
    return [(s, c) for s in sets for c in sorted(r["picks"]["least_loss"]["dice"].get(s, {}))]


def _dice(r, policy, keys):
    d = r["picks"][policy]["dice"]
    return np.array([d[s][c] for s, c in keys])


def _errors(r, col, keys):
    m, t = col.split("_", 1)[1].split("@")
    return np.array([r["mr"][s][c][f"errors_{m}@{t}"] for s, c in keys]), np.array(
        [r["mr"][s][c]["tests"] for s, c in keys]
    )


def _matrix(results, cond, seeds, fn):
    by = {r["seed"]: r for r in results if r["condition"] == cond}
    return np.stack([fn(by[s]) for s in seeds])


def summarise(results: list[dict], args) -> dict:
    from robusttrain.cornercases import worst_fraction_mean

    k = args.worst_fraction
    conds = list(dict.fromkeys(r["condition"] for r in results))
    seeds = sorted({r["seed"] for r in results})
    in_domain = ["kvasir_test"] if args.dataset == "polyp" else ["acdc_test"]
    groups = _groups(results, in_domain)
    ref = results[0]
    out: dict = {
        "groups": {g: {"sets": sets, "cases": len(_keys(ref, sets))} for g, sets in groups.items()},
        "conditions": {},
        "paired": {},
        "policies": {},
        "seeds": seeds,
        "worst_fraction": k,
        "runs": {
            f"{r['condition']}_s{r['seed']}": {
                "least_loss_epoch": r["least_loss_epoch"],
                "choices": r["choices"],
                "train_seconds": r["train_seconds"],
                "optimizer_steps": r["optimizer_steps"],
                "audit_clean_max_abs_diff": r["audit_clean_max_abs_diff"],
            }
            for r in results
        },
    }
    for g, sets in groups.items():
        keys = _keys(ref, sets)
        out["conditions"][g] = {}
        for c in conds:
            rs = sorted((r for r in results if r["condition"] == c), key=lambda r: r["seed"])
            row: dict = {
                "clean_dice": mean_std([100 * _dice(r, "least_loss", keys).mean() for r in rs]),
                "worst_k_dice": mean_std(
                    [100 * worst_fraction_mean(_dice(r, "least_loss", keys), k) for r in rs]
                ),
            }
            for col in EFR_COLS:
                row[col] = mean_std([100 * e.sum() / n.sum() for e, n in (_errors(r, col, keys) for r in rs)])
            perts = sorted(
                {
                    p
                    for r in rs
                    for s, cid in keys
                    for p in r["mr"][s][cid]["errors_dice@0.25_by_perturbation"]
                }
            )
            tests_per = {p: sum(1 for t in rs[0]["tests"] if t[0] == p) for p in perts}
            row["efr_dice@0.25_by_perturbation"] = {
                p: mean_std(
                    [
                        100
                        * sum(
                            r["mr"][s][cid]["errors_dice@0.25_by_perturbation"].get(p, 0) for s, cid in keys
                        )
                        / (tests_per[p] * len(keys))
                        for r in rs
                    ],
                    1,
                )
                for p in perts
            }
            out["conditions"][g][c] = row
        out["paired"][g] = {}
        for a, b in PAIRS:
            if a not in conds or b not in conds:
                continue
            pr = {}
            da = _matrix(results, a, seeds, lambda r: _dice(r, "least_loss", keys))
            db = _matrix(results, b, seeds, lambda r: _dice(r, "least_loss", keys))
            pr["clean_dice_points"] = _scaled(paired_bootstrap(da, db, mean_difference, args.n_boot), 100)
            pr["worst_k_dice_points"] = _scaled(
                paired_bootstrap(da, db, worst_fraction_difference(k), args.n_boot), 100
            )
            for col in EFR_COLS:
                ea = _matrix(results, a, seeds, lambda r: _errors(r, col, keys)[0])
                eb = _matrix(results, b, seeds, lambda r: _errors(r, col, keys)[0])
                n = _matrix(results, a, seeds, lambda r: _errors(r, col, keys)[1])
                pr[f"{col}_points"] = _scaled(
                    paired_bootstrap(ea / n, eb / n, mean_difference, args.n_boot), 100
                )
                pr[f"{col}_relative_pct"] = _scaled(
                    paired_bootstrap(ea, eb, relative_change, args.n_boot), 100
                )
            out["paired"][g][f"{a}-{b}"] = pr
        out["policies"][g] = {}
        for c in conds:
            rs = sorted((r for r in results if r["condition"] == c), key=lambda r: r["seed"])
            pols = {}
            base = _matrix(results, c, seeds, lambda r: _dice(r, "least_loss", keys))
            for p in rs[0]["picks"]:
                m = _matrix(results, c, seeds, lambda r, p=p: _dice(r, p, keys))
                pols[p] = {
                    "epochs": [r["picks"][p]["epoch"] for r in rs],
                    "val_cohort": mean_std([100 * r["picks"][p]["val_cohort"] for r in rs]),
                    "val_worst_k": mean_std([100 * (r["picks"][p]["val_worst_k"] or np.nan) for r in rs]),
                    "cohort": mean_std([100 * x.mean() for x in m]),
                    "worst_k": mean_std([100 * worst_fraction_mean(x, k) for x in m]),
                    "d_cohort": _scaled(paired_bootstrap(m, base, mean_difference, args.n_boot), 100),
                    "d_worst_k": _scaled(
                        paired_bootstrap(m, base, worst_fraction_difference(k), args.n_boot), 100
                    ),
                }
            out["policies"][g][c] = pols
    out["targets"] = targets(out)
    return out


def _scaled(r: dict, f: float) -> dict:
    return {**r, **{key: round(f * r[key], 2) for key in ("estimate", "lo", "hi")}}


def targets(s: dict) -> dict:
    """The issue's targets, checked on the numbers (True / False, with the margin)."""
    out: dict = {}
    for g in ("in-domain", "out-of-domain"):
        if g not in s["paired"] or "mined-plain" not in s["paired"][g]:
            continue
        mp, c = s["paired"][g]["mined-plain"], s["conditions"][g]
        rel = mp["efr_dice@0.25_relative_pct"]["estimate"]
        below_random = (
            c["mined"]["efr_dice@0.25"]["mean"] < c["random"]["efr_dice@0.25"]["mean"]
            if "random" in c
            else None
        )
        dice = mp["clean_dice_points"]["estimate"]
        out[f"mining/{g}"] = {
            "relative_efr_pct": rel,
            "needed_pct": -25.0,
            "efr_met": rel <= -25.0,
            "below_random": below_random,
            "clean_dice_points": dice,
            "dice_met": dice >= -1.0,
            "met": bool(rel <= -25.0 and below_random and dice >= -1.0),
        }
        for cond, pols in s["policies"][g].items():
            best = None
            for p in BALANCED:
                if p not in pols:
                    continue
                dw, dc = pols[p]["d_worst_k"]["estimate"], pols[p]["d_cohort"]["estimate"]
                met = dw >= 5.0 and dc >= -1.0
                if best is None or (met, dw) > (best["met"], best["d_worst_k_points"]):
                    best = {"policy": p, "d_worst_k_points": dw, "d_cohort_points": dc, "met": met}
            out[f"policy/{g}/{cond}"] = best
    return out


def _ms(d: dict, digits: int = 2) -> str:
    return f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}"


def _ci(d: dict) -> str:
    if not np.isfinite(d["estimate"]):
        return "n/a (no errors in the reference)"
    return f"{d['estimate']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def write_tables(s: dict, args) -> str:
    k = f"{100 * s['worst_fraction']:g}"
    L = [
        f"# Evidence v2 — {args.dataset}",
        "",
        f"seeds {s['seeds']}, {args.epochs} epochs, {args.size} px, BasicUNet {args.features}; "
        f"worst-k = mean Dice of the worst {k} % of held-out cases. Mean ± std over seeds; "
        "[95 % case-bootstrap CI] of paired differences.",
        "",
    ]
    L += ["| group | sets | cases |", "|---|---|---|"]
    L += [f"| {g} | {', '.join(v['sets'])} | {v['cases']} |" for g, v in s["groups"].items()]
    L += ["", "## Conditions at the least-validation-loss checkpoint (held-out)", ""]
    main = [g for g in ("in-domain", "out-of-domain") if g in s["conditions"]]
    for g in main:
        conds = s["conditions"][g]
        L += [
            f"**{g}** ({s['groups'][g]['cases']} cases)",
            "",
            "| condition | clean Dice | worst-k Dice | EFR Dice@0.25 | EFR Dice@0.5 | EFR IoU@0.25 | EFR IoU@0.5 |",
            "|---|---|---|---|---|---|---|",
        ]
        for c, row in conds.items():
            L.append(
                f"| {c} | {_ms(row['clean_dice'])} | {_ms(row['worst_k_dice'])} | "
                + " | ".join(_ms(row[col]) for col in EFR_COLS)
                + " |"
            )
        L.append("")
    per_set = [g for g in s["conditions"] if g not in main]
    if per_set:
        conds = list(s["conditions"][main[0]])
        L += [
            "Per held-out set: clean Dice / EFR Dice@0.25 (mean over seeds)",
            "",
            "| set | cases | " + " | ".join(conds) + " |",
            "|---" * (len(conds) + 2) + "|",
        ]
        for g in per_set:
            row = s["conditions"][g]
            L.append(
                f"| {g} | {s['groups'][g]['cases']} | "
                + " | ".join(
                    f"{row[c]['clean_dice']['mean']:.1f} / {row[c]['efr_dice@0.25']['mean']:.1f}"
                    for c in conds
                )
                + " |"
            )
        L.append("")
    L += [
        "## Paired differences (same seed, same held-out cases)",
        "",
        "| group | pair | Δ EFR Dice@0.25 (points) | relative Δ EFR Dice@0.25 (%) | relative Δ EFR IoU@0.25 (%) "
        "| Δ clean Dice (points) | Δ worst-k Dice (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, pairs in s["paired"].items():
        if g not in main:
            continue
        for name, pr in pairs.items():
            L.append(
                f"| {g} | {name} | {_ci(pr['efr_dice@0.25_points'])} | {_ci(pr['efr_dice@0.25_relative_pct'])} | "
                f"{_ci(pr['efr_iou@0.25_relative_pct'])} | {_ci(pr['clean_dice_points'])} | "
                f"{_ci(pr['worst_k_dice_points'])} |"
            )
    L += ["", "## EFR Dice@0.25 by perturbation (%, least-loss checkpoint)", ""]
    for g in [g for g in ("in-domain", "out-of-domain") if g in s["conditions"]]:
        conds = s["conditions"][g]
        perts = sorted({p for row in conds.values() for p in row["efr_dice@0.25_by_perturbation"]})
        L += [f"**{g}**", "", "| condition | " + " | ".join(perts) + " |", "|---" * (len(perts) + 1) + "|"]
        for c, row in conds.items():
            L.append(
                f"| {c} | "
                + " | ".join(_ms(row["efr_dice@0.25_by_perturbation"][p], 1) for p in perts)
                + " |"
            )
        L.append("")
    L += [
        "## Checkpoint policies: chosen on validation, reported on held-out data",
        "",
        "Δ = paired difference to the least-loss checkpoint of the same run (points, [95 % CI]).",
        "",
    ]
    for g in [g for g in ("in-domain", "out-of-domain") if g in s["policies"]]:
        for c, pols in s["policies"][g].items():
            L += [
                f"**{g}, {c}**",
                "",
                "| policy | epochs (per seed) | val cohort | val worst-k | held-out cohort | held-out worst-k "
                "| Δ cohort | Δ worst-k |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for p, v in pols.items():
                L.append(
                    f"| {p} | {v['epochs']} | {_ms(v['val_cohort'], 1)} | {_ms(v['val_worst_k'], 1)} | "
                    f"{_ms(v['cohort'], 1)} | {_ms(v['worst_k'], 1)} | {_ci(v['d_cohort'])} | {_ci(v['d_worst_k'])} |"
                )
            L.append("")
    L += ["## Targets", "", "```", __import__("json").dumps(s["targets"], indent=1), "```", ""]
    return "\n".join(L)
