"""FailureMiningCallback: store the MetamorphicCallback's failures and replay them in training.

Add it next to a :class:`~robusttrain.callbacks.MetamorphicCallback` whose train probe is on
(``train_probe_size > 0``); the trainer needs a datamodule with ``train_dataset``:

    >>> import lightning.pytorch as L
    >>> from robusttrain.callbacks import MetamorphicCallback
    >>> from robusttrain.callbacks.failure_mining import FailureMiningCallback
    >>> mr = MetamorphicCallback(perturbations=["contrast"], severities=(4,), train_probe_size=16)
    >>> trainer = L.Trainer(max_epochs=2, callbacks=[mr, FailureMiningCallback()], logger=False)

What it does (``enabled=False`` turns all of it off):

* ``setup("fit")``: owns a :class:`~robusttrain.mining.FailureBank` in ``<dirpath>/failures/``
  (default: the MetamorphicCallback's directory, else the trainer's ``log_dir`` /
  ``default_root_dir``), subscribes it with ``add_sink``, gives the MetamorphicCallback an
  un-augmented, index-aligned view of the training set for its train probe (only when none was
  passed as ``train_dataset=``; so the recorded index + params re-create the failing image), and
  makes ``datamodule.train_dataloader()`` build its loader over a
  :class:`~robusttrain.mining.ReplayDataset` (the datamodule's ``train_dataset`` attribute is
  swapped only during that call, so everything else still sees the original dataset). This is
  done before Lightning builds the train loader (``setup`` precedes ``strategy.setup`` and the fit
  loop). The replay dataset has a fixed length and reads the bank from files, so **no**
  ``reload_dataloaders_every_n_epochs`` is needed and persistent workers are fine.
* after validation (and at the epoch's end): rank 0 appends the epoch's new failures to the
  log, updates the failure-driven weights from the train-probe EFR (``failures/sampling.json``),
  writes ``failures/mining.csv``; then all ranks meet at a barrier, so the next epoch's loader
  (every worker, every rank) replays them.
* ``replay_ratio``, ``jitter``, ``clean_mix``, ``fresh_image``: see
  :class:`~robusttrain.mining.ReplayDataset`.
* logs per epoch ``mining/bank_size``, ``mining/trainable``, ``mining/new``, ``mining/replayed``
  (replay slots used this epoch) and ``mining/weight/<perturbation>``.
* checkpoint state: bank, weights and the per-epoch log; on resume the log file is rewritten to
  match the checkpoint.
"""
from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch import Callback

from robusttrain.io import atomic_write_csv, atomic_write_json
from robusttrain.mining.bank import FailureBank
from robusttrain.mining.replay import SAMPLING_NAME, CleanDataset, ReplayDataset
from robusttrain.mining.sampling import FailureDrivenWeights, rates_from_efr

from ._dist import broadcast_object, is_global_zero

log = logging.getLogger(__name__)


class FailureMiningCallback(Callback):
    """Failure bank + replay + failure-driven sampling for a MetamorphicCallback (module doc)."""

    def __init__(self, dirpath: str | None = None, replay_ratio: float = 0.2,
                 allow_val_mining: bool = False, enabled: bool = True, max_size: int = 2000,
                 n_thumbs: int = 32, jitter: float = 0.1, momentum: float = 0.5, floor: float = 0.05,
                 threshold: float = 0.25, clean_train_probe: bool = True,
                 perturbation_kwargs: dict[str, dict] | None = None,
                 clean_mix: float = 0.0, fresh_image: float = 0.0):
        self.clean_mix, self.fresh_image = float(clean_mix), float(fresh_image)
        self.dirpath, self.replay_ratio, self.enabled = dirpath, float(replay_ratio), bool(enabled)
        self.allow_val_mining, self.max_size, self.n_thumbs = allow_val_mining, max_size, n_thumbs
        self.jitter, self.threshold, self.clean_train_probe = jitter, float(threshold), clean_train_probe
        self.perturbation_kwargs = perturbation_kwargs
        self.weights = FailureDrivenWeights(momentum, floor)
        self.bank: FailureBank | None = None
        self.replay: ReplayDataset | None = None
        self.run_dir: Path | None = None
        self.rows: list[dict[str, Any]] = []
        self._mc: Any = None
        self._dm: Any = None
        self._counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._epoch_stats: dict[str, Any] = {}
        self._new_this_epoch = 0
        self._weights_epoch = -1
        self._restored: dict[str, Any] | None = None

    # ---- wiring -----------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.enabled or stage != "fit" or self.bank is not None:
            return
        from .metamorphic import MetamorphicCallback

        mcs = [c for c in trainer.callbacks if isinstance(c, MetamorphicCallback)]
        if not mcs:
            log.warning("FailureMiningCallback: no MetamorphicCallback in trainer.callbacks; "
                        "nothing to mine, replay disabled")
            return
        self._mc = mc = mcs[0]
        d = self.dirpath or mc.dirpath or getattr(trainer, "log_dir", None) or trainer.default_root_dir
        self.run_dir = Path(broadcast_object(trainer, str(d)))  # one run dir for every rank
        self.bank = FailureBank(self.run_dir, self.max_size, self.n_thumbs, self.allow_val_mining)
        mc.add_sink(self._sink)  # sinks are called on rank 0 with the gathered failures
        if mc.train_probe_size <= 0:
            log.warning("FailureMiningCallback: MetamorphicCallback(train_probe_size=0) checks no "
                        "training cases, so nothing will be replayed (set train_probe_size > 0)")
        dm = getattr(trainer, "datamodule", None)
        base = getattr(dm, "train_dataset", None)
        if base is None:
            log.warning("FailureMiningCallback: no datamodule.train_dataset; replay disabled — wrap "
                        "your training set in robusttrain.mining.ReplayDataset yourself")
            return
        if len(base):  # replay re-creates 2-D images; refuse volumes now, not mid-training
            from robusttrain.metamorphic.batch import iter_probe

            shape = tuple(next(iter_probe(base, [0], 1, mc.hooks)).images.shape)
            if len(shape) == 5:
                raise ValueError(f"FailureMiningCallback: replaying failures of 3-D volumes is not supported "
                                 f"(train images {shape} are (B,C,H,W,D)); remove it or set "
                                 f"callbacks.mining.enabled=false -- MetamorphicCallback checks volumes alone")
        if self.clean_train_probe and mc.datasets.get("train") is None:
            mc.datasets["train"] = CleanDataset(base)
        if self.replay_ratio > 0:
            sources = {"val": dm.val_dataset} if self.allow_val_mining and getattr(dm, "val_dataset", None) else None
            self.replay = ReplayDataset(base, self.run_dir, self.replay_ratio, self.jitter,
                                        self.allow_val_mining, sources, self.perturbation_kwargs,
                                        clean_mix=self.clean_mix, fresh_image=self.fresh_image)
            self._patch_loader(dm)

    def _patch_loader(self, dm: Any) -> None:
        orig = dm.train_dataloader
        replay = self.replay

        @functools.wraps(orig)  # keeps Lightning's is_overridden check pointing at the real method
        def train_dataloader():
            base = dm.train_dataset
            dm.train_dataset = replay
            try:
                loader = orig()
            finally:
                dm.train_dataset = base
            if getattr(loader, "dataset", None) is not replay:
                log.warning("FailureMiningCallback: datamodule.train_dataloader() does not read "
                            "self.train_dataset; mined failures are not replayed")
            return loader

        dm.train_dataloader = train_dataloader
        self._dm = dm

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._dm is not None and "train_dataloader" in vars(self._dm):
            del self._dm.train_dataloader  # back to the class method
            self._dm = None

    def _sink(self, record: Any, images: Any = None) -> None:
        self.bank.add(record, images)
        self._counts[record.epoch][record.perturbation] += 1

    # ---- per-epoch sync ---------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.bank is None:
            return
        if self._restored is not None and is_global_zero(trainer):
            self.bank.compact()  # files may be ahead of the checkpoint we resume from
            self._write_weights()
        self._restored = None
        trainer.strategy.barrier("failure_mining_resume")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.bank is None:
            return
        self._sync(trainer)
        if self.replay is not None:
            self.replay.refresh()
            n = self.replay.n_trainable
            self._epoch_stats = {"trainable": n, "replayed": self.replay.n_slots if n else 0,
                                 "weights": self.replay.weights() if n else {}}

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.bank is not None and not trainer.sanity_checking:
            self._sync(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.bank is None:
            return
        self._sync(trainer)
        epoch = int(trainer.current_epoch)
        st = self._epoch_stats
        row = {"epoch": epoch, "bank_size": len(self.bank), "trainable": len(self.bank.trainable()),
               "new": self._new_this_epoch, "replayed": st.get("replayed", 0),
               **{f"weight/{p}": w for p, w in sorted(st.get("weights", {}).items())}}
        self._new_this_epoch = 0
        self.rows = [r for r in self.rows if r["epoch"] != epoch] + [row]
        pl_module.log_dict({f"mining/{k}": float(v) for k, v in row.items() if k != "epoch"},
                           on_step=False, on_epoch=True, sync_dist=False, rank_zero_only=True)
        if is_global_zero(trainer):
            atomic_write_csv(self.run_dir / "failures" / "mining.csv", pd.DataFrame(self.rows))

    def _sync(self, trainer: Any) -> None:
        # all ranks call this at the same hooks; only rank 0 has records (sinks run there)
        epoch = int(trainer.current_epoch)
        if is_global_zero(trainer):
            pending = bool(self.bank._new or self.bank._seen)
            if pending:
                self._new_this_epoch += self.bank.flush(epoch)
            self._update_weights(epoch, force_write=pending)
        trainer.strategy.barrier("failure_mining_sync")

    def _update_weights(self, epoch: int, force_write: bool) -> None:
        efr = getattr(self._mc, "efr", None)
        rates = rates_from_efr(efr, "train", "dice", self.threshold, epoch) if efr is not None else {}
        if not rates and self._counts.get(epoch):  # no EFR table: relative failure counts
            c = self._counts[epoch]
            rates = {p: n / max(c.values()) for p, n in c.items()}
        if rates and self._weights_epoch != epoch:
            self.weights.update(rates)
            self._weights_epoch = epoch
            force_write = True
        if force_write:
            self._write_weights()

    def _write_weights(self) -> None:
        atomic_write_json(self.run_dir / "failures" / SAMPLING_NAME,
                          {"epoch": self._weights_epoch, "weights": self.weights.weights(),
                           "smoothed": self.weights.smoothed})

    # ---- checkpoint state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "bank": self.bank.state_dict() if self.bank is not None else None,
                "weights": self.weights.state_dict(), "weights_epoch": self._weights_epoch,
                "rows": list(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights.load_state_dict(state.get("weights", {}))
        self._weights_epoch = int(state.get("weights_epoch", -1))
        self.rows = list(state.get("rows", []))
        if self.bank is not None and state.get("bank") is not None:
            # files are rewritten in on_fit_start, on rank 0 only
            self.bank.load_state_dict(state["bank"], rewrite_files=False)
            self._restored = state
