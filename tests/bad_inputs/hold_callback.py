"""A callback for the concurrency tests (``test_concurrent_runs.py``), given to a real ``fit`` on the
command line (``+callbacks.hold._target_=hold_callback.HoldAtEpoch ...``, this folder on PYTHONPATH).

It keeps a run in progress -- lock held, epoch 0's files written -- for as long as the test needs,
instead of a run that is merely long enough on a quiet machine: at the start of training epoch
``epoch`` it writes ``paused`` (its pid) and waits until the file ``release`` exists. It has no state
(nothing of it goes into checkpoints) and changes nothing the run computes, so the run's files equal
those of the same command with ``release`` present from the start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lightning.pytorch import Callback


class HoldAtEpoch(Callback):
    def __init__(self, epoch: int, paused: str, release: str, timeout_s: float = 600.0):
        self.epoch, self.paused, self.release, self.timeout_s = (
            int(epoch),
            Path(paused),
            Path(release),
            timeout_s,
        )

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != self.epoch or self.release.exists():
            return
        self.paused.write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not self.release.exists():
            if time.monotonic() > deadline:  # the test died without releasing: do not hang forever
                raise RuntimeError(f"HoldAtEpoch: {self.release} did not appear in {self.timeout_s} s")
            time.sleep(0.05)
