"""What the evidence runner records after every validation: clean per-case Dice and the weights."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch


@torch.no_grad()
def per_case_dice(model, dataset, class_names, batch_size: int = 16) -> list[dict]:
    """Clean per-case Dice (volume sums over a case's slices), one row per case."""
    from torch.utils.data import DataLoader

    from robusttrain.metamorphic.scoring import dice_from_sums, logits_sums

    dev = next(model.parameters()).device
    sums: dict[str, np.ndarray] = {}
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        logits = model(batch["image"].to(dev)).float().cpu()
        for cid, s in zip(batch["case_id"], logits_sums(logits, batch["mask"])):
            sums[cid] = sums.get(cid, 0) + s
    return [
        {"case_id": cid, **{f"dice_{c}": float(v) for c, v in zip(class_names, dice_from_sums(s))}}
        for cid, s in sums.items()
    ]


def make_recorder(class_names: list[str], weights_dir: Path | None = None):
    from lightning.pytorch import Callback

    class EpochRecorder(Callback):
        """After every fitting validation: validation loss, clean per-case validation Dice and a CPU
        copy of the weights (so any epoch picked at the end can be evaluated on held-out data).

        With ``weights_dir`` the weights go to ``epoch=NNN.pt`` files (atomic) instead of memory, and
        rows / losses / training seconds travel in the Lightning checkpoint: a killed run resumes."""

        def __init__(self) -> None:
            self.rows: list[dict] = []
            self.val_loss: dict[int, float] = {}
            self.weights: dict[int, dict] = {}
            self.train_seconds = 0.0
            self._t = None

        def on_train_epoch_start(self, trainer, pl_module):
            self._t = time.time()

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking or trainer.state.fn != "fit":
                return
            epoch = int(trainer.current_epoch)
            self.val_loss[epoch] = float(trainer.callback_metrics["val/loss"])
            was = pl_module.training
            pl_module.eval()
            try:
                self.rows = [r for r in self.rows if r["epoch"] != epoch]
                self.rows += [
                    {"split": "val", "epoch": epoch, **r}
                    for r in per_case_dice(pl_module, trainer.datamodule.val_dataset, class_names)
                ]
            finally:
                pl_module.train(was)
            state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            if weights_dir is None:
                self.weights[epoch] = state
            else:
                from benchmarks.evidence.artifacts import save_weights

                save_weights(weights_dir / f"epoch={epoch:03d}.pt", state, epoch=epoch)
            if self._t is not None:
                self.train_seconds += time.time() - self._t
                self._t = None
            val_dice = float(
                np.mean(
                    [np.mean([r[f"dice_{c}"] for c in class_names]) for r in self.rows if r["epoch"] == epoch]
                )
            )
            print(
                f"[evidence] epoch {epoch} val_loss={self.val_loss[epoch]:.4f} val_dice={val_dice:.4f} "
                f"train_s={self.train_seconds:.0f}",
                flush=True,
            )

        def epoch_weights(self, epoch: int) -> dict:
            if weights_dir is None:
                return self.weights[epoch]
            from benchmarks.evidence.artifacts import load_weights

            return load_weights(weights_dir / f"epoch={epoch:03d}.pt")

        def state_dict(self):
            return {
                "rows": self.rows,
                "val_loss": {str(k): v for k, v in self.val_loss.items()},
                "train_seconds": self.train_seconds,
            }

        def load_state_dict(self, state):
            self.rows = list(state["rows"])
            self.val_loss = {int(k): float(v) for k, v in state["val_loss"].items()}
            self.train_seconds = float(state.get("train_seconds", 0.0))

    return EpochRecorder()
