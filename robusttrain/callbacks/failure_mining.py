"""FailureMiningCallback: check training cases, store the failures, and train on them: steer the random
augmentation's draws toward what fails (``mode="steer"``, mining v2) or replay the failing images
(``mode="replay"``, the frozen replay Evidence v4 found harmful at random augmentation's dose).

``mode="steer"`` (issue 44): the training stream stays the data loader's (no image is replayed); a share
``steer`` of MetamorphicTraining's random follow-ups draws its perturbation from the bank of failure
*conditions* (family, severity, params, placement relative to the lesion:
:class:`~robusttrain.mining.conditions.ConditionBank`), applied to whatever image the stream brings
(:mod:`robusttrain.training.steering`); the rest stays uniform random augmentation, so the perturbed
share is MetamorphicTraining's ``q``. Conditions the latest check no longer fails decay out (``decay``),
new failures on cases that passed before are counted (overfitting). Needs
``MetamorphicTraining(objective="replace", k=1, ...)`` (or ``replace_q > 0``); ``wrap`` returns the
dataset itself. With an empty bank the draws are exactly MetamorphicTraining's alone.

Replay (``mode="replay"``, the default only when ``replay_ratio`` is given):

Explicit wiring, no patching of the user's objects:

* it asks the MetamorphicCallback, through the shared
  :class:`~robusttrain.callbacks.context.RobustnessContext`, to check ``train_probe_size``
  training cases every ``every_n_epochs`` epochs, and receives every violation there (a
  MetamorphicCallback is required: without one ``trainer.fit`` stops before training, saying so);
* replay: the *user* (or robusttrain's datamodules, via ``datamodule.wrap_train(mining.wrap)``)
  passes the training dataset through :meth:`FailureMiningCallback.wrap` when building the train
  loader. The returned :class:`~robusttrain.mining.ReplayDataset` has the same length and sample
  format; once failures exist, ``replay_ratio`` of each epoch's samples are replayed failures.
  It reads the bank from the run directory's files, so every DataLoader worker (persistent or not)
  and every DDP rank replays failures from the epoch after they were mined, with no
  ``reload_dataloaders_every_n_epochs``. One sample is read and rebuilt before training starts, so
  a sample format the hooks cannot read fails then, with one line naming the fix.

After each validation (and at the epoch's end) rank 0 appends the epoch's new failures to
``failures/failures.jsonl``, updates the failure-driven weights from the train-probe EFR
(``failures/sampling.json``) and writes ``failures/mining.csv``; all ranks then meet at a barrier.
Logged per epoch: ``mining/bank_size``, ``mining/trainable``, ``mining/new``, ``mining/replayed``
(expected replayed samples this epoch) and ``mining/weight/<perturbation>``; in steer mode also
``mining/conditions``, ``mining/failures``, ``mining/repaired``, ``mining/new_failures``,
``mining/steered``, ``mining/perturbed`` and ``mining/steered_share`` (:mod:`robusttrain.rundir.mining`).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning.pytorch as L
from typing_extensions import override

from robusttrain.metamorphic.batch import iter_probe
from robusttrain.metamorphic.batch import iter_probe as read_probe
from robusttrain.metamorphic.check import checking_state
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.mining.bank import FailureBank
from robusttrain.mining.conditions import ConditionBank, lesion_anchor
from robusttrain.mining.replay import CleanDataset, ReplayDataset, check_round_trip
from robusttrain.mining.sampling import FailureDrivenWeights, rates_from_efr
from robusttrain.rundir import failures as failures_files
from robusttrain.rundir import mining as mining_file
from robusttrain.rundir import sampling as sampling_file
from robusttrain.training.steering import Steering
from robusttrain.validate import check_choice, check_fraction, check_int

from ._dist import barrier, broadcast_object, gather_objects, is_global_zero
from .context import RobustnessConfigError, RobustnessContext, TrainProbe
from .lifecycle import ContextMember

MAX_REPLAY_RATIO = 0.9
MODES = ("steer", "replay")
log = logging.getLogger(__name__)


def resolve_mode(mode: str | None, replay_ratio: float | None) -> str:
    """The mode a FailureMiningCallback built with these arguments runs in (the CLI asks before building):
    ``mode`` when given, else ``"replay"`` when ``replay_ratio`` is, else ``"steer"``.

    >>> resolve_mode(None, None), resolve_mode(None, 0.2), resolve_mode("steer", None)
    ('steer', 'replay', 'steer')
    """
    return "replay" if mode is None and replay_ratio is not None else mode or "steer"


class FailureMiningCallback(ContextMember):
    """Failure bank + replay + failure-driven sampling (see module doc).

    Args:
        mode: ``"steer"`` (steer MetamorphicTraining's random draws by the failure conditions) or
            ``"replay"`` (replay the failing images); default ``"replay"`` when ``replay_ratio`` is
            given, else ``"steer"``.
        steer: steer mode: share of the random follow-ups drawn from the failure conditions, in [0, 1].
        decay: steer mode: weight factor of a condition each check finds repaired, in [0, 1)
            (0: it leaves at once; it leaves the bank below weight 0.1).
        balance: steer mode: uniform share of the family choice over the failing families, in [0, 1].
        placement_jitter: steer mode: std of a placed artifact's move from the failure's place
            (relative to the lesion), as a fraction of the image side, in [0, 1].
        replay_ratio: replay mode: fraction of each epoch's training samples replaced by replayed
            failures once there are some, in [0, 0.9] (0: record failures, replay nothing; default 0.2).
        train_probe_size: training cases the MR callback checks (a seeded, fixed subset), >= 1.
        every_n_epochs: check the training probe after every N-th epoch.
        jitter, clean_mix, fresh_image: how a slot re-creates a failure
            (:class:`~robusttrain.mining.ReplayDataset`); each in [0, 1], clean_mix + fresh_image <= 1.
        allow_val_mining: also replay validation failures (leaks validation data; warned).
        max_size, n_thumbs: bound of the bank and number of thumbnail strips kept.
        momentum, floor: the failure-driven weights (:class:`~robusttrain.mining.FailureDrivenWeights`).
        min_clean_dice: violations whose *clean* Dice is below this are not mined (a model that
            segments nothing there yet: a drop from 0.049 to 0.029 is noise, not a failure to learn).
        train_dataset: the dataset the train probe checks (default: the wrapped dataset, else
            ``datamodule.train_dataset``).
        dirpath: run directory (default: the shared context's).
        context: the shared :class:`~robusttrain.callbacks.context.RobustnessContext`.
        enabled: False turns everything off.

    Raises:
        ValueError: a bad argument, when built (e.g. ``replay_ratio=1.0``).
        RobustnessConfigError: at ``trainer.fit`` before training: no MetamorphicCallback, or
            ``replay_ratio > 0`` but the training data was never passed through :meth:`wrap`.

    Example::

        >>> import lightning.pytorch as L
        >>> from robusttrain.callbacks import FailureMiningCallback, MetamorphicCallback
        >>> mining = FailureMiningCallback(replay_ratio=0.2, train_probe_size=16)
        >>> trainer = L.Trainer(max_epochs=2, callbacks=[MetamorphicCallback(), mining], logger=False)
        >>> # in your datamodule: DataLoader(mining.wrap(self.train_set), batch_size=8, shuffle=True)
    """

    def __init__(
        self,
        replay_ratio: float | None = None,
        train_probe_size: int = 32,
        every_n_epochs: int = 1,
        jitter: float = 0.1,
        clean_mix: float = 0.0,
        fresh_image: float = 0.0,
        allow_val_mining: bool = False,
        max_size: int = 2000,
        n_thumbs: int = 32,
        momentum: float = 0.5,
        floor: float = 0.05,
        min_clean_dice: float = 0.1,
        train_dataset: Any = None,
        dirpath: str | os.PathLike | None = None,
        context: RobustnessContext | None = None,
        enabled: bool = True,
        mode: str | None = None,
        steer: float = 0.5,
        decay: float = 0.5,
        balance: float = 0.5,
        placement_jitter: float = 0.05,
    ):
        if replay_ratio is not None:
            check_fraction("replay_ratio", replay_ratio, 0.0, MAX_REPLAY_RATIO)
        self.mode = check_choice("mode", resolve_mode(mode, replay_ratio), MODES)
        if self.mode == "steer" and replay_ratio not in (None, 0):
            raise ValueError(
                f"replay_ratio={replay_ratio!r} replays failing images (mode='replay'); mode='steer' replays "
                "none (it steers the random augmentation's draws): drop replay_ratio or set mode='replay'"
            )
        default_ratio = 0.2 if self.mode == "replay" else 0.0
        ratio = default_ratio if replay_ratio is None else replay_ratio
        self.replay_ratio = check_fraction("replay_ratio", ratio, 0.0, MAX_REPLAY_RATIO)
        self.steer = check_fraction("steer", steer)
        self.placement_jitter = check_fraction("placement_jitter", placement_jitter)
        self.train_probe_size = check_int("train_probe_size", train_probe_size, 1)
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, 1)
        self.jitter = check_fraction("jitter", jitter)
        self.clean_mix = check_fraction("clean_mix", clean_mix)
        self.fresh_image = check_fraction("fresh_image", fresh_image)
        if self.clean_mix + self.fresh_image > 1.0:
            raise ValueError(f"clean_mix={clean_mix} + fresh_image={fresh_image}: expected a sum <= 1")
        self.max_size = check_int("max_size", max_size, 2)
        self.conditions = ConditionBank(decay, balance, self.max_size)
        self.n_thumbs = check_int("n_thumbs", n_thumbs, 0)
        self.weights = FailureDrivenWeights(momentum, floor)
        self.min_clean_dice = check_fraction("min_clean_dice", min_clean_dice)
        self.below_floor = 0  # violations not mined for a clean Dice under the floor (this fit)
        self.allow_val_mining, self.enabled = bool(allow_val_mining), bool(enabled)
        self.train_dataset, self.dirpath, self._context_arg = train_dataset, dirpath, context
        self.bank: FailureBank | None = None
        self.replay: ReplayDataset | None = None  # the dataset last returned by wrap()
        self.rows: list[dict[str, Any]] = []
        self._ctx = context
        self._probe: TrainProbe | None = None
        self._val: Any = None
        self._counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._epoch_stats: dict[str, Any] = {}
        self._new_this_epoch = 0
        self._weights_epoch = -1
        self._restored: dict[str, Any] | None = None
        self._stream: Any = None  # steer mode: the dataset wrap() was given (the probe's default)
        self._cond_epoch = -1  # the latest train-probe check folded into the condition bank
        self._cond_pending: dict[int, list[tuple[FailureRecord, Any]]] = defaultdict(list)
        self.steering: Steering | None = None
        self._steer_counts: dict[int, list[int]] = {}  # restored from a checkpoint, applied in on_fit_start

    # ---- the replay mechanism ---------------------------------------------------------------
    def wrap(self, dataset: Any) -> Any:
        """``dataset`` with mined failures replayed in it (same length, same sample format).

        Call it where the training loader is built (e.g. in ``train_dataloader``); with
        ``replay_ratio=0`` or ``enabled=False`` it returns ``dataset`` itself.
        """
        if self.enabled and self.mode == "steer":  # the stream stays the loader's; the probe checks it
            self._stream = dataset
            if self._probe is not None and self._probe.dataset is None:
                self._probe.dataset = CleanDataset(dataset)
            return dataset
        if not self.enabled or self.replay_ratio == 0:
            return dataset
        if isinstance(dataset, ReplayDataset):
            dataset = dataset.base
        self.replay = ReplayDataset(
            dataset,
            None,
            self.replay_ratio,
            self.jitter,
            self.allow_val_mining,
            clean_mix=self.clean_mix,
            fresh_image=self.fresh_image,
        )
        if self._ctx is not None and self._ctx.run_dir is not None:  # wrapped during fit: bind now
            self._bind(self.replay)
        return self.replay

    def _bind(self, replay: ReplayDataset) -> None:
        ctx = self.context
        replay.perturbation_kwargs = dict(getattr(ctx.suite, "perturbation_kwargs", {}) or {})
        replay.bind(ctx.resolved_run_dir, ctx.hooks, getattr(ctx.suite, "slice_axis", -1))
        if self.allow_val_mining and self._val is not None:
            from robusttrain.mining.replay import CleanView

            replay.views["val"] = CleanView(self._val, ctx.hooks)
            replay.views["val"].codec.slice_axis = getattr(ctx.suite, "slice_axis", -1)
        if self._probe is not None and self._probe.dataset is None:
            self._probe.dataset = CleanDataset(replay.base)

    # ---- wiring -----------------------------------------------------------------------------
    REQUIRES = ("mr",)

    @property
    @override
    def joins(self) -> bool:
        return bool(self.enabled)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not self.enabled or stage != "fit":
            return
        ctx = self.context
        ctx.subscribe(self._sink)  # called on rank 0 with the gathered failures
        dm = getattr(trainer, "datamodule", None)
        self._val = getattr(dm, "val_dataset", None)
        base = self.train_dataset if self.train_dataset is not None else getattr(dm, "train_dataset", None)
        base = base if base is not None else self._stream
        if self.mode == "steer":
            self.steering = ctx.steering = Steering(self.conditions, self.steer, self.placement_jitter)
        self._probe = ctx.train_probe = TrainProbe(
            None if base is None else CleanDataset(base), self.train_probe_size, self.every_n_epochs
        )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if not self.enabled:
            return
        run_dir = self.fit_dir
        if self._restored is None:  # a fresh fit: its own, empty bank (never another run's, nor a
            self.bank = None  # previous fit's of this callback)
            self.rows, self._counts, self._weights_epoch = [], defaultdict(lambda: defaultdict(int)), -1
            self.conditions.load_state_dict({})
            self._cond_epoch, self._cond_pending = -1, defaultdict(list)
            if self.steering is not None:
                self.steering.counts = {}
            if is_global_zero(trainer):
                set_aside_foreign_bank(run_dir)
        if self.bank is None:
            self.bank = FailureBank(run_dir, self.max_size, self.n_thumbs, self.allow_val_mining)
        if self._restored is not None:
            self.bank.load_state_dict(self._restored["bank"], rewrite_files=False)
            if self.steering is not None:
                self.steering.counts = {e: list(c) for e, c in self._steer_counts.items()}
            if is_global_zero(trainer):
                self.bank.restore_files()  # files may be ahead of the checkpoint we resume from
                self._write_weights()
                if self.mode == "steer":
                    mining_file.write_conditions(run_dir, self.conditions.state_dict())
            self._restored = None
        if self.replay is not None:  # wrapped before fit (datamodule.setup / __init__)
            self._bind(self.replay)
        barrier(trainer, "failure_mining_resume")

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the train loader exists now: the wrap must have happened, and its samples must round-trip
        if not self.enabled:
            return
        if self.mode == "steer" and "MetamorphicTraining" not in self.context.members:
            raise RobustnessConfigError(
                "FailureMiningCallback(mode='steer') steers MetamorphicTraining's random draws, but there is "
                "no MetamorphicTraining callback; add MetamorphicTraining(objective='replace', k=1, q=0.5, "
                "epsilon=1.0) (random augmentation) or use mode='replay'"
            )
        if self.replay_ratio > 0 and self.replay is None:
            raise RobustnessConfigError(
                f"FailureMiningCallback(replay_ratio={self.replay_ratio}): the training data was not passed "
                "through mining.wrap(dataset), so nothing would be replayed; build the train loader over "
                "mining.wrap(train_dataset) (robusttrain datamodules: datamodule.wrap_train(mining.wrap)) "
                "or set replay_ratio=0"
            )
        probe = self._probe
        assert probe is not None  # setup("fit") made it, and on_train_start runs after setup
        if probe.dataset is None:
            raise RobustnessConfigError(
                "FailureMiningCallback: no training dataset to check; pass train_dataset= (a map-style "
                "dataset) or build the train loader over mining.wrap(train_dataset)"
            )
        # The MR callback reads the train probe through its hooks only after the first epoch: read one
        # sample now, so samples the hooks cannot read (no mask) fail before training, also with
        # replay_ratio=0. No random stream moves (a resume must repeat the uninterrupted run).
        with checking_state(pl_module, 0), probe.dataset.streams_kept():
            if len(probe.dataset):
                next(iter_probe(probe.dataset, [0], 1, self.context.hooks))
            if self.replay is not None and self.replay.view.pre is None:
                # collated as the client's loader will collate replayed samples (MONAI: list_data_collate)
                check_round_trip(self.replay.view, getattr(trainer.train_dataloader, "collate_fn", None))

    def _sink(self, record: Any, images: Any = None) -> None:
        if record.src_dice < self.min_clean_dice:
            if not self.below_floor:
                log.warning(
                    "robusttrain: not mining violations whose clean Dice is below min_clean_dice=%g "
                    "(e.g. %s: %.3g -> %.3g): the model does not segment these cases yet",
                    self.min_clean_dice,
                    record.case_id,
                    record.src_dice,
                    record.fol_dice,
                )
            self.below_floor += 1
            return
        # subscribed in setup("fit"); violations come from checks, which run after on_fit_start made the bank
        assert self.bank is not None
        self.bank.add(record, images)
        self._counts[record.epoch][record.perturbation] += 1
        if self.mode == "steer" and self.bank.is_trainable(record) and record.split == "train":
            self._cond_pending[int(record.epoch)].append((record, self._anchor(record)))

    def _anchor(self, record: FailureRecord) -> dict[str, list[float]] | None:
        """The failing image's lesion (centre, extent), for a placed family's failure (rank 0, in the sink)."""
        probe = self._probe
        if "center_rel" not in record.params or probe is None or probe.dataset is None or record.index < 0:
            return None
        with probe.dataset.streams_kept():  # reading must not move the training pipeline's random streams
            pb = next(read_probe(probe.dataset, [record.index], 1, self.context.hooks))
        mask = pb.masks[0]
        return lesion_anchor(mask.cpu().numpy()) if mask.ndim == 2 else None  # volumes: placed absolutely

    # ---- per-epoch sync ---------------------------------------------------------------------
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bank is None:
            return
        self._sync(trainer)
        if self.replay is not None:
            self.replay.refresh()
            n = self.replay.n_trainable
            self._epoch_stats = {
                "trainable": n,
                "replayed": self.replay.n_slots if n else 0,
                "weights": self.replay.weights() if n else {},
            }

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bank is not None and not trainer.sanity_checking:
            self._sync(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bank is None:
            return
        self._sync(trainer)
        epoch = int(trainer.current_epoch)
        st = self._epoch_stats
        row = {
            "epoch": epoch,
            "bank_size": len(self.bank),
            "trainable": len(self.bank.trainable()),
            "new": self._new_this_epoch,
            "replayed": st.get("replayed", 0),
            **(self._steer_row(trainer, epoch) if self.mode == "steer" else {}),
            **{f"weight/{p}": w for p, w in sorted(st.get("weights", {}).items())},
        }
        self._new_this_epoch = 0
        self.rows = [r for r in self.rows if r["epoch"] != epoch] + [row]
        pl_module.log_dict(
            {f"mining/{k}": float(v) for k, v in row.items() if k != "epoch"},
            on_step=False,
            on_epoch=True,
            sync_dist=False,
            rank_zero_only=True,
        )
        if is_global_zero(trainer):
            mining_file.write(self.context.resolved_run_dir, self.rows)

    def _sync(self, trainer: Any) -> None:
        # all ranks call this at the same hooks; only rank 0 has records (sinks run there)
        epoch = int(trainer.current_epoch)
        bank = self.bank
        assert bank is not None  # every caller returns early without a bank
        if is_global_zero(trainer):
            pending = bank.pending
            if pending:
                self._new_this_epoch += bank.flush(epoch)
            self._update_weights(epoch, force_write=pending)
            if self.mode == "steer":
                self._update_conditions()
        if self.mode == "steer":  # every rank steers by rank 0's bank
            state = broadcast_object(
                trainer, self.conditions.state_dict() if is_global_zero(trainer) else None
            )
            if not is_global_zero(trainer) and state is not None:
                self.conditions.load_state_dict(state)
        barrier(trainer, "failure_mining_sync")

    def _update_conditions(self) -> None:
        """Fold every train-probe check not folded yet into the condition bank (rank 0) and write it."""
        cases = self.context.cases
        if cases is None or not len(cases):
            return
        train = cases[cases["split"] == "train"]
        heldout = set(self.context.heldout_families or ())
        epochs = sorted(int(e) for e in set(train["epoch"]) if int(e) > self._cond_epoch)
        for e in epochs:
            at = train[(train["epoch"] == e) & (train["src_dice"] >= self.min_clean_dice)]
            at = at[~at["perturbation"].isin(heldout)]
            tested = list(
                zip(at["case_id"].astype(str), at["perturbation"].astype(str), at["severity"].astype(int))
            )
            row = self.conditions.update(e, self._cond_pending.pop(e, []), tested)
            if row["new_failures"]:
                log.info(
                    "robusttrain mining, epoch %d: %d new failures on cases that passed their previous check "
                    "(overfitting), e.g. %s",
                    e,
                    row["new_failures"],
                    ", ".join(row["new_failure_keys"][:3]),
                )
            self._cond_epoch = e
        if epochs:
            mining_file.write_conditions(self.context.resolved_run_dir, self.conditions.state_dict())

    def _steer_row(self, trainer: Any, epoch: int) -> dict[str, Any]:
        """This epoch's condition-bank counts and steered share (all ranks call it: counts are gathered)."""
        st = self.steering
        counts = gather_objects(trainer, list(st.counts.get(epoch, [0, 0])) if st is not None else [0, 0])
        steered, drawn = sum(c[0] for c in counts), sum(c[1] for c in counts)
        check = next((c for c in self.conditions.checks if c["epoch"] == epoch), {})
        return {
            "conditions": len(self.conditions),
            "failures": check.get("failures", 0),
            "repaired": check.get("repaired", 0),
            "new_failures": check.get("new_failures", 0),
            "steered": steered,
            "perturbed": drawn,
            "steered_share": round(steered / drawn, 6) if drawn else 0.0,
        }

    def _update_weights(self, epoch: int, force_write: bool) -> None:
        ctx = self.context
        rates: dict[str, float] = {}
        if ctx.efr is not None:
            # the MR callback sets violation_threshold in its setup, before any check fills efr
            assert ctx.violation_threshold is not None
            rates = rates_from_efr(ctx.efr, "train", "dice", ctx.violation_threshold, epoch)
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
        sampling_file.write(
            self.context.resolved_run_dir, self._weights_epoch, self.weights.weights(), self.weights.smoothed
        )

    # ---- checkpoint state -------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 2,
            "bank": self.bank.state_dict() if self.bank is not None else None,
            "weights": self.weights.state_dict(),
            "weights_epoch": self._weights_epoch,
            "rows": list(self.rows),
            "conditions": self.conditions.state_dict(),
            "cond_epoch": self._cond_epoch,
            "cond_pending": {
                str(e): [(r.to_dict(), a) for r, a in items]
                for e, items in self._cond_pending.items()
                if items
            },
            "steer_counts": {
                str(e): list(c) for e, c in (self.steering.counts if self.steering else {}).items()
            },
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights.load_state_dict(state.get("weights", {}))
        self._weights_epoch = int(state.get("weights_epoch", -1))
        self.rows = list(state.get("rows", []))
        self.conditions.load_state_dict(state.get("conditions", {}))
        self._cond_epoch = int(state.get("cond_epoch", -1))
        self._cond_pending = defaultdict(list)
        for e, items in dict(state.get("cond_pending", {})).items():
            self._cond_pending[int(e)] = [(FailureRecord.from_dict(r), a) for r, a in items]
        self._steer_counts = {int(e): list(c) for e, c in dict(state.get("steer_counts", {})).items()}
        if state.get("bank") is not None:  # applied in on_fit_start, once the run dir is known
            self._restored = state


def set_aside_foreign_bank(run_dir: Any) -> Path | None:
    """A fresh fit finding ``failures/`` in its run directory (an earlier run's bank: same
    ``default_root_dir``, a re-used ``dirpath``) moves it to ``failures.before-<time>/`` and says so:
    replay reads that folder, and a run must never replay failures it did not mine."""
    d = Path(run_dir) / failures_files.DIR
    if not d.is_dir() or not any(d.iterdir()):
        return None
    dest = d.with_name(f"{failures_files.DIR}.before-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}")
    os.replace(d, dest)
    log.warning(
        "robusttrain: %s held an earlier run's failure bank; moved to %s (this run starts with an "
        "empty bank and never replays failures it did not mine)",
        d,
        dest.name,
    )
    return dest
