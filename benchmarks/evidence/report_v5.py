"""Evidence v5 (issue 45) tables: ``run.py --protocol v5`` results -> the pre-registered decisions.

``docs/evidence_v5/PROTOCOL.md`` defines everything here; the endpoints are Evidence v4's
(:data:`benchmarks.evidence.report_v4.ENDPOINTS`, per run and checkpoint from ``result.json``) plus the
EFR split into in-family and held-out tests. Every comparison pairs runs by seed and gives the
seed-level 95 % t-interval (the decision's) beside the case bootstrap (ClinicDB by sequence).

Decisions (Δ in Dice points at the EMA weights unless said):

1. ``pretrained_random − scratch_random`` on ClinicDB clean Dice: the pretrained model becomes the real-data
   recipes' default if Δ ≥ +2 with the interval above 0 and the in-domain (Kvasir test) Δ ≥ −1;
2. ``pretrained_random − pretrained_plain`` on held-out-family Dice and ClinicDB: random augmentation stays in
   the pretrained recipe unless it is worse on either with the interval below 0;
3. ``pretrained_steer − pretrained_random``: mining v2 is switched on if Δ held-out-family Dice ≥ +1 with
   the interval above 0 and ClinicDB Δ ≥ −1 (its in-family EFR reported either way);
4. ``ema − least_loss`` within runs, pooled over every run: the EMA becomes the default checkpoint if the
   interval is above 0 on ClinicDB and not below 0 on held-out-family Dice.

Secondary (pre-registered, not decisions): the balanced checkpoint and the SWAD-style average against
the EMA (clean endpoints); the check's validity (:mod:`benchmarks.evidence.validity`).

    python -m benchmarks.evidence.report_v5 docs/evidence_v5/runs --out docs/evidence_v5/results.md
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.evidence import report_v4 as v4
from benchmarks.evidence.conditions import mean_std
from benchmarks.evidence.report_v4 import Endpoint, _ci, _mr_keys, _ms, _runs, compare

AT = "ema"  # the decisions' checkpoint
ALSO_AT = ("least_loss",)
LABEL = {
    "scratch_random": "A scratch BasicUNet + random aug",
    "pretrained_random": "B pretrained Lite0 U-Net + random aug",
    "pretrained_plain": "C pretrained, no augmentation",
    "pretrained_steer": "D pretrained + random aug + mining v2",
}
# (name, A, B): the pre-registered paired comparisons, A − B
COMPARISONS = (
    ("pretrained_vs_scratch", "pretrained_random", "scratch_random"),
    ("augmentation_on_pretrained", "pretrained_random", "pretrained_plain"),
    ("mining_v2", "pretrained_steer", "pretrained_random"),
)


def _efr_over(families: str):
    """EFR Dice@0.25 over the tests of the run's ``families`` (a result.json key) only."""

    def values(r: dict, p: str, keys: list) -> np.ndarray:
        mr = r["mr_by_policy"][p]
        fams = set(r[families])
        out = []
        for s, c in keys:
            by = mr[s][c]["errors_dice@0.25_by_perturbation"]
            errors = sum(n for f, n in by.items() if f in fams)
            tests = mr[s][c]["tests"] * len([f for f in by if f in fams]) / max(len(by), 1)
            out.append(errors / tests if tests else 0.0)
        return np.array(out)

    return values


ENDPOINTS = (
    *(e for e in v4.ENDPOINTS if not e.exploratory),
    Endpoint(
        "infamily_efr",
        "in-family EFR Dice@0.25 (%), Kvasir test + ClinicDB",
        _mr_keys,
        _efr_over("infamily_families"),
    ),
    Endpoint(
        "heldout_efr",
        "held-out-family EFR Dice@0.25 (%), Kvasir test + ClinicDB",
        _mr_keys,
        _efr_over("heldout_families"),
    ),
)
BY_NAME = {e.name: e for e in ENDPOINTS}
SECONDARY_RULES = ("last_inlier", "balanced_average")  # against the EMA (clean endpoints only)
CLEAN = ("clinicdb_dice", "kvasir_dice", "other_ood_dice", "worst10_clinicdb")


def _paired(results, a: str, b: str, policy: str, n_boot: int) -> dict:
    common = sorted({r["seed"] for r in _runs(results, a)} & {r["seed"] for r in _runs(results, b)})
    ra, rb = _runs(results, a, common), _runs(results, b, common)
    out = {}
    for ep in ENDPOINTS:
        if common and v4._available(ra + rb, ep, policy):
            out[ep.name] = compare(ra, rb, ep, policy, n_boot)
    return out


def _within(results, policy: str, against: str, endpoints, n_boot: int) -> dict:
    rs = sorted(results, key=lambda r: (r["condition"], r["seed"]))
    out = {}
    for name in endpoints:
        ep = BY_NAME[name]
        if rs and v4._available(rs, ep, policy) and v4._available(rs, ep, against):
            out[name] = compare(rs, rs, ep, policy, n_boot, policy_b=against)
    return out


def _t(d: dict | None) -> dict | None:
    return None if d is None else d["seed_t"]


def decide(paired: dict, ema_rule: dict, planned_runs: int) -> dict:
    """The four pre-registered decisions from the paired comparisons at the EMA and the pooled rule; none is
    ``final`` before every planned run is in (the protocol: no decision from a partial grid)."""

    def get(cmp: str, ep: str):
        return _t((paired.get(cmp) or {}).get(ep))

    def n(cmp: str) -> int:
        d = (paired.get(cmp) or {}).get("clinicdb_dice")
        return len(d["seeds"]) if d else 0

    out: dict = {}
    clin, dom = get("pretrained_vs_scratch", "clinicdb_dice"), get("pretrained_vs_scratch", "kvasir_dice")
    out["pretrained_default"] = (
        {
            "answer": bool(clin["estimate"] >= 2 and clin["lo"] > 0 and dom["estimate"] >= -1),
            "seeds": n("pretrained_vs_scratch"),
        }
        if clin and dom
        else None
    )
    held, clin = (
        get("augmentation_on_pretrained", "heldout_dice"),
        get("augmentation_on_pretrained", "clinicdb_dice"),
    )
    out["keep_augmentation"] = (
        {"answer": not (held["hi"] < 0 or clin["hi"] < 0), "seeds": n("augmentation_on_pretrained")}
        if held and clin
        else None
    )
    held, clin = get("mining_v2", "heldout_dice"), get("mining_v2", "clinicdb_dice")
    out["mining_v2_on"] = (
        {
            "answer": bool(held["estimate"] >= 1 and held["lo"] > 0 and clin["estimate"] >= -1),
            "seeds": n("mining_v2"),
        }
        if held and clin
        else None
    )
    clin, held = _t(ema_rule.get("clinicdb_dice")), _t(ema_rule.get("heldout_dice"))
    out["ema_default"] = (
        {"answer": bool(clin["lo"] > 0 and held["hi"] >= 0), "runs": len(ema_rule["clinicdb_dice"]["seeds"])}
        if clin and held
        else None
    )
    # every planned run in (decision 4's pooled count) implies every seed of each pair, so one flag suffices
    grid_done = (
        bool(ema_rule.get("clinicdb_dice")) and len(ema_rule["clinicdb_dice"]["seeds"]) >= planned_runs
    )
    for d in out.values():
        if d is not None:
            d["final"] = grid_done
    return out


def _answer(d: dict | None, planned_seeds: int, planned_runs: int) -> str:
    """A decision's cell: yes / no only when final; before that "not reached", with how much finished and
    what the rule reads on it (the protocol: no decision from a partial grid).

    >>> _answer({"answer": False, "runs": 2, "final": False}, 8, 32)
    'not reached (partial: 2 of 32 runs; on these the rule reads no)'
    >>> _answer({"answer": False, "seeds": 1, "final": False}, 8, 32)
    'not reached (partial: 1 of 8 seeds; no interval from one)'
    >>> _answer({"answer": True, "seeds": 8, "final": True}, 8, 32)
    'yes'
    >>> _answer(None, 8, 32)
    'not reached (no paired runs yet)'
    """
    if d is None:
        return "not reached (no paired runs yet)"
    reads = "yes" if d["answer"] else "no"
    if d["final"]:
        return reads
    n = d.get("seeds", d.get("runs", 0))
    done = f"{n} of {planned_seeds} seeds" if "seeds" in d else f"{n} of {planned_runs} runs"
    if n < 2:  # the rule needs the seed interval, and one seed has none
        return f"not reached (partial: {done}; no interval from one)"
    return f"not reached (partial: {done}; on these the rule reads {reads})"


def summarise_v5(results: list[dict], args) -> dict:
    """The v5 summary of the finished runs among ``args.conditions`` x ``args.seeds``."""
    from benchmarks.evidence.validity import validity

    conds = args.conditions.split(",")
    results, s = v4.summary_head(results, args, (*v4.RUN_KEYS, "params"))
    if not results:
        return s
    s["families"] = {
        k: results[0].get(k) for k in ("heldout_families", "infamily_families", "test_families_skipped")
    }
    s["endpoints"] = {}
    for policy in (AT, *ALSO_AT):
        rows: dict = {}
        for ep in ENDPOINTS:
            for c in conds:
                rs = _runs(results, c)
                if rs and v4._available(rs, ep, policy):
                    m, _ = v4._matrix(rs, ep, policy)
                    rows.setdefault(ep.name, {})[c] = {
                        "seeds": [r["seed"] for r in rs],
                        **mean_std([100 * ep.per_seed(x) for x in m]),
                    }
        s["endpoints"][policy] = rows
    s["paired"] = {
        policy: {name: _paired(results, a, b, policy, args.n_boot) for name, a, b in COMPARISONS}
        for policy in (AT, *ALSO_AT)
    }
    s["ema_vs_least_loss"] = _within(results, "ema", "least_loss", [e.name for e in ENDPOINTS], args.n_boot)
    s["secondary_vs_ema"] = {p: _within(results, p, "ema", CLEAN, args.n_boot) for p in SECONDARY_RULES}
    s["planned_seeds"] = len(args.seeds.split(","))
    s["decision"] = decide(s["paired"][AT], s["ema_vs_least_loss"], s["planned"])
    s["validity"] = validity(results, n_boot=args.n_boot)
    return s


DECISION_TEXT = {
    "pretrained_default": (
        "1. the pretrained model becomes the real-data recipes' default",
        "pretrained_vs_scratch",
        ("clinicdb_dice", "kvasir_dice"),
    ),
    "keep_augmentation": (
        "2. random augmentation stays in the pretrained recipe",
        "augmentation_on_pretrained",
        ("heldout_dice", "clinicdb_dice"),
    ),
    "mining_v2_on": (
        "3. mining v2 is switched on in the recipes",
        "mining_v2",
        ("heldout_dice", "clinicdb_dice", "infamily_efr"),
    ),
    "ema_default": (
        "4. the EMA becomes the recipes' default checkpoint",
        None,
        ("clinicdb_dice", "heldout_dice"),
    ),
}


def write_tables_v5(s: dict, args) -> str:
    from benchmarks.evidence.validity import validity_lines

    L, tag = v4.table_head(
        "# Evidence v5 — the model users ship",
        f"Runs finished: {json.dumps(s['conditions_run'])}. Protocol: docs/evidence_v5/PROTOCOL.md. Numbers in % "
        "(Dice, EFR); Δ in points with [seed-level 95 % t-interval] (the decisions') and [95 % case bootstrap; "
        "ClinicDB by sequence].",
        s,
    )
    if not s["finished"]:
        return "\n".join(L + ["(no finished runs yet)"])
    L += [
        f"Held-out families: {s['families'].get('heldout_families')}; in-family: {s['families'].get('infamily_families')}.",
        "",
    ]
    L += [f"## Decisions{tag}", "", "| decision | comparison | Δ [seed t] | answer |", "|---|---|---|---|"]
    for key, (text, cmp, eps) in DECISION_TEXT.items():
        d = s["decision"].get(key)
        src = s["paired"][AT].get(cmp, {}) if cmp else s["ema_vs_least_loss"]
        cells = "; ".join(f"{BY_NAME[e].label.split(',')[0]} {_ci(_t(src.get(e)))}" for e in eps)
        answer = _answer(d, s["planned_seeds"], s["planned"])
        L.append(f"| {text} | {cmp or 'ema − least_loss, every run'} | {cells} | {answer} |")
    for policy in (AT, *ALSO_AT):
        kind = "the decisions' checkpoint" if policy == AT else "pre-registered, beside the EMA"
        L += ["", f"## At `{policy}` ({kind}){tag}", ""]
        for ep in ENDPOINTS:
            rows = s["endpoints"][policy].get(ep.name) or {}
            if not rows:
                continue
            L += [f"**{ep.label}**", "", "| condition | seeds | mean ± std |", "|---|---|---|"]
            L += [f"| {LABEL.get(c, c)} | {row['seeds']} | {_ms(row)} |" for c, row in rows.items()]
            L.append("")
        L += [
            "**Paired comparisons** (A − B)",
            "",
            "| comparison | endpoint | seeds | Δ [seed t] | Δ [case bootstrap] |",
            "|---|---|---|---|---|",
        ]
        for name, pr in s["paired"][policy].items():
            for e, d in pr.items():
                L.append(
                    f"| {name} | {BY_NAME[e].label} | {d['seeds']} | {_ci(d['seed_t'])} | {_ci(d['case_bootstrap'])} |"
                )
    L += ["", f"## Checkpoint rules within the same runs{tag}", ""]
    L += ["| rule | endpoint | runs | Δ [t over runs] |", "|---|---|---|---|"]
    for e, d in s["ema_vs_least_loss"].items():
        L.append(
            f"| ema − least_loss (decision 4) | {BY_NAME[e].label} | {len(d['seeds'])} | {_ci(d['seed_t'])} |"
        )
    for p, by in s["secondary_vs_ema"].items():
        for e, d in by.items():
            L.append(
                f"| {p} − ema (secondary) | {BY_NAME[e].label} | {len(d['seeds'])} | {_ci(d['seed_t'])} |"
            )
    L += ["", f"## The check's validity (secondary){tag}", ""] + validity_lines(s["validity"])
    L += ["", "## Runs", "", "```", json.dumps(s["runs"], indent=1), "```", ""]
    return "\n".join(L)


def main(argv=None) -> None:
    """``report_v5 ARCHIVE [--out F]``: the tables of an archive; a bad argument is one line, exit 2."""
    from benchmarks.evidence.archive import load
    from benchmarks.evidence.conditions import V5_CONDITIONS

    def report(a: argparse.Namespace) -> tuple[dict, str]:
        s = summarise_v5([r for r, _ in load(a.archive)], a)
        return s, write_tables_v5(s, a)

    v4.report_cli("v5", argv, V5_CONDITIONS, "0,1,2,3,4,5,6,7", report)


if __name__ == "__main__":
    main()
