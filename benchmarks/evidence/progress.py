"""Per-epoch validation loss of a running (or finished) evidence run, from its resume checkpoint.

The v3/v4 evidence runs keep their per-epoch validation loss in the EpochRecorder's state inside
``fit/last.ckpt`` until the run writes ``result.json``; this prints it beside Evidence v3's seed-2 runs
(the stalled paired runs and the healthy in-place ones) for the stall reproducer of robust training v2.

    python -m benchmarks.evidence.progress RUN_DIR [--v3 docs/evidence_v3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from benchmarks.paths import REPO

V3_STALLED = ("metamorphic", "consistency_only", "metamorphic_uniform")
V3_DIAG = ("consistency_detached", "consistency_light", "consistency_paired")
V3_HEALTHY = ("mt_random", "plain", "worst_of_k_only", "mined")


def run_val_loss(run_dir: Path) -> dict[int, float]:
    """Epoch -> validation loss of a run: ``result.json`` when finished, else ``fit/last.ckpt``."""
    done = run_dir / "result.json"
    if done.is_file():
        return {int(k): float(v) for k, v in json.loads(done.read_text())["val_loss"].items()}
    ckpt = run_dir / "fit" / "last.ckpt"
    if not ckpt.is_file():
        raise SystemExit(f"evidence_progress: neither result.json nor fit/last.ckpt in '{run_dir}'")
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    for value in state.get("callbacks", {}).values():
        if isinstance(value, dict) and "val_loss" in value:
            return {int(k): float(v) for k, v in value["val_loss"].items()}
    raise SystemExit(f"evidence_progress: '{ckpt}' holds no per-epoch validation loss")


def v3_val_loss(v3: Path, condition: str) -> dict[int, float]:
    for sub in ("runs", "diag_runs"):
        f = v3 / sub / f"{condition}_s2.json.gz"
        if f.is_file():
            with gzip.open(f) as fh:
                vl = json.load(fh)["val_loss"]
            return {int(k): float(v) for k, v in vl.items()}
    return {}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--v3", type=Path, default=REPO / "docs" / "evidence_v3")
    args = ap.parse_args(argv)
    mine = run_val_loss(args.run_dir)
    epochs = sorted(mine)
    rows = {"this run": mine}
    for cond in V3_STALLED + V3_DIAG + V3_HEALTHY:
        rows[f"v3 {cond} s2"] = v3_val_loss(args.v3, cond)
    print("| run | " + " | ".join(str(e) for e in epochs) + " |")
    print("|---|" + "---:|" * len(epochs))
    for name, vl in rows.items():
        if vl:
            print(f"| {name} | " + " | ".join(f"{vl[e]:.3f}" if e in vl else "" for e in epochs) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
