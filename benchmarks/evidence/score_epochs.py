"""Clean CVC-ClinicDB Dice of an evidence run's kept epoch weights, while or after it trains.

The run's own curve (``run.py --curve-every``) is scored only after its last epoch; this scores the
``epochs/epoch=NNN.pt`` files it keeps as they appear, with the same per-case Dice (mean over the 609
frames at the run's 128 px). Used for issue 43's learning curve (docs/results.md section 10).

    OMP_NUM_THREADS=1 python -m benchmarks.evidence.score_epochs RUN_DIR CONDITION EPOCHS [--data-root D]

``CONDITION`` is a v5 condition (it names the model), ``EPOCHS`` comma-separated 0-based epochs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.evidence.artifacts import load_weights
from benchmarks.evidence.conditions import v5_model
from benchmarks.evidence.run.recorder import per_case_dice
from benchmarks.paths import DATA_ROOT
from robusttrain.datamodules.polyp import PolypDataModule
from robusttrain.models import SegmentationModule


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("condition")
    ap.add_argument("epochs")
    ap.add_argument("--data-root", type=Path, default=Path(DATA_ROOT))
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args(argv)
    root = args.data_root / "polyp_256"
    dm = PolypDataModule(root=str(root / "kvasir_seg"), image_size=args.size, batch_size=8)
    clinicdb = dm._view(dm._read(str(root / "cvc_clinicdb")), None, False)
    kw = {**v5_model(args.condition), "pretrained": False}  # the epoch's weights replace every tensor
    model = SegmentationModule(in_channels=3, num_classes=2, class_names=["polyp"], **kw).eval()
    for e in (int(x) for x in args.epochs.split(",")):
        model.load_state_dict(load_weights(args.run_dir / "epochs" / f"epoch={e:03d}.pt"))
        rows = per_case_dice(model, clinicdb, ["polyp"])
        dice = float(np.mean([r["dice_polyp"] for r in rows]))
        print(
            json.dumps(
                {"condition": args.condition, "epoch": e, "clinicdb_dice": round(dice, 4), "cases": len(rows)}
            )
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
