"""What the tiny evidence grids' tests (tests/test_evidence_v4.py, tests/test_evidence_v5.py) share: a kept
checkpoint re-scored by the product's CLI on the grid's held-out frames, as a user would re-score it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.evidence import run as evidence

REPO = Path(__file__).resolve().parents[1]


def write_folder(ds, root: Path) -> None:
    """A dataset view written as an image folder (images/*.png, masks/*.png 0/255)."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    src = ds.source
    for i in range(len(src)):
        img, mask = src.load(i)
        Image.fromarray(img).save(root / "images" / f"{src.case_id(i)}.png")
        Image.fromarray((mask > 0).astype(np.uint8) * 255).save(root / "masks" / f"{src.case_id(i)}.png")


def rescore_on_etis(ckpt: Path, tmp_path: Path, out: str) -> tuple[str, float]:
    """``ckpt`` re-scored by ``python -m benchmarks.evidence.rescore`` on the tiny grid's held-out "etis"
    frames (the synthetic split at 32 px, data seed 0, written to ``tmp_path/etis``), its report in
    ``tmp_path/out``: the command's stdout and the clean Dice it printed. A failed re-score fails the test."""
    ns = argparse.Namespace(
        size=32, batch_size=4, data_seed=0, test_fraction=0.25, val_fraction=0.25, dataset="synthetic"
    )
    _, held, _ = evidence.build_data(ns)
    write_folder(held["etis"], tmp_path / "etis")
    argv = [sys.executable, "-m", "benchmarks.evidence.rescore", str(ckpt), str(tmp_path / "etis")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*argv, str(tmp_path / out)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("[robusttrain] clean"))
    return r.stdout, float(line.split("Dice=")[1].split()[0])
