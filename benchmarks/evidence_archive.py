"""Keep finished Evidence v3 runs across machines: their ``result.json`` in the repository, gzipped.

The grid takes more CPU hours than one session has, and the machine (with ``/work/evidence_runs``)
is not kept between sessions. A finished run's ``result.json`` holds every per-case number the tables
need (picks, MR scores, clusters), so archiving it lets the next session resume the grid with
``--resume`` without re-training it. Checkpoints are not archived (about 2 MB each, nine per run):
re-create one by running its (condition, seed) again (``--conditions C --seeds S``).

    python benchmarks/evidence_archive.py save /work/evidence_runs/polyp256 docs/evidence_v3/runs
    python benchmarks/evidence_archive.py restore docs/evidence_v3/runs /work/evidence_runs/polyp256

``save`` writes ``<condition>_s<seed>.json.gz`` (gzip without a timestamp: the same result gives the
same bytes) and, beside it, the run's own monitoring tables that explain its numbers (:data:`TABLES`:
the validation MR check per epoch, the per-case validation history, metamorphic training's per-family
counts) as ``<condition>_s<seed>.<table>.gz``; ``restore`` writes them back into
``<condition>_s<seed>/`` where that run has none and refuses (exit 2, one line) where one exists with
other content.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from robusttrain.io import atomic_write_bytes, atomic_write_text  # noqa: E402

NAME = re.compile(r"^([a-z_]+)_s(\d+)$")
TABLES = ("efr.csv", "history.csv", "metamorphic_training.csv")


def _check(result: dict, name: str, where: Path) -> None:
    if f"{result.get('condition')}_s{result.get('seed')}" != name:
        raise SystemExit(
            f"evidence_archive: {where}: holds {result.get('condition')}_s{result.get('seed')}, expected {name}"
        )


def save(out: Path, archive: Path) -> list[str]:
    names = []
    for p in sorted(out.glob("*_s*/result.json")):
        name = p.parent.name
        if not NAME.match(name):
            continue
        raw = p.read_bytes()
        _check(json.loads(raw), name, p)
        atomic_write_bytes(archive / f"{name}.json.gz", gzip.compress(raw, compresslevel=9, mtime=0))
        for t in TABLES:
            if (p.parent / t).is_file():
                data = gzip.compress((p.parent / t).read_bytes(), compresslevel=9, mtime=0)
                atomic_write_bytes(archive / f"{name}.{t}.gz", data)
        names.append(name)
    return names


def restore(archive: Path, out: Path) -> list[str]:
    names = []
    for p in sorted(archive.glob("*.json.gz")):
        name = p.name[: -len(".json.gz")]
        if not NAME.match(name):
            continue
        text = gzip.decompress(p.read_bytes()).decode("utf-8")
        _check(json.loads(text), name, p)
        dst = out / name / "result.json"
        if dst.is_file():
            if json.loads(dst.read_text()) != json.loads(text):
                raise SystemExit(f"evidence_archive: {dst} exists with other numbers than {p}; not replaced")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        for t in TABLES:
            src = archive / f"{name}.{t}.gz"
            if src.is_file() and not (dst.parent / t).exists():
                atomic_write_bytes(dst.parent / t, gzip.decompress(src.read_bytes()))
        atomic_write_text(dst, text)
        names.append(name)
    return names


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    a = ap.parse_args(argv)
    if not a.src.is_dir():
        raise SystemExit(f"evidence_archive: {a.src}: not a folder")
    a.dst.mkdir(parents=True, exist_ok=True)
    done = save(a.src, a.dst) if a.action == "save" else restore(a.src, a.dst)
    print(f"evidence_archive: {a.action}d {len(done)} run(s): {', '.join(done) or '-'}")


if __name__ == "__main__":
    main()
