"""The tables of many runs: where a protocol's runs live, the finished ones, ``results.{json,md}``."""

from __future__ import annotations

import json
from pathlib import Path


def dataset_dir(args) -> Path:
    """``<out>/<dataset>`` (v4, v5: ``<out>/<dataset>_v4`` / ``_v5``: their condition names are not v3's)."""
    protocol = getattr(args, "protocol", "v3")
    return Path(args.out) / (args.dataset + (f"_{protocol}" if protocol in ("v4", "v5") else ""))


def finished(out: Path) -> list[dict]:
    """Every finished run (``result.json``) under ``out``, in (seed, condition) order."""
    rs = [json.loads(p.read_text()) for p in sorted(out.glob("*_s*/result.json"))]
    return sorted(rs, key=lambda r: (r["seed"], r["condition"]))


def write_summary(results: list[dict], args, out: Path, wall: float) -> dict:
    """``results.json`` (summary + per-run numbers) and ``results.md`` (tables), both atomic."""
    from robusttrain.io import atomic_write_text

    if getattr(args, "protocol", "v3") == "v5":
        from benchmarks.evidence.report_v5 import summarise_v5, write_tables_v5

        summary = summarise_v5(results, args)
        md = write_tables_v5(summary, args)
    elif getattr(args, "protocol", "v3") == "v4":
        from benchmarks.evidence.report_v4 import summarise_v4, write_tables_v4

        summary = summarise_v4(results, args)
        md = write_tables_v4(summary, args)
    elif args.dataset in ("polyp256", "pranet256", "synthetic"):
        from benchmarks.evidence.report_v3 import summarise_v3, write_tables_v3

        summary = summarise_v3(results, args, out)
        md = write_tables_v3(summary, args)
    else:
        from benchmarks.evidence.report_v2 import summarise, write_tables

        summary = summarise(results, args)
        md = write_tables(summary, args)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.evidence.artifacts import portable_args

    kept = portable_args(vars(args), out)  # the folders relative to the tables' own: no machine path
    payload = {"args": kept, "wall_seconds": round(wall, 1), "summary": summary, "results": results}
    atomic_write_text(out / "results.json", json.dumps(payload, indent=1, default=float))
    atomic_write_text(
        out / "summary.json", json.dumps({"args": kept, "summary": summary}, indent=1, default=float)
    )
    atomic_write_text(out / "results.md", md)
    print(md, flush=True)
    return payload
