"""Evidence v3 (issue 22) summary and tables: ``run.py --dataset polyp256`` results → numbers.

Groups of held-out cases: ``kvasir_test`` (in-domain), ``cvc_clinicdb`` (all 609 frames, the main
out-of-domain set; bootstrap clusters = its 29 video sequences) and ``other_ood`` (ColonDB, ETIS and
the PolypGen centres pooled). Metrics per group, at a checkpoint: clean Dice (every case), worst-10 %
Dice, and on the cases the MR suite scored (a fixed seeded subset where ``--efr-cases`` is set):
EFR Dice@0.25 and corrupted Dice (mean Dice over the suite's follow-ups). Paired differences use the
seeds both conditions finished, and a bootstrap that resamples cases (ClinicDB: sequences).
Works on partial grids (any finished subset of runs). All numbers in % / points.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.evidence.conditions import mean_std
from benchmarks.evidence.paired_stats import (
    mean_difference,
    paired_bootstrap,
    relative_change,
    worst_fraction_difference,
)

GROUPS = {
    "kvasir_test": lambda s: s == "kvasir_test",
    "cvc_clinicdb": lambda s: s == "cvc_clinicdb",
    "other_ood": lambda s: s not in ("kvasir_test", "cvc_clinicdb"),
}
LABEL = {
    "plain": "plain",
    "mt_random": "random (MT k=1)",
    "random": "random (slots, v2)",
    "mined": "mined replay",
    "metamorphic": "metamorphic (k=4, λ=1)",
    "consistency_only": "consistency only (k=1, λ=1)",
    "worst_of_k_only": "worst-of-k only (k=4, λ=0)",
    "metamorphic_uniform": "metamorphic, uniform families (k=4, λ=1, ε=1)",
}
PAIRS = [
    ("metamorphic", "mt_random"),
    ("metamorphic", "plain"),
    ("mt_random", "plain"),
    ("mined", "mt_random"),
    ("consistency_only", "mt_random"),
    ("worst_of_k_only", "mt_random"),
    ("metamorphic", "worst_of_k_only"),
    ("metamorphic", "consistency_only"),
    ("metamorphic_uniform", "mt_random"),
    ("metamorphic", "metamorphic_uniform"),
]
COMPARE_AT = ("least_loss", "last")
POLICY_REFERENCE = "last"


def _sets(r, group):
    return [s for s in sorted(r["picks"]["last"]["dice"]) if GROUPS[group](s)]


def _keys(r, group, efr_policy=None):
    """(set, case) keys of the group: all cases, or those the MR suite scored at ``efr_policy``."""
    if efr_policy is None:
        return [(s, c) for s in _sets(r, group) for c in sorted(r["picks"]["last"]["dice"][s])]
    mr = r.get("mr_by_policy", {}).get(efr_policy)
    if mr is None:
        return []
    return [(s, c) for s in _sets(r, group) for c in sorted(mr.get(s, {}))]


def _clusters(r, keys):
    cl = r.get("clusters", {})
    return [cl.get(f"{s}/{c}", f"{s}/{c}") for s, c in keys]


def _dice(r, policy, keys):
    d = r["picks"][policy]["dice"]
    return np.array([d[s][c] for s, c in keys])


def _mr(r, policy, keys, field):
    mr = r["mr_by_policy"][policy]
    if field == "efr":
        return np.array([mr[s][c]["errors_dice@0.25"] for s, c in keys]), np.array(
            [mr[s][c]["tests"] for s, c in keys]
        )
    return np.array([mr[s][c]["corrupted_dice"] for s, c in keys])


def _picked(pick: dict) -> int | str:
    """The epoch a policy chose, or what an average holds ("avg of 9 (16-29)", "EMA 0.999")."""
    if pick.get("epoch") is not None:
        return int(pick["epoch"])
    avg = pick.get("average") or {}
    used = avg.get("averaged_epochs")
    if used:
        return f"avg of {len(used)} ({min(used)}-{max(used)})"
    return f"EMA {avg['decay']}" if "decay" in avg else "none"


def _runs(results, cond, seeds=None):
    rs = sorted((r for r in results if r["condition"] == cond), key=lambda r: r["seed"])
    return [r for r in rs if seeds is None or r["seed"] in seeds]


def _pts(d: dict) -> dict:
    return {**d, **{k: round(100 * d[k], 2) for k in ("estimate", "lo", "hi")}}


def condition_row(rs, group, policy, k) -> dict:
    from robusttrain.cornercases import worst_fraction_mean

    keys = _keys(rs[0], group)
    row = {
        "seeds": [r["seed"] for r in rs],
        "cases": len(keys),
        "clean_dice": mean_std([100 * _dice(r, policy, keys).mean() for r in rs]),
        "worst_k_dice": mean_std([100 * worst_fraction_mean(_dice(r, policy, keys), k) for r in rs]),
    }
    ek = _keys(rs[0], group, policy)
    if ek and all(policy in r.get("mr_by_policy", {}) for r in rs):
        row["efr_cases"] = len(ek)
        row["efr_dice@0.25"] = mean_std(
            [100 * e.sum() / n.sum() for e, n in (_mr(r, policy, ek, "efr") for r in rs)]
        )
        row["corrupted_dice"] = mean_std([100 * _mr(r, policy, ek, "corrupted").mean() for r in rs])
    return row


def paired_row(ra, rb, group, policy, k, n_boot) -> dict:
    keys = _keys(ra[0], group)
    cl = _clusters(ra[0], keys)
    da = np.stack([_dice(r, policy, keys) for r in ra])
    db = np.stack([_dice(r, policy, keys) for r in rb])
    out = {
        "seeds": [r["seed"] for r in ra],
        "clean_dice_points": _pts(paired_bootstrap(da, db, mean_difference, n_boot, clusters=cl)),
        "worst_k_dice_points": _pts(
            paired_bootstrap(da, db, worst_fraction_difference(k), n_boot, clusters=cl)
        ),
    }
    ek = _keys(ra[0], group, policy)
    if ek and all(policy in r.get("mr_by_policy", {}) for r in ra + rb):
        ecl = _clusters(ra[0], ek)
        ea = np.stack([_mr(r, policy, ek, "efr")[0] for r in ra])
        eb = np.stack([_mr(r, policy, ek, "efr")[0] for r in rb])
        n = np.stack([_mr(r, policy, ek, "efr")[1] for r in ra])
        out["efr_dice@0.25_points"] = _pts(
            paired_bootstrap(ea / n, eb / n, mean_difference, n_boot, clusters=ecl)
        )
        out["efr_dice@0.25_relative_pct"] = _pts(
            paired_bootstrap(ea, eb, relative_change, n_boot, clusters=ecl)
        )
        ca = np.stack([_mr(r, policy, ek, "corrupted") for r in ra])
        cb = np.stack([_mr(r, policy, ek, "corrupted") for r in rb])
        out["corrupted_dice_points"] = _pts(paired_bootstrap(ca, cb, mean_difference, n_boot, clusters=ecl))
    return out


def efr_by_family(rs: list[dict], group: str, policy: str) -> dict:
    """EFR Dice@0.25 (%) per perturbation family on the group's MR-scored cases, mean ± std over the
    runs ``rs`` (one condition): errors / tests of that family (the suite runs every family at the
    same severities, so each case has ``tests / families`` tests per family)."""
    ek = _keys(rs[0], group, policy)
    if not ek or not all(policy in r.get("mr_by_policy", {}) for r in rs):
        return {}
    per: dict[str, list[float]] = {}
    for r in rs:
        mr = r["mr_by_policy"][policy]
        errors: dict[str, float] = {}
        tests = 0.0
        for s, c in ek:
            by = mr[s][c].get("errors_dice@0.25_by_perturbation") or {}
            if not by:
                return {}
            tests += mr[s][c]["tests"] / len(by)
            for fam, e in by.items():
                errors[fam] = errors.get(fam, 0.0) + e
        for fam, e in errors.items():
            per.setdefault(fam, []).append(100.0 * e / tests)
    return {f: mean_std(v) for f, v in sorted(per.items())}


FAMILY_MIX_FROM_EPOCH = 5  # the weights follow the MR check's rates from the first checks on


def family_mix(out: Path, results: list[dict], from_epoch: int = FAMILY_MIX_FROM_EPOCH) -> dict:
    """What each MetamorphicTraining condition trained on: per family, the share (%) of the kept
    follow-ups over epochs ``>= from_epoch``, from each run's ``metamorphic_training.csv`` (the
    ``chosen`` counts), as mean ± std over the seeds that have the file.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); (d / "metamorphic_s0").mkdir()
    >>> rows = ["epoch,family,chosen", "5,blur,30", "5,saturation,10", "6,blur,10", "6,saturation,50"]
    >>> _ = (d / "metamorphic_s0" / "metamorphic_training.csv").write_text("\\n".join(rows) + "\\n")
    >>> family_mix(d, [{"condition": "metamorphic", "seed": 0}])["metamorphic"]["saturation"]["mean"]
    60.0
    """
    from robusttrain.rundir.metamorphic_training import read_stats

    shares: dict[str, dict[str, list[float]]] = {}
    for r in results:
        stats = read_stats(out / f"{r['condition']}_s{r['seed']}")
        if stats is None:
            continue
        kept = stats[stats["epoch"] >= from_epoch].groupby("family")["chosen"].sum()
        total = float(kept.sum())
        if total > 0:
            by = shares.setdefault(r["condition"], {})
            for fam, n in kept.items():
                by.setdefault(str(fam), []).append(100.0 * float(n) / total)
    return {c: {f: mean_std(v) for f, v in sorted(fams.items())} for c, fams in shares.items()}


def summarise_v3(results: list[dict], args, out: Path | None = None) -> dict:
    from robusttrain.cornercases import worst_fraction_mean

    k, n_boot = args.worst_fraction, args.n_boot
    conds = [c for c in LABEL if any(r["condition"] == c for r in results)]
    s: dict = {
        "worst_fraction": k,
        "conditions_run": {c: [r["seed"] for r in _runs(results, c)] for c in conds},
        "runs": {
            f"{r['condition']}_s{r['seed']}": {
                key: r.get(key)
                for key in (
                    "least_loss_epoch",
                    "choices",
                    "train_seconds",
                    "heldout_seconds",
                    "optimizer_steps",
                    "params",
                    "resumed",
                    "audit_clean_max_abs_diff",
                    "n_efr_cases",
                    "n_held_out_cases",
                )
            }
            for r in results
        },
        "groups": {},
        "conditions": {},
        "paired": {},
        "policies": {},
    }
    if not results:
        return s
    for g in GROUPS:
        keys = _keys(results[0], g)
        s["groups"][g] = {
            "sets": _sets(results[0], g),
            "cases": len(keys),
            "clusters": len(set(_clusters(results[0], keys))),
        }
        s["conditions"][g] = {
            p: {c: condition_row(_runs(results, c), g, p, k) for c in conds} for p in COMPARE_AT
        }
        s["paired"][g] = {}
        for p in COMPARE_AT:
            for a, b in PAIRS:
                seeds = sorted(
                    {r["seed"] for r in _runs(results, a)} & {r["seed"] for r in _runs(results, b)}
                )
                if seeds:
                    s["paired"][g].setdefault(p, {})[f"{a}-{b}"] = paired_row(
                        _runs(results, a, seeds), _runs(results, b, seeds), g, p, k, n_boot
                    )
        s["policies"][g] = {}
        for c in conds:
            rs = _runs(results, c)
            keys = _keys(rs[0], g)
            cl = _clusters(rs[0], keys)
            base = np.stack([_dice(r, POLICY_REFERENCE, keys) for r in rs])
            pols = {}
            for p in rs[0]["picks"]:
                m = np.stack([_dice(r, p, keys) for r in rs])
                pols[p] = {
                    "epochs": [_picked(r["picks"][p]) for r in rs],
                    "dice": mean_std([100 * x.mean() for x in m]),
                    "worst_k": mean_std([100 * worst_fraction_mean(x, k) for x in m]),
                    "d_dice": _pts(paired_bootstrap(m, base, mean_difference, n_boot, clusters=cl)),
                    "d_worst_k": _pts(
                        paired_bootstrap(m, base, worst_fraction_difference(k), n_boot, clusters=cl)
                    ),
                }
            s["policies"][g][c] = pols
    s["efr_by_family"] = {
        g: {c: efr_by_family(_runs(results, c), g, "least_loss") for c in conds} for g in GROUPS
    }
    s["targets"] = targets_v3(s)
    if out is not None:
        s["family_mix"] = family_mix(out, results)
    return s


def targets_v3(s: dict) -> dict:
    """The issue-22 targets on the numbers so far (met / not met, with the margins)."""
    out: dict = {}
    floor = {c: row["clean_dice"]["mean"] for c, row in s["conditions"]["kvasir_test"]["least_loss"].items()}
    out["dice_floor_0.70_kvasir"] = {c: {"clean_dice": v, "met": v >= 70.0} for c, v in floor.items()}
    for p in COMPARE_AT:
        per: dict = {}
        for g in ("kvasir_test", "cvc_clinicdb"):
            pr = s["paired"][g].get(p, {}).get("metamorphic-mt_random")
            if pr is None or "efr_dice@0.25_relative_pct" not in pr:
                continue
            rel, dice = pr["efr_dice@0.25_relative_pct"], pr["clean_dice_points"]
            per[g] = {
                "relative_efr_pct": rel["estimate"],
                "ci": [rel["lo"], rel["hi"]],
                "clean_dice_points": dice["estimate"],
                "seeds": pr["seeds"],
                "met": bool(rel["estimate"] <= -10.0 and rel["hi"] < 0 and dice["estimate"] >= -1.0),
            }
        if per:
            out[f"metamorphic_vs_random/{p}"] = {
                **per,
                "met": len(per) == 2 and all(v["met"] for v in per.values()),
            }
    for avg in AVERAGES:
        out[f"{avg}_vs_last"] = average_target(s, avg)
    return out


AVERAGES = ("balanced_average", "ema")
# the weight-average target: >= +1 point worst-10 % Dice in-domain, or OOD Dice, CI excluding 0
AVERAGE_TARGETS = (
    ("kvasir_test", "d_worst_k"),
    ("cvc_clinicdb", "d_dice"),
    ("other_ood", "d_dice"),
)


def average_target(s: dict, avg: str) -> dict:
    """Per condition: the average vs ``last`` on each of :data:`AVERAGE_TARGETS` (met when one of them
    gains >= 1 point with the CI above 0). The verdict is judged on the recipe default (``metamorphic``):
    taking the best of six conditions would be a multiple-comparison win."""
    per: dict = {}
    for g, key in AVERAGE_TARGETS:
        for c, pols in s["policies"].get(g, {}).items():
            d = pols.get(avg, {}).get(key)
            if d is None or not np.isfinite(d["estimate"]):
                continue
            ok = bool(d["estimate"] >= 1.0 and d["lo"] > 0)
            per.setdefault(c, {})[f"{g}/{key}"] = {
                "points": d["estimate"],
                "ci": [d["lo"], d["hi"]],
                "met": ok,
            }
    if not per:
        return {"met": False, "why": f"not measured: no finished run has a {avg} checkpoint"}
    for v in per.values():
        v["met"] = any(x["met"] for x in v.values() if isinstance(x, dict))
    judged = "metamorphic" if "metamorphic" in per else None
    return {"conditions": per, "judged_on": judged, "met": bool(judged and per[judged]["met"])}


def _ms(d, digits=1):
    return f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}" if d else "–"


def _ci(d):
    if d is None:
        return "–"
    if not np.isfinite(d["estimate"]):
        return "n/a"
    return f"{d['estimate']:+.1f} [{d['lo']:+.1f}, {d['hi']:+.1f}]"


def _family_table(title: list[str], by: dict[str, dict], digits: int) -> list[str]:
    """A markdown table (after ``title``) of ``{condition: {family: mean_std}}``, one row per condition
    with numbers; nothing when no condition has any."""
    fams = sorted({f for v in by.values() for f in v})
    if not fams:
        return []
    return [
        *title,
        "",
        "| condition | " + " | ".join(fams) + " |",
        "|---|" + "---|" * len(fams),
        *(
            f"| {LABEL.get(c, c)} | " + " | ".join(_ms(v.get(f), digits) for f in fams) + " |"
            for c, v in by.items()
            if v
        ),
        "",
    ]


def write_tables_v3(s: dict, args) -> str:
    k = f"{100 * s['worst_fraction']:g}"
    L = [
        "# Evidence v3 — polyp_256 (Kvasir-SEG → held-out Kvasir, CVC-ClinicDB, ColonDB/ETIS/PolypGen)",
        "",
        f"{args.epochs} epochs, {args.size} px, BasicUNet {args.features}, batch {args.batch_size}, "
        f"lr {args.lr}; runs finished: " + json.dumps(s["conditions_run"]) + ". "
        f"worst-{k} % = mean Dice of the worst {k} % of cases; mean ± std over seeds; "
        "paired Δ = [95 % bootstrap CI over cases; ClinicDB: over sequences].",
        "",
    ]
    if not s["groups"]:
        return "\n".join(L + ["(no finished runs yet)"])
    L += ["| group | sets | cases | bootstrap clusters |", "|---|---|---|---|"]
    L += [
        f"| {g} | {', '.join(v['sets'])} | {v['cases']} | {v['clusters']} |" for g, v in s["groups"].items()
    ]
    for p in COMPARE_AT:
        L += ["", f"## Conditions at the `{p}` checkpoint", ""]
        for g, by in s["conditions"].items():
            L += [
                f"**{g}**",
                "",
                "| condition | seeds | clean Dice | worst-" + k + " % Dice | EFR Dice@0.25 "
                "| corrupted Dice | MR-scored cases |",
                "|---|---|---|---|---|---|---|",
            ]
            for c, row in by[p].items():
                L.append(
                    f"| {LABEL[c]} | {row['seeds']} | {_ms(row['clean_dice'])} | {_ms(row['worst_k_dice'])} | "
                    f"{_ms(row.get('efr_dice@0.25'))} | {_ms(row.get('corrupted_dice'))} | "
                    f"{row.get('efr_cases', '–')} |"
                )
            L.append("")
        L += [
            f"### Paired differences at `{p}` (A − B; points, relative EFR in %)",
            "",
            "| group | A − B | seeds | Δ EFR Dice@0.25 | rel. Δ EFR (%) | Δ clean Dice | Δ worst-" + k + " % "
            "| Δ corrupted Dice |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g, by in s["paired"].items():
            for name, pr in by.get(p, {}).items():
                L.append(
                    f"| {g} | {name} | {pr['seeds']} | {_ci(pr.get('efr_dice@0.25_points'))} | "
                    f"{_ci(pr.get('efr_dice@0.25_relative_pct'))} | {_ci(pr['clean_dice_points'])} | "
                    f"{_ci(pr['worst_k_dice_points'])} | {_ci(pr.get('corrupted_dice_points'))} |"
                )
    L += [
        "",
        f"## Checkpoints: chosen on the Kvasir validation split, reported held-out (Δ vs `{POLICY_REFERENCE}`)",
        "",
    ]
    for g, by in s["policies"].items():
        for c, pols in by.items():
            L += [
                f"**{g}, {LABEL[c]}**",
                "",
                f"| checkpoint | epochs | Dice | worst-{k} % | Δ Dice | Δ worst-{k} % |",
                "|---|---|---|---|---|---|",
            ]
            L += [
                f"| {p} | {', '.join(map(str, v['epochs']))} | {_ms(v['dice'])} | {_ms(v['worst_k'])} | {_ci(v['d_dice'])} | "
                f"{_ci(v['d_worst_k'])} |"
                for p, v in pols.items()
            ]
            L.append("")
    for g, by in (s.get("efr_by_family") or {}).items():
        L += _family_table(
            [f"## EFR Dice@0.25 per family at `least_loss`: {g} (%, mean ± std over seeds)"], by, digits=1
        )
    L += _family_table(
        [
            f"## What the MetamorphicTraining conditions trained on (epochs >= {FAMILY_MIX_FROM_EPOCH})",
            "",
            "Share (%) of the kept follow-ups per family (`metamorphic_training.csv`, `chosen`), mean ± std "
            "over seeds.",
        ],
        s.get("family_mix") or {},
        digits=0,
    )
    L += [
        "## Runs",
        "",
        "```",
        json.dumps(s["runs"], indent=1),
        "```",
        "",
        "## Targets (issue 22)",
        "",
        "```",
        json.dumps(s["targets"], indent=1),
        "```",
        "",
    ]
    return "\n".join(L)
