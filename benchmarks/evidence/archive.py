"""Keep finished Evidence v3 runs across machines: their ``result.json`` in the repository, gzipped.

The grid takes more CPU hours than one session has, and the machine (with ``../evidence_runs``)
is not kept between sessions. A finished run's ``result.json`` holds every per-case number the tables
need (picks, MR scores, clusters), so archiving it lets the next session resume the grid with
``--resume`` without re-training it. Checkpoints are not archived (about 2 MB each, nine per run):
re-create one by running its (condition, seed) again (``--conditions C --seeds S``).

    python -m benchmarks.evidence.archive save ../evidence_runs/polyp256 docs/evidence_v3/runs
    python -m benchmarks.evidence.archive restore docs/evidence_v3/runs ../evidence_runs/polyp256

``save`` writes ``<condition>_s<seed>.json.gz`` (gzip without a timestamp: the same result gives the
same bytes) and, beside it, the run's own monitoring tables that explain its numbers (:data:`TABLES`:
the validation MR check per epoch, the per-case validation history, metamorphic training's per-family
counts) as ``<condition>_s<seed>.<table>.gz``; ``restore`` writes them back into
``<condition>_s<seed>/`` where that run has none and refuses (exit 2, one line) where one exists with
other content.

Evidence v4 (``docs/evidence_v4/runs``) also keeps each run's ``followups.csv.gz`` (every follow-up's
Dice; already gzip, copied as is) and, for the runs of ``--weights-seeds`` (the protocol: seed 0), the
fp16 weights with their config (``<condition>_s<seed>/{least_loss,last}.ckpt, config.yaml``), which
``rescore.py`` re-scores on any folder through the product's CLI:

    python -m benchmarks.evidence.archive save OUT/polyp256_v4 docs/evidence_v4/runs --weights-seeds 0

Evidence v5 keeps ``ema`` and ``least_loss`` of seeds 0 and 1; a weight file over 1 MiB (its pretrained
runs') stays with the grid's output and the archive names it by size and sha256
(``<run>/weights_not_in_repository.json``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_bytes, atomic_write_text

NAME = re.compile(r"^([a-z_]+)_s(\d+)$")
TABLES = ("efr.csv", "history.csv", "metamorphic_training.csv", "followups.csv.gz", "config.yaml")
WEIGHTS = ("least_loss.ckpt", "last.ckpt", "config.yaml")  # v4: <run>/fp16/ -> <archive>/<run>/
WEIGHTS_V5 = ("least_loss.ckpt", "ema.ckpt", "config.yaml")  # v5: the decisions' two checkpoints
# the repository keeps no file over 1 MiB: a larger weight file (the pretrained v5 runs' fp16, 7.8 MB) stays
# with the grid's output and the archive names it by size and sha256 (weights_not_in_repository.json)
MAX_FILE_BYTES = 1 << 20


def _weights(result: dict) -> tuple[str, ...]:
    """The fp16 files a run keeps (by its protocol)."""
    return WEIGHTS_V5 if result.get("protocol") == "v5" else WEIGHTS


def _packed(name: str, raw: bytes) -> bytes:
    """A table as archived: gzip without a timestamp (a table that is gzip already, as is)."""
    return raw if name.endswith(".gz") else gzip.compress(raw, compresslevel=9, mtime=0)


def _archived(table: str) -> str:
    return table if table.endswith(".gz") else f"{table}.gz"


def _check(result: dict, name: str, where: Path) -> None:
    if f"{result.get('condition')}_s{result.get('seed')}" != name:
        raise SystemExit(
            f"evidence_archive: {where}: holds {result.get('condition')}_s{result.get('seed')}, expected {name}"
        )


def _gunzip(p: Path, what: str) -> bytes:
    """The bytes of the gzip file ``p``; a truncated or damaged one (a cut copy, a full disk) is one line,
    not gzip's EOFError."""
    try:
        return gzip.decompress(p.read_bytes())
    except (OSError, EOFError, zlib.error) as e:
        raise SystemExit(
            f"evidence_archive: {p}: not a gzip {what} ({type(e).__name__}: {e}); the file is truncated "
            "or damaged: copy it again from where the run was archived"
        ) from None


def _json(raw: bytes | str, where: Path) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise SystemExit(f"evidence_archive: {where}: not a JSON result ({e})") from None


def portable_result(result: dict, runs: Path) -> dict:
    """``result`` with no machine path: an absolute ``run_dir`` (a grid from a checkout older than the
    records' relative paths) becomes ``<runs folder>/<run>``, as :mod:`benchmarks.evidence.run.write`
    now writes it. Nothing else changes.

    >>> portable_result({"run_dir": "/data/runs/polyp256_v5/a_s0", "seed": 0}, Path("/data/runs/polyp256_v5"))
    {'run_dir': 'polyp256_v5/a_s0', 'seed': 0}
    >>> portable_result({"run_dir": "polyp256_v5/a_s0"}, Path("/elsewhere/polyp256_v5"))
    {'run_dir': 'polyp256_v5/a_s0'}
    """
    kept = dict(result)
    run_dir = kept.get("run_dir")
    if isinstance(run_dir, str) and Path(run_dir).is_absolute():
        kept["run_dir"] = f"{runs.name}/{Path(run_dir).name}"
    return kept


def portable_config(raw: bytes, run_dir: Path) -> bytes:
    """A run's ``config.yaml`` with no machine path: its ``evidence.args`` through
    :func:`~benchmarks.evidence.artifacts.portable_args` (``out`` relative to the run folder, ``data_root``
    ``$DATA_ROOT``), written as the run code writes it; a config that already has none is kept byte for
    byte. Parsed with ``yaml.safe_load`` (data, never objects)."""
    import yaml

    from benchmarks.evidence.artifacts import portable_args

    cfg = yaml.safe_load(raw.decode("utf-8"))
    record = cfg.get("evidence") if isinstance(cfg, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("args"), dict):
        return raw
    args = portable_args(record["args"], run_dir)
    if args == record["args"]:
        return raw
    return yaml.safe_dump({**cfg, "evidence": {**record, "args": args}}, sort_keys=False).encode("utf-8")


def _kept(name: str, raw: bytes, run_dir: Path) -> bytes:
    """A run file as the archive keeps it (configs without machine paths)."""
    return portable_config(raw, run_dir) if name == "config.yaml" else raw


def _result_bytes(result: dict, raw: bytes, runs: Path) -> bytes:
    kept = portable_result(result, runs)
    return raw if kept == result else json.dumps(kept).encode("utf-8")


def _save_weights(run: Path, dst: Path, result: dict, where: str) -> None:
    """The run's fp16 weights (and their config) into ``dst``; a file over :data:`MAX_FILE_BYTES` stays
    where the grid wrote it (``where``) and ``weights_not_in_repository.json`` names it by size and sha256."""
    dst.mkdir(parents=True, exist_ok=True)
    left_out: dict[str, dict] = {}
    for w in _weights(result):
        if not (run / "fp16" / w).is_file():
            raise SystemExit(
                f"evidence_archive: {run / 'fp16' / w}: missing (a {result.get('protocol', 'v4')} run keeps it)"
            )
        raw = _kept(w, (run / "fp16" / w).read_bytes(), run)
        if len(raw) > MAX_FILE_BYTES:
            left_out[w] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        else:
            atomic_write_bytes(dst / w, raw)
    if left_out:
        text = json.dumps({"kept_with_the_grid_output": where, **left_out}, indent=1)
        atomic_write_text(dst / "weights_not_in_repository.json", text + "\n")


def save(out: Path, archive: Path, weights_seeds: tuple[int, ...] = ()) -> list[str]:
    """Archive every finished run of ``out`` (a grid's runs folder) into ``archive``; machine paths in the
    result and configs are made relative on the way (:func:`portable_result`, :func:`portable_config`)."""
    names = []
    for p in sorted(out.glob("*_s*/result.json")):
        name = p.parent.name
        named = NAME.match(name)
        if not named:
            continue
        raw = p.read_bytes()
        result = _json(raw, p)
        _check(result, name, p)
        raw = _result_bytes(result, raw, out)
        atomic_write_bytes(archive / f"{name}.json.gz", gzip.compress(raw, compresslevel=9, mtime=0))
        for t in TABLES:
            if (p.parent / t).is_file():
                atomic_write_bytes(
                    archive / f"{name}.{_archived(t)}",
                    _packed(t, _kept(t, (p.parent / t).read_bytes(), p.parent)),
                )
        if int(named.group(2)) in weights_seeds:
            _save_weights(p.parent, archive / name, result, f"{out.name}/{name}/fp16")
        names.append(name)
    return names


def _restore_weights(src: Path, dst: Path) -> None:
    """The archived fp16 weights back where the run kept them (so a later ``save`` finds them)."""
    for w in sorted({*WEIGHTS, *WEIGHTS_V5}):
        if (src / w).is_file() and not (dst / w).exists():
            dst.mkdir(exist_ok=True)
            atomic_write_bytes(dst / w, (src / w).read_bytes())


def restore(archive: Path, out: Path) -> list[str]:
    names = []
    for p in sorted(archive.glob("*.json.gz")):
        name = p.name[: -len(".json.gz")]
        if not NAME.match(name):
            continue
        text = _gunzip(p, "JSON result").decode("utf-8", errors="replace")
        _check(_json(text, p), name, p)
        dst = out / name / "result.json"
        if dst.is_file():
            if portable_result(_json(dst.read_bytes(), dst), out) != _json(text, p):
                raise SystemExit(f"evidence_archive: {dst} exists with other numbers than {p}; not replaced")
            _restore_weights(archive / name, dst.parent / "fp16")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        for t in TABLES:
            src = archive / f"{name}.{_archived(t)}"
            if src.is_file() and not (dst.parent / t).exists():
                atomic_write_bytes(
                    dst.parent / t, src.read_bytes() if t.endswith(".gz") else _gunzip(src, "table")
                )
        _restore_weights(archive / name, dst.parent / "fp16")
        atomic_write_text(dst, text)
        names.append(name)
    return names


def load(archive: Path) -> list[tuple[dict, dict]]:
    """Every archived run as ``(result, config)``, read in place (nothing restored): the result JSON and
    the run's ``config.yaml`` (parsed with ``yaml.safe_load``: archived text is data, never objects;
    ``{}`` where a run kept none)."""
    import yaml

    runs = []
    for p in sorted(archive.glob("*.json.gz")):
        name = p.name[: -len(".json.gz")]
        if not NAME.match(name):
            continue
        try:
            result = json.loads(_gunzip(p, "JSON result").decode("utf-8"))
        except ValueError as e:
            raise SystemExit(f"evidence_archive: {p}: not a gzip JSON result ({e})") from None
        if not isinstance(result, dict):
            raise SystemExit(f"evidence_archive: {p}: expected a JSON object, got {type(result).__name__}")
        _check(result, name, p)
        cfg_path = archive / f"{name}.config.yaml.gz"
        config: dict = {}
        if cfg_path.is_file():
            try:
                config = yaml.safe_load(_gunzip(cfg_path, "YAML config").decode("utf-8")) or {}
            except (ValueError, yaml.YAMLError) as e:
                raise SystemExit(f"evidence_archive: {cfg_path}: not a gzip YAML config ({e})") from None
        runs.append((result, config if isinstance(config, dict) else {}))
    return runs


def one_line_exit_2(tool: str, run: Callable[[], None]) -> None:
    """Run an evidence tool's command-line body: a refusal (``SystemExit`` with a message) or an OSError
    (a destination that is a file, a read-only folder, a full disk) is one line on stderr and exit 2, as
    argparse's own usage errors are."""
    try:
        run()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            raise SystemExit(2) from None
        raise
    except OSError as e:
        print(f"{tool}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv=None) -> None:
    """The CLI; a bad argument, a damaged archive or a folder it cannot write is one line and exit 2."""
    one_line_exit_2("evidence_archive", lambda: _main(argv))


def _main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument(
        "--weights-seeds",
        default="",
        help="save: also keep the fp16 weights (the runs' fp16/) of these seeds, e.g. 0 (v4) or 0,1 (v5)",
    )
    a = ap.parse_args(argv)
    try:
        seeds = tuple(int(x) for x in a.weights_seeds.split(",") if x.strip())
    except ValueError:
        raise SystemExit(
            f"evidence_archive: --weights-seeds {a.weights_seeds!r}: expected integers like 0,1"
        ) from None
    if not a.src.is_dir():
        raise SystemExit(f"evidence_archive: {a.src}: not a folder")
    a.dst.mkdir(parents=True, exist_ok=True)
    done = save(a.src, a.dst, seeds) if a.action == "save" else restore(a.src, a.dst)
    print(f"evidence_archive: {a.action}d {len(done)} run(s): {', '.join(done) or '-'}")


if __name__ == "__main__":
    main()
