"""Evidence v4 (issue 34) tables: ``run.py --protocol v4`` results -> the pre-registered endpoints.

``docs/evidence_v4/PROTOCOL.md`` defines everything here. Per run and checkpoint, from ``result.json``:

- primary (a) ``heldout_dice``: mean Dice on the held-out-family follow-ups of the MR-scored Kvasir
  test and ClinicDB cases (per case: the mean over its held-out families' follow-ups);
- primary (b) ``clinicdb_dice``: clean Dice on all ClinicDB frames;
- secondary: ``infamily_dice`` (the same as (a) over the in-family families), ``worst_family_dice``
  (the lowest per-family mean follow-up Dice, any test family; the tables name which family it was),
  ``efr`` (EFR Dice@0.25 over every test, %),
  ``kvasir_dice`` (in-domain clean Dice), ``worst10_kvasir`` / ``worst10_clinicdb`` (mean clean Dice of
  the worst 10 % of cases), ``other_ood_dice`` (ColonDB, ETIS, PolypGen pooled).

Every comparison is a condition against ``random`` on the seeds both finished, paired by seed:
a seed-level t-interval (``paired_stats.seed_interval``) beside the case bootstrap (ClinicDB frames
resampled by video sequence). Works on any finished subset; tables then say "partial: N of M runs".

The tables of an archive, without restoring or retraining anything (what ``docs/evidence_v4/results.md``
is; the decision section depends on the runs only, the bootstrap columns also on ``--n-boot``)::

    python -m benchmarks.evidence.report_v4 docs/evidence_v4/runs --out docs/evidence_v4/results.md

Exploratory (not in the protocol, labelled so): ``worst_heldout_family_dice`` (the lowest held-out
family's mean follow-up Dice: the protocol's worst family can be one the condition trained on); each checkpoint rule against ``least_loss`` within the
same runs (does the balanced average / EMA / last epoch beat the pre-registered checkpoint?), per
condition over its seeds and pooled over every finished run (one run = one observation).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.evidence.conditions import mean_std
from benchmarks.evidence.paired_stats import paired_bootstrap, seed_interval

REFERENCE = "random"
PRIMARY_AT = "least_loss"  # the pre-registered checkpoint of every comparison
ALSO_AT = ("last", "balanced_average", "ema")
MR_SETS = ("kvasir_test", "cvc_clinicdb")
LABEL = {
    "plain": "plain",
    "random": "random (k=1, in place)",
    "hard_consistency": "hard + consistency (AugMax, k=4)",
    "augmix_consistency": "AugMix chains + consistency",
    "random_shift": "random + shift families",
    "mined_dose": "mined replay at random's dose",
}


def _group(s: str, group: str) -> bool:
    if group == "other_ood":
        return s not in ("kvasir_test", "cvc_clinicdb")
    return s == group


def _clean_keys(r: dict, group: str) -> list[tuple[str, str]]:
    dice = r["picks"]["last"]["dice"]
    return [(s, c) for s in sorted(dice) if _group(s, group) for c in sorted(dice[s])]


def _mr_keys(r: dict, policy: str) -> list[tuple[str, str]]:
    mr = r.get("mr_by_policy", {}).get(policy) or {}
    return [(s, c) for s in MR_SETS for c in sorted(mr.get(s, {}))]


def _clean(r, policy, keys):
    d = r["picks"][policy]["dice"]
    return np.array([d[s][c] for s, c in keys])


def _families(r, policy, keys, fams):
    """(cases, families) mean follow-up Dice."""
    mr = r["mr_by_policy"][policy]
    return np.array([[mr[s][c]["fol_dice_by_perturbation"][f] for f in fams] for s, c in keys])


def _efr(r, policy, keys):
    mr = r["mr_by_policy"][policy]
    return np.array([mr[s][c]["errors_dice@0.25"] / mr[s][c]["tests"] for s, c in keys])


def _worst10(x):
    from robusttrain.cornercases import worst_fraction_mean

    return worst_fraction_mean(x, 0.1)


@dataclass(frozen=True)
class Endpoint:
    """One endpoint: the cases it rests on, a run's per-case values and the per-seed number they make."""

    name: str
    label: str
    keys: Callable[[dict, str], list]  # (run, policy) -> [(set, case)]
    values: Callable[[dict, str, list], np.ndarray]  # (run, policy, keys) -> (cases,) or (cases, fams)
    per_seed: Callable[[np.ndarray], float] = np.mean  # a run's values -> its number (fraction)
    exploratory: bool = False  # added after the protocol: shown, labelled, never in the decision

    def stat(self, a: np.ndarray, b: np.ndarray) -> float:
        """Mean over seeds of per_seed(A_s) - per_seed(B_s) (the paired statistic)."""
        return float(np.mean([self.per_seed(x) - self.per_seed(y) for x, y in zip(a, b)]))


def _worst_family(name: str, label: str, families: str, exploratory: bool = False) -> Endpoint:
    """An endpoint: the lowest mean follow-up Dice of the run's ``families`` (a result.json key)."""
    return Endpoint(
        name,
        label,
        _mr_keys,
        lambda r, p, k: _families(r, p, k, r[families]),
        lambda x: float(np.min(x.mean(axis=0))),
        exploratory,
    )


ENDPOINTS = (
    Endpoint(
        "heldout_dice",
        "(a) held-out-family follow-up Dice, Kvasir test + ClinicDB",
        _mr_keys,
        lambda r, p, k: _families(r, p, k, r["heldout_families"]).mean(axis=1),
    ),
    Endpoint("clinicdb_dice", "(b) ClinicDB clean Dice", lambda r, p: _clean_keys(r, "cvc_clinicdb"), _clean),
    Endpoint(
        "infamily_dice",
        "in-family follow-up Dice, Kvasir test + ClinicDB",
        _mr_keys,
        lambda r, p, k: _families(r, p, k, r["infamily_families"]).mean(axis=1),
    ),
    _worst_family(
        "worst_family_dice",
        "worst-family follow-up Dice (lowest family mean), Kvasir test + ClinicDB",
        "test_families",
    ),
    # PROTOCOL.md amendment of 2026-11-27 17:22: the worst family may be one the condition trained on
    _worst_family(
        "worst_heldout_family_dice",
        "worst held-out family follow-up Dice (lowest held-out family mean), Kvasir test + ClinicDB",
        "heldout_families",
        exploratory=True,
    ),
    Endpoint("efr", "EFR Dice@0.25 (%, every test), Kvasir test + ClinicDB", _mr_keys, _efr),
    Endpoint(
        "kvasir_dice",
        "in-domain clean Dice (Kvasir test)",
        lambda r, p: _clean_keys(r, "kvasir_test"),
        _clean,
    ),
    Endpoint(
        "worst10_kvasir",
        "worst-10 % clean Dice, Kvasir test",
        lambda r, p: _clean_keys(r, "kvasir_test"),
        _clean,
        _worst10,
    ),
    Endpoint(
        "worst10_clinicdb",
        "worst-10 % clean Dice, ClinicDB",
        lambda r, p: _clean_keys(r, "cvc_clinicdb"),
        _clean,
        _worst10,
    ),
    Endpoint(
        "other_ood_dice",
        "other-OOD clean Dice (ColonDB, ETIS, PolypGen)",
        lambda r, p: _clean_keys(r, "other_ood"),
        _clean,
    ),
)
PRIMARY = ("heldout_dice", "clinicdb_dice")
BY_NAME = {e.name: e for e in ENDPOINTS}


def _available(rs: list[dict], ep: Endpoint, policy: str) -> bool:
    return all(policy in r["picks"] and ep.keys(r, policy) for r in rs)


def _matrix(rs, ep, policy):
    keys = ep.keys(rs[0], policy)
    cl = rs[0].get("clusters", {})
    return np.stack([ep.values(r, policy, keys) for r in rs]), [
        cl.get(f"{s}/{c}", f"{s}/{c}") for s, c in keys
    ]


def _pts(d: dict) -> dict:
    return {**d, **{k: 100 * d[k] for k in ("estimate", "lo", "hi")}}


def compare(ra, rb, ep: Endpoint, policy: str, n_boot: int, policy_b: str | None = None) -> dict:
    """A - B on the endpoint (points): the seed-level interval and the case/sequence bootstrap; B's runs
    at ``policy_b`` when given (a checkpoint rule against another within the same runs)."""
    a, cl = _matrix(ra, ep, policy)
    b, cl_b = _matrix(rb, ep, policy_b or policy)
    if cl != cl_b:  # the same cases in the same order, or the pairing is meaningless
        raise ValueError(
            f"{ep.name}: A at {policy} and B at {policy_b or policy} were scored on different cases"
        )
    seed = _pts(seed_interval(a, b, ep.stat))
    seed["per_seed"] = [100 * x for x in seed["per_seed"]]
    return {
        "seeds": [r["seed"] for r in ra],
        "seed_t": seed,
        "case_bootstrap": _pts(paired_bootstrap(a, b, ep.stat, n_boot, clusters=cl)),
    }


def worst_families(results: list[dict], conds: list[str], policy: str = PRIMARY_AT) -> dict:
    """``{condition: [family per seed]}``: which test family is each run's worst (lowest mean follow-up
    Dice over the MR-scored cases) -- the worst-family endpoint says how low, this says whether the
    family was one the condition trained on (held-out families are ``heldout_families``)."""
    out: dict = {}
    for c in conds:
        for r in _runs(results, c):
            keys = _mr_keys(r, policy)
            if keys:
                fams = r["test_families"]
                out.setdefault(c, []).append(
                    fams[int(np.argmin(_families(r, policy, keys, fams).mean(axis=0)))]
                )
    return out


def _runs(results, cond, seeds=None):
    rs = sorted((r for r in results if r["condition"] == cond), key=lambda r: r["seed"])
    return [r for r in rs if seeds is None or r["seed"] in seeds]


RUN_KEYS = ("least_loss_epoch", "train_seconds", "heldout_seconds", "optimizer_steps", "ema_decay")


def summary_head(results: list[dict], args, run_keys: tuple[str, ...] = RUN_KEYS) -> tuple[list[dict], dict]:
    """The finished runs among ``args.conditions`` x ``args.seeds`` (the protocol's grid, v4 and v5) and the
    summary's head: planned and finished runs, the seeds run per condition, ``run_keys`` of each run."""
    conds = args.conditions.split(",")
    seeds = [int(x) for x in args.seeds.split(",")]
    named = {(c, x) for c in conds for x in seeds}
    results = [r for r in results if (r["condition"], int(r["seed"])) in named]
    return results, {
        "planned": len(named),
        "finished": len(results),
        "conditions_run": {c: [r["seed"] for r in _runs(results, c)] for c in conds},
        "runs": {f"{r['condition']}_s{r['seed']}": {k: r.get(k) for k in run_keys} for r in results},
    }


def summarise_v4(results: list[dict], args) -> dict:
    """The v4 summary of the finished runs among ``args.conditions`` x ``args.seeds``."""
    conds = args.conditions.split(",")
    results, head = summary_head(results, args)
    runs = head.pop("runs")  # last, as results.json has always listed it
    s: dict = {**head, "families": {}, "endpoints": {}, "paired": {}, "decision": {}, "runs": runs}
    if not results:
        return s
    r0 = results[0]
    s["families"] = {k: r0.get(k) for k in ("heldout_families", "infamily_families", "test_families_skipped")}
    for policy in (PRIMARY_AT, *ALSO_AT):
        per_ep: dict = {}
        pairs: dict = {}
        for ep in ENDPOINTS:
            rows = {}
            for c in conds:
                rs = _runs(results, c)
                if rs and _available(rs, ep, policy):
                    m, _ = _matrix(rs, ep, policy)
                    rows[c] = {
                        "seeds": [r["seed"] for r in rs],
                        **mean_std([100 * ep.per_seed(x) for x in m]),
                    }
            per_ep[ep.name] = rows
            ref = _runs(results, REFERENCE)
            for c in conds:
                if c == REFERENCE:
                    continue
                common = sorted({r["seed"] for r in _runs(results, c)} & {r["seed"] for r in ref})
                ra, rb = _runs(results, c, common), _runs(results, REFERENCE, common)
                if common and _available(ra + rb, ep, policy):
                    pairs.setdefault(c, {})[ep.name] = compare(ra, rb, ep, policy, args.n_boot)
        s["endpoints"][policy], s["paired"][policy] = per_ep, pairs
    s["decision"] = decide(s["paired"].get(PRIMARY_AT, {}), len(args.seeds.split(",")))
    s["worst_families"] = worst_families(results, conds)
    s["rules"] = rules_vs_least_loss(results, conds, args.n_boot)
    return s


def rules_vs_least_loss(results: list[dict], conds: list[str], n_boot: int) -> dict:
    """Exploratory: ``policy - least_loss`` within the same runs, per condition and pooled over every run
    (``{policy: {condition | "all": {endpoint: compare()}}}``); an endpoint only where both checkpoints
    were scored (the follow-up endpoints only at ``last``)."""
    out: dict = {}
    for policy in ALSO_AT:
        for c in (*conds, "all"):
            rs = results if c == "all" else _runs(results, c)
            rs = sorted(rs, key=lambda r: (r["condition"], r["seed"]))
            for ep in ENDPOINTS:
                if rs and _available(rs, ep, policy) and _available(rs, ep, PRIMARY_AT):
                    d = compare(rs, rs, ep, policy, n_boot, policy_b=PRIMARY_AT)
                    out.setdefault(policy, {}).setdefault(c, {})[ep.name] = d
    return out


def decide(pairs: dict, planned_seeds: int) -> dict:
    """Issue 34 item 7: a condition becomes the default when it beats random on both primary endpoints by
    >= 1 point with the seed-level interval above 0, at <= 1 point in-domain clean cost."""
    out = {}
    for c, eps in pairs.items():
        if not all(k in eps for k in (*PRIMARY, "kvasir_dice")):
            out[c] = {"meets": False, "why": "a primary endpoint or the in-domain cost is not measured"}
            continue
        prim = {k: eps[k]["seed_t"] for k in PRIMARY}
        cost = eps["kvasir_dice"]["seed_t"]["estimate"]
        ok = {k: bool(v["estimate"] >= 1.0 and v["lo"] > 0) for k, v in prim.items()}
        n = len(eps[PRIMARY[0]]["seeds"])
        out[c] = {
            **{f"{k}_points": round(v["estimate"], 2) for k, v in prim.items()},
            **{f"{k}_seed_lo": round(v["lo"], 2) for k, v in prim.items()},
            "in_domain_cost_points": round(cost, 2),
            "seeds": n,
            "meets": bool(all(ok.values()) and cost >= -1.0),
            "final": n >= planned_seeds,
        }
    return out


def _ms(d):
    return f"{d['mean']:.1f} ± {d['std']:.1f}" if d else "–"


def _ci(d):
    if d is None:
        return "–"
    lo, hi = d["lo"], d["hi"]
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{d['estimate']:+.1f} [n/a: 1 seed]"
    return f"{d['estimate']:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def partial_label(s: dict) -> str:
    """Empty when every planned run finished, else "partial: N of M runs"."""
    return "" if s["finished"] >= s["planned"] else f"partial: {s['finished']} of {s['planned']} runs"


def table_head(title: str, preface: str, s: dict) -> tuple[list[str], str]:
    """The tables' first lines (title with the partial label, the preface) and the label's " (partial ...)"
    tag the section titles repeat; one home for v4's and v5's."""
    part = partial_label(s)
    tag = f" ({part})" if part else ""
    return [f"{title}{tag}", "", preface, ""], tag


def write_tables_v4(s: dict, args) -> str:
    L, tag = table_head(
        "# Evidence v4 — held-out families and unseen centres",
        f"{args.epochs} epochs, {args.size} px, BasicUNet {args.features}, batch {args.batch_size}, lr {args.lr}; "
        f"runs finished: {json.dumps(s['conditions_run'])}. Protocol: docs/evidence_v4/PROTOCOL.md. "
        "Numbers in % (Dice, EFR); Δ vs random in points with [seed-level 95 % t-interval] and "
        "[95 % case bootstrap; ClinicDB by sequence].",
        s,
    )
    if not s["finished"]:
        return "\n".join(L + ["(no finished runs yet)"])
    L += [
        f"Held-out families: {s['families'].get('heldout_families')}; in-family: "
        f"{s['families'].get('infamily_families')}; requested but not run on RGB: "
        f"{s['families'].get('test_families_skipped')}.",
        "",
    ]
    L += [f"## Decision (issue 34 item 7, at `{PRIMARY_AT}`){tag}", ""]
    L += [
        "| condition | seeds | Δ (a) held-out Dice | Δ (b) ClinicDB Dice | in-domain cost | meets the rule |",
        "|---|---|---|---|---|---|",
    ]
    pairs = s["paired"].get(PRIMARY_AT, {})
    for c, d in s["decision"].items():
        eps = pairs.get(c, {})
        verdict = ("yes" if d["meets"] else "no") + ("" if d.get("final") else " (partial)")
        L.append(
            f"| {LABEL.get(c, c)} | {d.get('seeds', '–')} | {_ci((eps.get('heldout_dice') or {}).get('seed_t'))} | "
            f"{_ci((eps.get('clinicdb_dice') or {}).get('seed_t'))} | "
            f"{_ci((eps.get('kvasir_dice') or {}).get('seed_t'))} | {verdict} |"
        )
    for policy in (PRIMARY_AT, *ALSO_AT):
        per_ep, pairs = s["endpoints"].get(policy, {}), s["paired"].get(policy, {})
        if not any(per_ep.values()):
            continue
        kind = "pre-registered" if policy == PRIMARY_AT else "secondary checkpoint"
        L += ["", f"## At `{policy}` ({kind}){tag}", ""]
        for ep in ENDPOINTS:
            rows = per_ep.get(ep.name) or {}
            if not rows:
                continue
            primary = " — **primary**" if ep.name in PRIMARY else ""
            if ep.exploratory:
                primary = " — exploratory (not in the protocol)"
            L += [
                f"**{ep.label}**{primary}",
                "",
                "| condition | seeds | mean ± std | Δ vs random [seed t] | Δ vs random [case bootstrap] | per-seed Δ |",
                "|---|---|---|---|---|---|",
            ]
            for c, row in rows.items():
                pr = (pairs.get(c) or {}).get(ep.name)
                per = ", ".join(f"{x:+.1f}" for x in pr["seed_t"]["per_seed"]) if pr else "–"
                L.append(
                    f"| {LABEL.get(c, c)} | {row['seeds']} | {_ms(row)} | {_ci(pr and pr['seed_t'])} | "
                    f"{_ci(pr and pr['case_bootstrap'])} | {per} |"
                )
            if ep.name == "worst_family_dice" and policy == PRIMARY_AT and s.get("worst_families"):
                held = set(s["families"].get("heldout_families") or ())
                L += [
                    "",
                    "Worst family per seed (* = held out from training): "
                    + "; ".join(
                        f"{LABEL.get(c, c)}: " + ", ".join(f + ("*" if f in held else "") for f in fs)
                        for c, fs in s["worst_families"].items()
                    )
                    + ".",
                ]
            L.append("")
    L += _rules_tables(s.get("rules") or {}, tag)
    L += ["## Runs", "", "```", json.dumps(s["runs"], indent=1), "```", ""]
    return "\n".join(L)


RULE_ENDPOINTS = ("clinicdb_dice", "heldout_dice", "kvasir_dice", "worst10_clinicdb", "other_ood_dice")


def _rules_tables(rules: dict, tag: str) -> list[str]:
    if not rules:
        return []
    L = [
        f"## Checkpoint rules against `{PRIMARY_AT}`, within the same runs (exploratory){tag}",
        "",
        "Not in the protocol: Δ = rule − `least_loss` in points, [seed-level 95 % t-interval over the runs]; "
        "'all runs' pools every finished run of every condition (one run, one observation). '–': that "
        "checkpoint was not scored on that endpoint (follow-ups are scored at `least_loss` and `last` only).",
        "",
    ]
    head = " | ".join(BY_NAME[e].label for e in RULE_ENDPOINTS)
    for policy, by_cond in rules.items():
        L += [f"**`{policy}` − `{PRIMARY_AT}`**", "", f"| condition | runs | {head} |"]
        L.append("|---|---|" + "---|" * len(RULE_ENDPOINTS))
        for c, eps in by_cond.items():
            n = len(next(iter(eps.values()))["seeds"])
            cells = " | ".join(_ci((eps.get(e) or {}).get("seed_t")) for e in RULE_ENDPOINTS)
            L.append(f"| {'all runs' if c == 'all' else LABEL.get(c, c)} | {n} | {cells} |")
        L.append("")
    return L


GRID_ARGS = ("epochs", "size", "features", "batch_size", "lr")  # the tables' header, read from the runs


def report_archive(archive, conditions: str, seeds: str, n_boot: int) -> tuple[dict, str]:
    """``(summary, markdown)`` of the archived runs (``archive.load``) among ``conditions`` x ``seeds``;
    the header's grid settings are the runs' own (``config.yaml``), and runs that disagree are refused."""
    from benchmarks.evidence.archive import load

    runs = load(archive)
    named = {(c, int(x)) for c in conditions.split(",") for x in seeds.split(",")}
    grid: dict = {}  # setting -> (value, the first run that had it)
    for result, config in runs:
        name = f"{result.get('condition')}_s{result.get('seed')}"
        if (result.get("condition"), int(result.get("seed", -1))) not in named:
            continue
        ev = config.get("evidence")
        args = ev.get("args") if isinstance(ev, dict) else None
        args = args if isinstance(args, dict) else {}
        for k in GRID_ARGS:
            if k not in args:
                continue
            value, first = grid.setdefault(k, (args[k], name))
            if value != args[k]:
                raise SystemExit(
                    f"report_v4: {archive}: run {name} has {k}={args[k]!r}, run {first} {k}={value!r}; "
                    "one table needs one grid"
                )
    ns = argparse.Namespace(
        conditions=conditions, seeds=seeds, n_boot=n_boot, **{k: grid.get(k, ("?",))[0] for k in GRID_ARGS}
    )
    s = summarise_v4([r for r, _ in runs], ns)
    return s, write_tables_v4(s, ns)


def main(argv=None) -> None:
    """The CLI; a bad argument or archive is one line on stderr and exit 2."""
    from benchmarks.evidence.conditions import V4_CONDITIONS

    report_cli(
        "v4",
        argv,
        V4_CONDITIONS,
        "0,1,2,3,4",
        lambda a: report_archive(a.archive, a.conditions, a.seeds, a.n_boot),
    )


def report_cli(
    protocol: str,
    argv: list[str] | None,
    conditions: Iterable[str],
    seeds: str,
    report: Callable[[argparse.Namespace], tuple[dict, str]],
) -> None:
    """``report_<protocol> ARCHIVE [--out F] [--conditions ...] [--seeds ...] [--n-boot N]``, the command line
    of each protocol's report (v4, v5): the arguments checked before any work, ``report(args)`` -> (summary,
    markdown), the tables printed or written to ``--out`` (atomic). A bad argument, an archived run without
    what the report reads, or a file it cannot write is one line on stderr and exit 2."""
    from benchmarks.evidence.archive import one_line_exit_2

    tool = f"report_{protocol}"
    one_line_exit_2(tool, lambda: _report_cli(tool, protocol, argv, list(conditions), seeds, report))


def _report_cli(tool, protocol, argv, conditions, seeds, report) -> None:
    from robusttrain.io import atomic_write_text

    ap = argparse.ArgumentParser(
        description=f"Evidence {protocol} tables of an archive (docs/evidence_{protocol}/runs)"
    )
    ap.add_argument("archive", type=Path)
    ap.add_argument("--out", type=Path, help="write the tables here (atomic) instead of printing them")
    ap.add_argument("--conditions", default=",".join(conditions))
    ap.add_argument("--seeds", default=seeds, help="the pre-registered seeds")
    ap.add_argument("--n-boot", type=int, default=2000, help="case-bootstrap resamples (the protocol: 2000)")
    a = ap.parse_args(argv)
    if not a.archive.is_dir():
        raise SystemExit(
            f"{tool}: {a.archive}: not a folder (expected an archive such as docs/evidence_{protocol}/runs)"
        )
    try:
        [int(x) for x in a.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"{tool}: --seeds {a.seeds!r}: expected integers separated by commas") from None
    unknown = [c for c in a.conditions.split(",") if c not in conditions]
    if unknown:
        raise SystemExit(f"{tool}: --conditions: unknown {unknown}; expected some of {conditions}")
    if a.n_boot < 1:
        raise SystemExit(f"{tool}: --n-boot {a.n_boot}: expected a positive number of resamples")
    if a.out is not None and a.out.is_dir():  # checked before the tables are computed, not at the write
        raise SystemExit(
            f"{tool}: --out {a.out}: is a folder; give the file to write, e.g. {a.out / f'evidence_{protocol}.md'}"
        )
    try:
        s, md = report(a)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # an archived result without what we read
        raise SystemExit(
            f"{tool}: {a.archive}: a run lacks what the report reads ({type(e).__name__}: {e}); "
            f"expected results written by benchmarks.evidence.run --protocol {protocol}"
        ) from None
    if not s["finished"]:
        raise SystemExit(f"{tool}: {a.archive}: no archived run among {a.conditions} x seeds {a.seeds}")
    if a.out:
        try:
            atomic_write_text(a.out, md)
        except OSError as e:
            raise SystemExit(f"{tool}: --out {a.out}: cannot write ({e.strerror or e})") from None
        print(f"{tool}: {s['finished']} of {s['planned']} runs -> {a.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
