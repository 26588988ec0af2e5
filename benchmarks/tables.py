"""Render perf results JSON (``--json`` of the perf scripts, :mod:`benchmarks.common`) as the markdown
tables ``docs/results.md`` publishes: one section per file, its run header on top.

    python -m benchmarks.tables docs/perf/training_step.json docs/perf/mr_overhead.json

A file that is not such a JSON is refused in one line naming it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import render

KEYS = ("script", "header", "tables")


def load(path: Path) -> dict:
    """A results JSON, checked for the keys :func:`benchmarks.common.render` reads."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(
            f"benchmarks.tables: {path}: not a readable JSON file ({type(e).__name__}: {e})"
        ) from None
    missing = [k for k in KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise SystemExit(
            f"benchmarks.tables: {path}: no {missing[0]!r} key; expected the --json of a perf script"
        )
    return payload


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        md = "\n".join(render(load(p)) for p in args.files)
    except SystemExit as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    print(md, end="")
    return md


if __name__ == "__main__":
    main()
