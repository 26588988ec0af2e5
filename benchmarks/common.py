"""What every perf script shares: one run header and machine-readable results beside the printed tables.

A script builds a :class:`Results` from its parsed arguments, prints :meth:`Results.header_line` first,
records each table it measures with :meth:`Results.table` (raw numbers, with the format each column is
printed in) and ends with :meth:`Results.write` to the ``--json PATH`` of :func:`add_json_argument`
(atomic; nothing is written without it). The header names what a number depends on: the commit (and
whether the tree had uncommitted edits), the device, torch's threads, the machine's load, the Python and
torch versions and the time (UTC). ``python -m benchmarks.tables FILE.json ...`` renders the JSON back
into the markdown tables ``docs/results.md`` publishes (:func:`render`).

>>> r = Results("demo", {"steps": 2}, device="cpu")
>>> sorted(r.header)
['commit', 'device', 'dirty', 'load_1_5_15', 'python', 'time_utc', 'torch', 'torch_threads']
>>> print(r.table("step", ["setting", "ms", "vs plain"], [["plain", 10.04, 1.0], ["k=4", 21.5, 2.1412]],
...               formats={"ms": "{:.0f}", "vs plain": "{:.2f}x"}))
| setting | ms | vs plain |
|---|---|---|
| plain | 10 | 1.00x |
| k=4 | 22 | 2.14x |
>>> r.payload()["tables"]["step"]["rows"][1]
['k=4', 21.5, 2.1412]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a checkout (a copied tree, the device machine): said as unknown, never guessed
    return out.stdout.strip()


def run_header(device: str = "cpu") -> dict[str, Any]:
    """The conditions a measured number depends on (the Methodology contract: name the device and load)."""
    import torch

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    try:
        load: list[float] | None = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "load_1_5_15": load,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "time_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def header_line(h: dict[str, Any]) -> str:
    """One line of the header, as the scripts print it first and the tables carry it."""
    commit = (h["commit"] or "unknown")[:10] + ("+dirty" if h["dirty"] else "")
    load = "/".join(f"{v:.1f}" for v in h["load_1_5_15"]) if h["load_1_5_15"] else "n/a"
    return (
        f"run: commit {commit}, device {h['device']}, torch threads {h['torch_threads']}, load (1/5/15 min) "
        f"{load}, python {h['python']}, torch {h['torch']}, {h['time_utc']}"
    )


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "—"
    return fmt.format(value) if fmt else str(value)


def markdown_row(columns: list[str], row: list[Any], formats: dict[str, str] | None = None) -> str:
    """One row of :func:`markdown_table`, for a script that prints each row as it is measured.

    >>> markdown_row(["family", "ms"], ["blur", 3.14159], {"ms": "{:.1f}"})
    '| blur | 3.1 |'
    """
    formats = formats or {}
    return "| " + " | ".join(_cell(v, formats.get(c)) for c, v in zip(columns, row)) + " |"


def markdown_table(columns: list[str], rows: list[list[Any]], formats: dict[str, str] | None = None) -> str:
    """A markdown table; ``formats`` maps a column to a ``str.format`` pattern (``"{:.2f}x"``)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + [markdown_row(columns, row, formats) for row in rows])


class Results:
    """One script invocation's header, arguments and tables (see the module's docstring)."""

    def __init__(
        self,
        script: str,
        args: argparse.Namespace | dict[str, Any],
        device: str = "cpu",
        argv: list[str] | None = None,
    ):
        self.script = script
        self.argv = _without_json(sys.argv[1:] if argv is None else list(argv))  # main(argv) or the shell's
        self.args = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
        self.args.pop("json", None)  # where the results go is no result (and a machine path)
        self.header = run_header(device)
        self.tables: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, Any] = {}

    def header_line(self) -> str:
        return header_line(self.header)

    def table(
        self, name: str, columns: list[str], rows: list[list[Any]], formats: dict[str, str] | None = None
    ) -> str:
        """Record a table (raw values) and return its markdown."""
        self.tables[name] = {
            "columns": list(columns),
            "rows": [list(r) for r in rows],
            "formats": formats or {},
        }
        return markdown_table(columns, rows, formats)

    def payload(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "argv": self.argv,
            "args": self.args,
            "header": self.header,
            "notes": self.notes,
            "tables": self.tables,
        }

    def write(self, path: str | Path | None) -> None:
        """The JSON, atomically (a reader never sees half a file); no path: nothing written."""
        if path is None:
            return
        from robusttrain.io import atomic_write_text

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(path), json.dumps(self.payload(), indent=1, default=str) + "\n")


def _without_json(argv: list[str]) -> list[str]:
    """The command line less ``--json PATH`` (``--json=PATH``).

    >>> _without_json(["--size", "32", "--json", "/x/a.json", "--calls=1", "--json=b.json"])
    ['--size', '32', '--calls=1']
    """
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--json="):
            skip = False
            continue
        skip = a == "--json"
        if not skip:
            out.append(a)
    return out


def add_json_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="also write the run header and the tables' raw numbers to PATH (JSON, atomic; "
        "python -m benchmarks.tables renders it)",
    )


def render(payload: dict[str, Any]) -> str:
    """The markdown of one results JSON: the script, its header line, each table under its name."""
    command = "python -m " + shlex.join([payload["script"], *(payload.get("argv") or [])])
    out = [f"`{command}`", "", header_line(payload["header"])]
    for name, t in payload["tables"].items():
        out += ["", f"**{name}**", "", markdown_table(t["columns"], t["rows"], t.get("formats"))]
    return "\n".join(out) + "\n"


def imread(path: Path, flags: int | None = None) -> Any:
    """``cv2.imread`` that stops in one line naming the file instead of returning None (a benchmark's
    input read from the shared data folder: a missing or unreadable file is the user's to fix)."""
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_COLOR if flags is None else flags)
    if img is None:
        raise SystemExit(f"{path}: cannot read this image file (missing, corrupt or not an image)")
    return img
